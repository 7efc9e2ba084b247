"""`python run.py report MODULE [--json | --html FILE] [--worker K]`: what a module's journal
holds, read inside the module's image from its state volume (launcher/fleet/report.py); a
fleet's workers added up, with a line per worker."""

from __future__ import annotations

import sys
from typing import Any

import click

from launcher.engine.containers import state_volume_name
from launcher.options import image_options, state_volume_option
from validator.spec import REPO_ROOT


@click.command(
    "report", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.argument("module")
@click.option(
    "--worker",
    type=click.IntRange(min=0),
    help="Only worker K's journal [default: every worker's, with totals].",
)
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
@click.option(
    "--html", metavar="FILE", help="Write one page with plots to FILE (one worker's journal)."
)
@state_volume_option("Journal volume (worker 0's) [default: flock-validator-MODULE-state].")
@image_options
def report(
    module: str,
    worker: int | None,
    as_json: bool,
    html: str | None,
    state_volume: str | None,
    **image: Any,
) -> None:
    """What MODULE's journal holds: made in the module's image (built when needed, as a run
    does) from the journal's volume, which it never copies."""
    if as_json and html:
        raise click.UsageError("--json or --html, not both")
    args = ["--json"] if as_json else ["--html", html] if html else []
    # Docker, the images and the releases' code: only once the options are read.
    from launcher.commands.image_choice import ImageChoice  # noqa: PLC0415
    from launcher.commands.launch import launched, module_spec  # noqa: PLC0415
    from launcher.engine.docker_errors import docker_client  # noqa: PLC0415
    from launcher.fleet.report import run_reports, worker_volumes  # noqa: PLC0415

    def make() -> int:
        spec = module_spec(REPO_ROOT, module)  # no key, task ids or GPU needed for it
        client = docker_client()
        tag = ImageChoice(**image).tag(client, spec)
        base = state_volume or state_volume_name(module)
        return run_reports(client, tag, worker_volumes(client, base, worker), args)

    sys.exit(int(launched(make)))
