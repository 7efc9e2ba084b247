"""The doctor's row for the images the module's validators run now: each container Compose
started from this checkout, and each run.py started, against this checkout's sources.

Every image holds the source hash of what it was built from (/app/source-hash, computed by the
build; run.py's and the release's also in a label) and the build arguments it was built with
(labels; the pip options are the operator's, --pip-options / VALIDATOR_PIP_OPTIONS): the
checkout's hash for those arguments says whether a container runs this checkout's code. A
container on an older build (an upgrade whose `docker compose up -d` was not run yet, or a
`docker compose start` of the old container) is a failed row with the command that replaces it.
"""

from __future__ import annotations

import io
import tarfile

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.models.containers import Container

from launcher.engine.containers import LABEL_LAUNCHER, LABEL_MODULE
from launcher.engine.docker_errors import listed
from launcher.engine.images import SOURCE_FILE, SOURCE_LABEL, BuildSpec, source_hash
from validator.doctor.rows import Row
from validator.spec import REPO_ROOT, ModuleSpec

NAME = "deployed images"
COMPOSE_SERVICE = "com.docker.compose.service"
COMPOSE_DIR = "com.docker.compose.project.working_dir"
# The build arguments an image was built with (docker/Dockerfile), by BuildSpec field; its pip
# options are not in it (they may hold an index's credentials): the operator's are taken.
BUILD_LABELS = {
    "base_image": "org.flock-validator.build.base-image",
    "env_installer": "org.flock-validator.build.env-installer",
    "environment": "org.flock-validator.build.env-file",
    "lock": "org.flock-validator.build.lock",
}


def deployed_images_row(client: docker.DockerClient, spec: ModuleSpec, pip_options: str) -> Row:
    found = _containers(client, spec.name)
    if not found:
        return Row.ok(
            NAME,
            f"no container of {spec.name} from this checkout (`docker compose up -d "
            f"validator-{spec.name}` builds this checkout's image first: pull_policy build)",
        )
    current: list[str] = []
    stale: list[str] = []
    for who, container in found:
        verdict = _verdict(client, container, pip_options)
        (current if verdict is None else stale).append(f"{who}: {verdict or 'this checkout'}")
    if not stale:
        return Row.ok(NAME, "; ".join(current))
    return Row.failed(
        NAME,
        "; ".join(stale + current),
        f"`docker compose up -d validator-{spec.name}` (Compose) or a restart of `python run.py "
        f"{spec.name}` builds this checkout's image and starts it",
    )


def _containers(client: docker.DockerClient, module: str) -> list[tuple[str, Container]]:
    """(who runs it, the container): Compose's of this checkout, run.py's running ones."""
    found = []
    for container in listed(client, {"label": f"{LABEL_MODULE}={module}"}):
        labels = container.labels
        if labels.get(COMPOSE_DIR) == str(REPO_ROOT):
            state = "" if container.status == "running" else f", {container.status}"
            found.append((f"Compose {labels.get(COMPOSE_SERVICE)}{state}", container))
        elif labels.get(LABEL_LAUNCHER) == "run.py" and container.status == "running":
            found.append((f"run.py {container.name}", container))
    return found


def _verdict(client: docker.DockerClient, container: Container, pip_options: str) -> str | None:
    """None when the container's image is this checkout's build, else what it is."""
    try:
        image = client.images.get(container.attrs["Image"])
    except (NotFound, APIError):
        return "its image is gone"
    labels = image.labels or {}
    built = labels.get(SOURCE_LABEL) or _source_file(container)
    if not built:
        return "an image with no source hash (built before images carried one)"
    given: dict[str, str] = {
        field: value
        for field, label in BUILD_LABELS.items()
        if isinstance(value := labels.get(label), str)
    }
    if len(given) < len(BUILD_LABELS):
        return f"source {built[:12]}, an image of unknown build arguments"
    module = labels.get(LABEL_MODULE, "")
    expected = source_hash(BuildSpec(module, REPO_ROOT, pip_options=pip_options, **given))
    if built == expected:
        return None
    return f"source {built[:12]}, not this checkout's {expected[:12]} (an older or other build)"


def _source_file(container: Container) -> str:
    """The hash the build computed, read from the container's filesystem (not started)."""
    try:
        stream, _ = container.get_archive(SOURCE_FILE)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            member = archive.next()
            handle = archive.extractfile(member) if member is not None else None
            return handle.read().decode().strip() if handle is not None else ""
    except (NotFound, APIError, DockerException, tarfile.TarError):
        return ""
