"""`python -m validator`: one click group (validator/program.py), a file per command; the module
name alone runs the validator (`python -m validator lora ...` is `python -m validator run lora
...`), as a module's image does with no command at all."""

from __future__ import annotations

import importlib.util
import os
import sys

import click

from validator._moved import alias
from validator.program import Listed, Program

PROGRAM = "python -m validator"
COMMANDS = {
    "run": Listed(
        "validator.entrypoint:main",
        "[run] MODULE [OPTIONS]",
        "validate MODULE's tasks (or score one input with --check)",
    ),
    "doctor": Listed(
        "validator.doctor.command:main",
        "doctor MODULE",
        "what this container can reach and use (docs/operating.md)",
    ),
    "report": Listed(
        "validator.report.cli:main",
        "report [--state-dir DIR] [--json | --html FILE]",
        "what the state dir says happened",
    ),
}


def known_modules() -> list[str]:
    """The modules this validator can run (a typo of a command's name is told from them)."""
    from validator.registry import module_roots  # noqa: PLC0415 - only for a typo
    from validator.spec import find_module_folders  # noqa: PLC0415

    return list(find_module_folders(*module_roots()))


@click.command(
    "new-module",
    hidden=True,
    context_settings={"ignore_unknown_options": True, "help_option_names": []},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def new_module(args: tuple[str, ...]) -> None:
    """The scaffolder, in a checkout; an image (the product without its dev tools) names it."""
    if importlib.util.find_spec("devkit") is None:
        sys.exit(
            "error: new-module is a dev tool, not in this image: run "
            "`python -m devkit.scaffold NAME` in a checkout of the repository"
        )
    print(f"warning: {alias('python -m validator new-module').line}", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "devkit.scaffold", *args])


def program() -> Program:
    commands = Program(
        PROGRAM,
        COMMANDS,
        default="run",
        modules=known_modules,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    )
    commands.add_command(new_module)
    return commands


def main() -> None:
    # First: the environment holds the secrets (FLOCK_API_KEY, HF_TOKEN, judge keys). Non-
    # dumpable, a bounded child of the same user can no longer read /proc/<our pid>/environ or
    # our memory (validator/sandbox/child_reaper.py); no core dump of ours is written either.
    from validator.sandbox.child_reaper import make_undumpable  # noqa: PLC0415

    make_undumpable()
    program().main(prog_name=PROGRAM)


if __name__ == "__main__":
    main()
