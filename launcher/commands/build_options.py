"""The options that choose how a module's image is built, on run.py and on its doctor.

The doctor names the image it checks by the same content hash run.py builds
(launcher/engine/images.py), so both commands must read these four the same way: one declaration
each, with the command's own help."""

from __future__ import annotations

from collections.abc import Callable

import click

from launcher.engine.images import DEFAULT_INSTALLER, DEFAULT_LOCK, LOCKS, PRODUCTION_BASE
from validator.options import F


def base_image_option(help: str) -> Callable[[F], F]:
    """`--base-image` / VALIDATOR_BASE_IMAGE, the production base unless given."""
    return click.option(
        "--base-image",
        envvar="VALIDATOR_BASE_IMAGE",
        default=PRODUCTION_BASE,
        show_default=True,
        help=help,
    )


def env_installer_option(help: str) -> Callable[[F], F]:
    """`--env-installer` / VALIDATOR_ENV_INSTALLER: micromamba, or pip for bases without conda."""
    return click.option(
        "--env-installer",
        envvar="VALIDATOR_ENV_INSTALLER",
        default=DEFAULT_INSTALLER,
        type=click.Choice([DEFAULT_INSTALLER, "pip"]),
        show_default=True,
        help=help,
    )


def pip_options_option(help: str) -> Callable[[F], F]:
    """`--pip-options` / VALIDATOR_PIP_OPTIONS: extra pip options, none unless given."""
    return click.option("--pip-options", envvar="VALIDATOR_PIP_OPTIONS", default="", help=help)


def lock_option(help: str) -> Callable[[F], F]:
    """`--lock` / VALIDATOR_LOCK: which of the module's hash locks the image installs."""
    return click.option(
        "--lock",
        envvar="VALIDATOR_LOCK",
        default=DEFAULT_LOCK,
        type=click.Choice(list(LOCKS)),
        show_default=True,
        help=help,
    )
