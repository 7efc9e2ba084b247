"""`python run.py compose` and `python run.py kubernetes`: the deployment files written from the
module specs (launcher/deploy/), or checked with --check (exit 1 naming each stale file).
`make compose` runs both."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from launcher.deploy.compose import write_compose
from launcher.deploy.compose_gpus import GPUS_FILE, HOSTS_FILE
from launcher.deploy.kubernetes import write_kubernetes
from validator.spec import REPO_ROOT

REPO_OPTION = click.option(
    "--repo",
    type=click.Path(file_okay=False, path_type=Path),
    default=REPO_ROOT,
    help="The checkout whose specs are read and whose files are written [default: this one].",
)
CHECK_OPTION = click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if a file is not what the specs say."
)
SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.command("compose", context_settings=SETTINGS)
@REPO_OPTION
@CHECK_OPTION
@click.option(
    "--hosts",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Host file: module -> its GPUs, one worker each [default: REPO/{HOSTS_FILE}].",
)
@click.option(
    "--gpus-output",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"The per-GPU Compose file to write [default: REPO/{GPUS_FILE}].",
)
def compose(repo: Path, check: bool, hosts: Path | None, gpus_output: Path | None) -> None:
    """Write compose.yaml, compose.cpu.yaml and compose.gpus.yaml from the module specs."""
    if hosts is not None and gpus_output is None:
        # Another host's file must not overwrite the committed example's output.
        raise click.UsageError("--hosts needs --gpus-output, e.g. compose.gpus.my-host.yaml")
    sys.exit(write_compose(repo, check, hosts, gpus_output))


@click.command("kubernetes", context_settings=SETTINGS)
@REPO_OPTION
@CHECK_OPTION
def kubernetes(repo: Path, check: bool) -> None:
    """Write deploy/kubernetes/ (a kustomize base and an example overlay) from the specs."""
    sys.exit(write_kubernetes(repo, check))
