"""The outer launcher: `python run.py <module> [options]` on the GPU host.

Builds the module's image when needed, runs `python -m validator` in it, restarts it when it asks
for a restart, and explains every other exit. The code is in `launcher/` (`cli.py` the command
line, `supervisor.py` the restart loop and signals, `docker_errors.py` Docker's errors as one
line); `python run.py --help` lists the options.
"""

import sys

from launcher.commands.run import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["doctor"]:  # not a module: module names are identifiers, checked here
        from launcher.doctor.host import main as doctor

        doctor(sys.argv[2:], prog_name="run.py doctor")
    main()
