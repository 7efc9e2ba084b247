"""`python run.py [run] MODULE [OPTIONS]`: the validator of MODULE in its container.

Builds the module's image when it is missing or its inputs changed (or uses `--image`, or pulls
the release with `--pull`), runs `python -m validator` in it with the GPUs, configs, volumes and
tokens it needs, and hands it to the supervisor (launcher/commands/launch.py). The validator's
own options are options of this command too (launcher/commands/forwarded.py): every option,
every task id and every config file is checked here, before any image is built or any container
started.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from launcher.commands.forwarded import FORWARDED_SECTION, forwarded_args, forwarded_options
from launcher.options import image_options, state_volume_option
from validator.options import (
    config_dir_option,
    finite,
    flock_api_key_option,
    hf_token_option,
    task_ids_option,
)
from validator.spec import find_module_folders

# The report's options, which a run does not take: named for what they are when given to it.
REPORT_ONLY = ("--json", "--html", "--worker")


class RunCommand(click.Command):
    """The run's help: its own options, then the validator's in a section of their own, then
    the modules of this checkout and the program's commands."""

    forwarded: frozenset[str] = frozenset()

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if exc.option_name in REPORT_ONLY:
                raise click.UsageError(
                    f"{exc.option_name} is the report's: python run.py report MODULE "
                    f"{exc.option_name} ...",
                    ctx,
                ) from None
            raise

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own: list[tuple[str, str]] = []
        passed: list[tuple[str, str]] = []
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
        program = ctx.find_root().command
        if hasattr(program, "commands_table"):
            with formatter.section("Commands (MODULE alone runs it: python run.py MODULE ...)"):
                formatter.write_dl(program.commands_table("python run.py"))
        super().format_epilog(ctx, formatter)


@click.command(
    "run",
    cls=RunCommand,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.argument("module")
@click.option(
    "--gpus",
    help="all or none (one container), or GPU ids such as 0,1,2,3: one worker container per "
    "GPU [default: all for a module whose spec says gpu: true, else none].",
)
@click.option(
    "--gpus-per-worker",
    type=click.IntRange(min=1),
    help="With --gpus ids: this many GPUs per worker, for bases that need more than one.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    help="Workers without a GPU (a CPU module such as rl): one container each.",
)
@click.option(
    "--plan",
    is_flag=True,
    help="Print the workers (one JSON object a line) and exit; touches no Docker engine.",
)
@image_options
@click.option(
    "--follow-releases",
    is_flag=True,
    help="With --pull: move to each newer verified release of the same major version, "
    "between assignments (docs/upgrading.md).",
)
@click.option("--build-only", is_flag=True, help="Build (or find) the image, print its tag, exit.")
@config_dir_option("Mounted read-only as the validator's configs.")
@state_volume_option("Journal volume [default: flock-validator-MODULE-state].")
@click.option(
    "--hf-cache-volume",
    help="Volume for the HuggingFace cache of modules that declare one (base models survive "
    "restarts) [default: flock-validator-hf-cache].",
)
@click.option("--network", default="host", show_default=True, help="Docker network mode.")
@click.option(
    "--restart-delay",
    type=finite(0),
    default=10.0,
    show_default=True,
    help="First wait before a restart after exit 100; doubles up to 300 s.",
)
@click.option(
    "--stop-timeout",
    type=click.IntRange(min=1),
    default=None,
    help="Seconds a stop (Ctrl-C, SIGTERM) waits for the assignment in progress before the "
    "validator is killed [default: the module's stop_grace_seconds].",
)
@task_ids_option("Comma-separated task ids (positive whole numbers), e.g. 12,34.")
@flock_api_key_option()
@hf_token_option(
    "HuggingFace token; required by modules that declare it (lora). A module's other "
    "secrets are read from the environment only."
)
@click.option(
    "--check",
    "check_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Score one input JSON locally in the container; nothing is submitted.",
)
@click.pass_context
def run(ctx: click.Context, module: str, **options: Any) -> None:
    """Run the validator for MODULE in its container (the image is built when needed). Every
    option is checked here, the validator's too, before anything is built or started."""
    passthrough = forwarded_args(ctx, FORWARDED.values())
    for name in FORWARDED:
        options.pop(name)
    task_ids = options.pop("task_ids")
    # Docker, the images and the releases' code: only once the options are read.
    from launcher.commands.image_choice import ImageChoice  # noqa: PLC0415
    from launcher.commands.launch import Launch, launch, launched  # noqa: PLC0415

    settings = Launch(
        module=module,
        image=ImageChoice.taken(options),
        passthrough=passthrough,
        task_ids=",".join(task_ids or []) or None,
        **options,
    )
    sys.exit(int(launched(lambda: launch(settings))))


FORWARDED = {option.name: option for option in forwarded_options(run.params)}
run.params.extend(FORWARDED.values())
RunCommand.forwarded = frozenset(FORWARDED)
