"""Module images: a content-hash tag per (module, build inputs), built only when missing."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import APIError, BuildError, ImageNotFound

from launcher.errors import LaunchError

DOCKERFILE = "docker/Dockerfile"
PRODUCTION_BASE = "mambaorg/micromamba:2.3.3-cuda12.6.3-ubuntu22.04"
# What goes into an image, besides the module's own folder (see .dockerignore).
SHARED_INPUTS = ("docker", "requirements.txt", "validator")
SKIPPED_PARTS = ("__pycache__",)


@dataclass(frozen=True)
class BuildSpec:
    module: str
    repo_root: Path
    base_image: str = PRODUCTION_BASE
    env_installer: str = "micromamba"
    pip_options: str = ""

    def build_args(self) -> dict[str, str]:
        return {
            "MODULE": self.module,
            "BASE_IMAGE": self.base_image,
            "ENV_INSTALLER": self.env_installer,
            "PIP_OPTIONS": self.pip_options,
        }


def _input_files(spec: BuildSpec) -> Iterator[Path]:
    roots = [spec.repo_root / name for name in SHARED_INPUTS]
    roots.append(spec.repo_root / "modules" / spec.module)
    for root in roots:
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            skipped = path.suffix == ".pyc" or any(part in SKIPPED_PARTS for part in path.parts)
            if path.is_file() and not skipped:
                yield path


def source_hash(spec: BuildSpec) -> str:
    """Changes whenever anything that goes into the image, or a build argument, changes."""
    digest = hashlib.sha256()
    for key, value in sorted(spec.build_args().items()):
        digest.update(f"arg {key}={value}\n".encode())
    for path in _input_files(spec):
        digest.update(f"file {path.relative_to(spec.repo_root).as_posix()}\n".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def ensure_image(client: docker.DockerClient, spec: BuildSpec, rebuild: bool = False) -> str:
    """The tag of an image for `spec`, building it when it is missing or `rebuild` is set."""
    digest = source_hash(spec)
    tag = f"flock-validator-{spec.module.lower()}:{digest[:12]}"
    if not rebuild:
        try:
            client.images.get(tag)
            print(f"[run.py] using image {tag} (already built)", file=sys.stderr, flush=True)
            return tag
        except ImageNotFound:
            pass
    print(
        f"[run.py] building image {tag} from {DOCKERFILE} (base {spec.base_image})",
        file=sys.stderr,
        flush=True,
    )
    _build(client, spec, tag, digest)
    return tag


def _build(client: docker.DockerClient, spec: BuildSpec, tag: str, digest: str) -> None:
    step = ""
    try:
        for chunk in client.api.build(
            path=str(spec.repo_root),
            dockerfile=DOCKERFILE,
            tag=tag,
            buildargs={**spec.build_args(), "SOURCE_HASH": digest},
            rm=True,
            forcerm=True,
            decode=True,
        ):
            if "stream" in chunk:
                if chunk["stream"].startswith("Step "):
                    step = chunk["stream"]
                sys.stderr.write(chunk["stream"])
                sys.stderr.flush()
            elif "error" in chunk:
                raise BuildError(chunk["error"], build_log=[])
    except (BuildError, APIError) as exc:
        hint = ""
        if " : FROM " in step:
            hint = f" (cannot get the base image {spec.base_image}; VALIDATOR_BASE_IMAGE sets it)"
        raise LaunchError(f"building {tag} failed: {exc}{hint}", exit_code=1) from exc


def ensure_given_image(client: docker.DockerClient, image: str) -> str:
    """`--image IMAGE`: use it if present, else try to pull it."""
    try:
        client.images.get(image)
        return image
    except ImageNotFound:
        pass
    print(f"[run.py] pulling {image}", file=sys.stderr, flush=True)
    try:
        client.images.pull(image)
    except APIError as exc:
        raise LaunchError(f"image {image} is not present and cannot be pulled: {exc}") from exc
    return image
