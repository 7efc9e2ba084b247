"""The validator's options on run.py's command line: one definition, the validator's own.

run.py's command holds its own options and, after them, the options of `python -m validator`
(validator/entrypoint.py's click command), taken from that command's params: click then checks
every option at the door, before any image is built or any container started. An unknown one
is exit 2 with click's "did you mean", a bad value is exit 2 naming the option, and what was
given goes on to the validator as it was meant. Where run.py has an option of the same name
(`--task_ids`, `--check`, `--config-dir`, the two keys), run.py's is the one; the few that make
no sense in a container are left out (NOT_FORWARDED), so that click names the option to use.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterable, Mapping

import click
from click.core import ParameterSource

from launcher.engine.containers import PASSED_ENV
from launcher.engine.supervisor import say
from validator.entrypoint import main as validator_command
from validator.errors import ExitCode
from validator.spec import find_module_folders

# The validator's options run.py does not pass on: the journal is a Docker volume there
# (--state-volume, which click's "did you mean" names for --state-dir).
NOT_FORWARDED = frozenset({"state_dir"})
FORWARDED_SECTION = "Validator options (passed on to `python -m validator` in the container)"
COMMANDS = (
    ("python run.py MODULE [OPTIONS]", "validate MODULE's tasks in its container (this page)"),
    (
        "python run.py doctor [MODULE]",
        "check this host, the configs and the services before a start (docs/operating.md)",
    ),
    (
        "python run.py MODULE report [--json | --html FILE]",
        "what MODULE's journal holds, every worker's added up (--worker K: one)",
    ),
)


def forwarded_options(own: Iterable[click.Parameter]) -> list[click.Option]:
    """The validator's options that run.py passes on, as options of run.py's command: each a
    copy of the validator's (its type, range, choices and help), less the variable, which the
    container reads itself, unless it is one run.py passes to the container
    (launcher/engine/containers.py PASSED_ENV), whose value run.py then checks too."""
    taken = {name for param in own for name in (*param.opts, *param.secondary_opts)}
    forwarded = []
    for param in validator_command.params:
        if not isinstance(param, click.Option) or param.name in NOT_FORWARDED:
            continue
        if taken & {*param.opts, *param.secondary_opts}:
            continue  # run.py's own option of that name
        option = copy.copy(param)
        if option.envvar not in PASSED_ENV:
            option.envvar = None
        forwarded.append(option)
    return forwarded


def forwarded_args(ctx: click.Context, options: Iterable[click.Option]) -> list[str]:
    """The validator's arguments for what the command line gave of its options, as click read
    them (a value from a variable reaches the container as that variable)."""
    args: list[str] = []
    for option in options:
        name = option.name or ""
        if ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[name]
        if option.is_flag and option.secondary_opts:
            args.append(option.opts[0] if value else option.secondary_opts[0])
        elif option.is_flag:
            if value:
                args.append(option.opts[0])
        else:
            args += [option.opts[0], str(value)]
    return args


def given(ctx: click.Context, options: Iterable[click.Option]) -> list[str]:
    """The options of `options` the command line gave, by their first name."""
    return [
        option.opts[0]
        for option in options
        if ctx.get_parameter_source(option.name or "") is ParameterSource.COMMANDLINE
    ]


REPORT_OPTIONS = {"report_json": "--json", "report_html": "--html", "report_worker": "--worker"}


def launch_values(
    ctx: click.Context, options: dict, forwarded_by_name: Mapping[str, click.Option]
) -> dict:
    """LaunchOptions' fields from what click read: the validator's options as its arguments
    (`passthrough`), `report` and its options as the report's; UsageError for an option of
    the other command."""
    forwarded = list(forwarded_by_name.values())
    passthrough = forwarded_args(ctx, forwarded)
    for name in forwarded_by_name:
        options.pop(name)
    report = [REPORT_OPTIONS[name] for name in REPORT_OPTIONS if options[name]]
    json_output, html_file = options.pop("report_json"), options.pop("report_html")
    if options.pop("action") == "report":
        if passthrough:
            raise click.UsageError(
                f"{', '.join(given(ctx, forwarded))}: the validator's, not the report's"
            )
        passthrough = ["report", *(["--json"] if json_output else [])]
        passthrough += ["--html", html_file] if html_file else []
    elif report:
        goes = "goes" if len(report) == 1 else "go"
        raise click.UsageError(
            f"{', '.join(report)} {goes} with report: python run.py MODULE report {report[0]} ..."
        )
    task_ids = options.pop("task_ids")
    return {**options, "passthrough": passthrough, "task_ids": ",".join(task_ids or []) or None}


class LauncherCommand(click.Command):
    """run.py's help: its own options, then the validator's in a section of their own, then
    the modules of this checkout and run.py's other commands. A usage error is one line."""

    forwarded: Mapping[str, click.Option] = {}

    def main(self, args=None, prog_name=None, **extra):  # type: ignore[override]
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.UsageError as exc:
            say(f"error: {exc.format_message()} (see python run.py --help)")
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            say(f"error: {exc.format_message()}")
            sys.exit(exc.exit_code)
        except click.Abort:
            say("interrupted")
            sys.exit(int(ExitCode.INTERRUPTED))
        sys.exit(code or 0)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own, passed = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is not None:
                (passed if param.name in self.forwarded else own).append(record)
        with formatter.section("Options"):
            formatter.write_dl(own)
        with formatter.section(FORWARDED_SECTION):
            formatter.write_dl(passed)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        modules = ", ".join(find_module_folders()) or "none found"
        with formatter.section("Modules (modules/<name>/ of this checkout)"):
            formatter.write_text(modules)
        with formatter.section("Commands"):
            formatter.write_dl(list(COMMANDS))
        super().format_epilog(ctx, formatter)
