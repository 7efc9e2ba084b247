"""The outer launcher: `python run.py <module> [options]` on the GPU host, and its other commands
(`python run.py --help` lists them). Builds the module's image when needed, runs `python -m
validator` in it, restarts it when it asks for a restart, and explains every other exit; the
code is in launcher/ (launcher/commands/program.py the command line)."""

from launcher.commands.program import main

if __name__ == "__main__":
    main()
