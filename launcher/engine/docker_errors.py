"""Docker SDK errors as the one line an operator gets (a LaunchError), never a traceback,
and the engine calls that would raise one for an ordinary race."""

from __future__ import annotations

import docker
from docker.errors import APIError, DockerException
from docker.models.containers import Container

from launcher.errors import LaunchError


def refused_to_run(exc: APIError) -> LaunchError:
    """The engine refused to create or start the validator's container."""
    text = str(exc.explanation or exc)
    if "could not select device driver" in text:
        return LaunchError(
            "GPUs were requested but this Docker engine cannot provide them (no NVIDIA "
            "Container Toolkit?). Install it, or run without GPUs: --gpus none"
        )
    if "nvidia-container-cli" in text:
        return LaunchError(
            f"the NVIDIA container runtime could not give the container its GPUs ({text}); "
            "check the driver with nvidia-smi and the --gpus ids, or run with --gpus none"
        )
    return LaunchError(f"Docker refused to run the validator: {text}")


def unreachable(exc: DockerException) -> LaunchError:
    """No engine at DOCKER_HOST (or the default socket), or no permission to use it."""
    return LaunchError(
        f"cannot reach the Docker engine ({exc}). Is Docker installed and running, and may "
        "this user use it (docker group)?"
    )


def lost_engine(exc: DockerException) -> str:
    """The message for an engine that went away after the launcher reached it."""
    return f"lost the Docker engine: {exc}"


def docker_client() -> docker.DockerClient:
    """A client of an engine that answered a ping."""
    try:
        client = docker.from_env()
        client.ping()
        return client
    except DockerException as exc:
        raise unreachable(exc) from exc


def listed(
    client: docker.DockerClient, filters: dict[str, str | list[str] | bool]
) -> list[Container]:
    """The containers, running or not, that match `filters`, each inspected. One removed
    between the engine's list and its inspection (an auto-removed one that just ended) is
    passed over: the SDK would raise NotFound for it, as if the engine were gone."""
    return client.containers.list(all=True, filters=filters, ignore_removed=True)
