"""`python run.py`: one click group (validator/program.py), a file per command in this folder,
each imported only when named; the module name alone runs the validator (`python run.py lora
...` is `python run.py run lora ...`). A mistake is one line on stderr and exit 2."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from launcher.errors import say
from validator._moved import alias
from validator.errors import ExitCode
from validator.program import Listed, Program
from validator.spec import find_module_folders

PROGRAM = "python run.py"
COMMANDS = {
    "run": Listed(
        "launcher.commands.run:run",
        "[run] MODULE [OPTIONS]",
        "validate MODULE's tasks in its container (this page)",
    ),
    "doctor": Listed(
        "launcher.commands.doctor:doctor",
        "doctor [MODULE]",
        "check this host, the configs and the services before a start (docs/operating.md)",
    ),
    "report": Listed(
        "launcher.commands.report:report",
        "report MODULE [--json | --html FILE]",
        "what MODULE's journal holds, every worker's added up (--worker K: one)",
    ),
    "release": Listed(
        "launcher.commands.release:release",
        "release COMMAND",
        "a release's signed manifest and files; pin this checkout to it (docs/releasing.md)",
    ),
    "compose": Listed(
        "launcher.commands.deploy:compose",
        "compose [--check]",
        "write compose*.yaml from the module specs (docs/compose.md)",
    ),
    "kubernetes": Listed(
        "launcher.commands.deploy:kubernetes",
        "kubernetes [--check]",
        "write deploy/kubernetes/ from the module specs (docs/kubernetes.md)",
    ),
}


def known_modules() -> list[str]:
    return list(find_module_folders())


class RunPy(Program):
    """run.py's commands; an earlier spelling is told once and run as the one it moved to."""

    def for_default(self, args: list[str]) -> list[str]:
        words = positional(args, self.option_arities())
        if len(words) >= 2 and args[words[1]] == "report":  # `python run.py MODULE report ...`
            say(f"warning: {alias('python run.py MODULE report').line}")
            module, rest = args[words[0]], [a for i, a in enumerate(args) if i not in words[:2]]
            return ["report", module, *rest]
        return super().for_default(args)

    def option_arities(self) -> dict[str, bool]:
        """Each option of the run and the report: whether it takes a value."""
        ctx = click.Context(self)
        taking: dict[str, bool] = {}
        for name in ("run", "report"):
            command = self.get_command(ctx, name)
            for param in command.params if command else []:
                if isinstance(param, click.Option):
                    for flag in (*param.opts, *param.secondary_opts):
                        taking[flag] = not param.is_flag and not param.count
        return taking

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> NoReturn:
        """Always standalone: a mistake is one line on stderr and an exit code, never click's
        own page (`standalone_mode` is there for click's signature, and not read)."""
        try:
            code = super().main(
                args, prog_name or PROGRAM, complete_var, standalone_mode=False, **extra
            )
        except click.UsageError as exc:
            stop(f"error: {exc.format_message()} (see {help_of(exc.ctx)})", exc.exit_code)
        except click.ClickException as exc:
            stop(f"error: {exc.format_message()}", exc.exit_code)
        except click.Abort:
            stop("interrupted", ExitCode.INTERRUPTED)
        sys.exit(code or 0)


def positional(args: list[str], takes_value: dict[str, bool]) -> list[int]:
    """The indexes of the words of `args` that are no option and no option's value."""
    found: list[int] = []
    skip = False
    for index, word in enumerate(args):
        if skip:
            skip = False
        elif word == "--":
            return found + list(range(index + 1, len(args)))
        elif word.startswith("-") and word != "-":
            skip = "=" not in word and takes_value.get(word, False)
        else:
            found.append(index)
    return found


def help_of(ctx: click.Context | None) -> str:
    """Where the failing command's help is: the run's is the program's own page."""
    if ctx is None or ctx.parent is None or ctx.command.name == "run":
        return f"{PROGRAM} --help"
    return f"{ctx.command_path} --help"


def stop(line: str, code: int) -> NoReturn:
    say(line)
    sys.exit(int(code))


def program() -> RunPy:
    return RunPy(
        PROGRAM,
        COMMANDS,
        default="run",
        modules=known_modules,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    )


def main() -> None:
    program().main()
