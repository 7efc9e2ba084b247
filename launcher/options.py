"""The launcher's own options and their defaults, declared once and importable without Docker:
the commands read them for --help and at the door, the engine and the releases for their
defaults. The doctor names the image it checks by the content hash run.py builds
(launcher/engine/images.py), so both read the build's options here, each with its own help."""

from __future__ import annotations

from collections.abc import Callable

import click

from validator.options import F

# micromamba 2.x on NVIDIA's CUDA 12 base for Ubuntu 22.04 (docs/images.md "The base image").
# Named by tag until a maintainer pins its digest (`python run.py release pin-base` writes it
# here, in docker/Dockerfile and docs/images.md); meanwhile a build stands on the digest the
# engine holds it as (launcher/engine/images.py pinned_base).
PRODUCTION_BASE = "mambaorg/micromamba:2.3.3-cuda12.6.3-ubuntu22.04"
# How the module's environment.yml is installed on it (docker/install-env.sh; pip: bases
# without conda).
DEFAULT_INSTALLER = "micromamba"
# Which of the module's locks (modules/<name>/locks/<lock>.txt, `make lock`) the image installs:
# production (PyPI's packages, torch's CUDA build) or cpu (torch's CPU build: CI's stand-in).
DEFAULT_LOCK = "production"
LOCKS = (DEFAULT_LOCK, "cpu")
# Where released images live (launcher/release/published.py), and where releases publish their
# signed manifests (launcher/release/channel.py).
DEFAULT_REGISTRY = "ghcr.io/flock-io"
REGISTRY_ENV = "VALIDATOR_IMAGE_REGISTRY"
DEFAULT_CHANNEL = "https://github.com/FLock-io/flock-validator"
CHANNEL_ENV = "VALIDATOR_RELEASE_CHANNEL"


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


def state_volume_option(help: str) -> Callable[[F], F]:
    """`--state-volume`: the module's journal volume, flock-validator-MODULE-state unless given."""
    return click.option("--state-volume", help=help)


# Which image runs (the run) or reads a journal (the report): one given, the release of this
# checkout's version, or the module's own build. launcher/commands/image_choice.py reads them.
IMAGE_OPTIONS: tuple[Callable[[F], F], ...] = (
    click.option("--image", help="Use this prebuilt image instead of building one."),
    click.option("--rebuild", is_flag=True, help="Build the image even if it exists."),
    click.option(
        "--pull",
        is_flag=True,
        help="Run the released image of this checkout's version (pyproject.toml), pulled from "
        "--registry by the digest its signed release names; when it cannot be had or verified, "
        "nothing runs (exit 3): without --pull, run.py builds it here.",
    ),
    click.option(
        "--release-channel",
        envvar=CHANNEL_ENV,
        default=DEFAULT_CHANNEL,
        show_default=True,
        help="Where releases publish their signed manifests, for --pull (verified all the same).",
    ),
    click.option(
        "--registry",
        envvar=REGISTRY_ENV,
        default=DEFAULT_REGISTRY,
        show_default=True,
        help="Registry and owner of the released images, for --pull.",
    ),
    base_image_option("Base of the module image."),
    env_installer_option(
        "How the module's environment.yml is installed (pip: bases without conda)."
    ),
    pip_options_option("Extra pip options for image builds (e.g. a local wheelhouse)."),
    lock_option(
        "The module's lock the image installs (modules/MODULE/locks/): production (torch's CUDA "
        "build) or cpu (torch's CPU build, for the stand-in base of CI)."
    ),
)


def image_options(command: F) -> F:
    """Adds the options that choose the image, in --help's order."""
    for option in reversed(IMAGE_OPTIONS):  # the last decorator is applied first
        command = option(command)
    return command
