"""The Docker tests' engine: a real one with the local stand-in base and the wheelhouse, or a
failure that says how to get them (or how to opt out explicitly)."""

from __future__ import annotations

import os

import docker
import pytest
from docker.errors import DockerException, ImageNotFound

from devkit.docker_env import LOCAL_BASE, WHEELHOUSE
from tests.helpers import layers

OPT_OUT = "FLOCK_SKIP_DOCKER_TESTS"


def require_engine() -> docker.DockerClient:
    """The engine, or a failure that says how to get one (or how to opt out explicitly)."""
    if os.environ.get(OPT_OUT) == "1":
        pytest.skip(f"{OPT_OUT}=1: Docker tests opted out")
    if not layers.RUNNING["docker"]:
        pytest.fail(
            "a test reached the engine outside the docker layer: ask for the `engine` fixture "
            "(tests/helpers/layers.py)",
            pytrace=False,
        )
    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        pytest.fail(
            f"these tests need a Docker engine ({exc}); start one with "
            f"`make docker-engine` (as root on Debian), or set {OPT_OUT}=1 to opt out",
            pytrace=False,
        )
    try:
        client.images.get(LOCAL_BASE)
    except ImageNotFound:
        pytest.fail(f"missing {LOCAL_BASE}: run `make base-image`", pytrace=False)
    if not any(WHEELHOUSE.glob("*.whl")):
        pytest.fail(f"no wheels in {WHEELHOUSE}: run `make wheels`", pytrace=False)
    return client
