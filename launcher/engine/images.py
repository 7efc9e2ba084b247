"""Module images: a content-hash tag per (module, build inputs), built only when missing."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import docker
from docker.errors import APIError, BuildError, ImageNotFound
from docker.utils import parse_repository_tag

from launcher.engine.pulls import pull
from launcher.errors import LaunchError
from launcher.options import DEFAULT_INSTALLER, DEFAULT_LOCK, PRODUCTION_BASE
from validator.spec import REPO_ROOT

DOCKERFILE = "docker/Dockerfile"
SOURCE_LABEL = "org.flock-validator.source-hash"  # the whole source hash (docker/Dockerfile)
# The same hash, computed by the build from the files it was given: in every image, whoever
# built it (Compose passes no SOURCE_HASH, so its images' label is empty).
SOURCE_FILE = "/app/source-hash"
DIGEST_REFERENCE = re.compile(r"@sha256:[0-9a-f]{64}$")


def _load_hasher() -> ModuleType:
    """docker/source_hash.py: the one implementation, which the image build runs too."""
    path = REPO_ROOT / "docker" / "source_hash.py"
    loaded = importlib.util.spec_from_file_location("flock_source_hash", path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


_HASHER = _load_hasher()
SHARED_INPUTS: tuple[str, ...] = _HASHER.SHARED_INPUTS
# What the engine's pull errors mean, first match wins: (any of these texts, what to say).
PULL_FAILURES = (
    (("invalid reference format",), "not a valid image name"),
    (("no matching manifest",), "no image for this machine's platform"),
    (("manifest unknown",), "no such tag"),
    (("pull access denied", "repository does not exist"), "no such repository, or a private one"),
    (("unauthorized", "authentication required"), "the registry wants a docker login"),
    (("toomanyrequests", "rate limit"), "the registry's pull rate limit; docker login raises it"),
    (
        (
            "no such host",
            "dial tcp",
            "i/o timeout",
            "tls handshake timeout",
            "connection refused",
            "network is unreachable",
            "timed out",
        ),
        "the registry cannot be reached",
    ),
    (("not found",), "no such image"),
)


@dataclass(frozen=True)
class BuildSpec:
    module: str
    repo_root: Path
    base_image: str = PRODUCTION_BASE
    env_installer: str = DEFAULT_INSTALLER
    pip_options: str = ""
    environment: str = "environment.yml"  # the spec's environment file, in the module folder
    lock: str = DEFAULT_LOCK

    def build_args(self) -> dict[str, str]:
        return {
            "MODULE": self.module,
            "ENV_FILE": self.environment,
            "BASE_IMAGE": self.base_image,
            "ENV_INSTALLER": self.env_installer,
            "PIP_OPTIONS": self.pip_options,
            "LOCK": self.lock,
        }


def input_files(spec: BuildSpec) -> Iterator[Path]:
    """The files whose content the image's tag stands for: what the build copies into it
    (configs/ is baked in as the defaults of hosts that cannot mount it; run.py mounts it)."""
    return _HASHER.input_files(spec.repo_root, spec.module)


def source_hash(spec: BuildSpec) -> str:
    """Changes whenever anything that goes into the image, or a build argument, changes."""
    return _HASHER.source_hash(spec.repo_root, spec.module, spec.build_args())


def ensure_image(client: docker.DockerClient, spec: BuildSpec, rebuild: bool = False) -> str:
    """The tag of an image for `spec`, building it when it is missing or `rebuild` is set."""
    digest = source_hash(spec)
    tag = f"flock-validator-{spec.module.lower()}:{digest[:12]}"
    if not rebuild:
        try:
            found = client.images.get(tag)
        except ImageNotFound:
            found = None
        # Reused only when it is this checkout's build: the tag names 12 characters
        # of the hash, the label holds all of it.
        if found is not None and found.labels.get(SOURCE_LABEL) == digest:
            print(f"[run.py] using image {tag} (already built)", file=sys.stderr, flush=True)
            return tag
        if found is not None:
            say = f"[run.py] image {tag} is not this checkout's build: building it"
            print(say, file=sys.stderr, flush=True)
    base = pinned_base(client, spec.base_image)
    print(
        f"[run.py] building image {tag} from {DOCKERFILE} (base {base})",
        file=sys.stderr,
        flush=True,
    )
    _build(client, spec, tag, digest, base)
    return tag


def _build(client: docker.DockerClient, spec: BuildSpec, tag: str, digest: str, base: str) -> None:
    step = ""
    try:
        for chunk in client.api.build(
            path=str(spec.repo_root),
            dockerfile=DOCKERFILE,
            tag=tag,
            buildargs={**spec.build_args(), "BASE_FROM": base, "SOURCE_HASH": digest},
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
                raise BuildError(chunk["error"], build_log=iter(()))
    except (BuildError, APIError) as exc:
        if " : FROM " in step:  # ensure_base found it, yet the build could not get it
            raise base_unavailable(spec.base_image, str(exc)) from exc
        raise LaunchError(f"building {tag} failed: {exc}", exit_code=1) from exc


def pinned_base(client: docker.DockerClient, base: str) -> str:
    """What the build's FROM names: `base` when it is a digest, or an image this machine made
    (no registry holds it: the CI stand-in); for a tag, the digest the engine holds it as, pulled
    once when missing (ensure_base) and never pulled by tag again while the engine keeps it, so
    that every build on this host stands on the same bytes, with one line naming them."""
    ensure_base(client, base)
    if DIGEST_REFERENCE.search(base):
        return base
    try:
        held = client.images.get(base).attrs.get("RepoDigests") or []
    except (ImageNotFound, APIError) as exc:
        raise base_unavailable(base, _explanation(exc)) from exc
    repository = parse_repository_tag(base)[0]
    pinned = [ref for ref in held if ref.split("@")[0] in (repository, f"docker.io/{repository}")]
    if not pinned:
        return base
    print(
        f"[run.py] base {base} is named by tag: building on the digest this engine holds it as, "
        f"{pinned[0]} (pin it for every host: --base-image NAME@sha256:..., "
        'docs/images.md "The base image")',
        file=sys.stderr,
        flush=True,
    )
    return pinned[0]


def ensure_base(client: docker.DockerClient, base: str) -> None:
    """Pulls `base` unless the engine has it, so that a wrong or unreachable base is one clear
    line before any build output, not a build error at its FROM step; within the pace of
    launcher/engine/pulls.py, so that a registry that trickles is abandoned and named."""
    try:
        client.images.get(base)
        return
    except ImageNotFound:
        pass
    except APIError as exc:  # e.g. an invalid reference, which no pull would cure
        raise base_unavailable(base, _explanation(exc)) from exc
    print(f"[run.py] pulling the base image {base}", file=sys.stderr, flush=True)
    repository, tag = parse_repository_tag(base)

    def status(line: dict) -> None:
        if str(line.get("status", "")).startswith("Status:"):  # not every layer's progress
            print(f"[run.py] {line['status']}", file=sys.stderr, flush=True)

    error = pull(client, repository, tag or "latest", status)
    if error is not None:
        raise base_unavailable(base, error)


def base_unavailable(base: str, error: str) -> LaunchError:
    """The one line an operator gets for a base image the engine cannot get."""
    return LaunchError(
        f"base image {base!r} cannot be pulled ({pull_failure_reason(error)}); pick another "
        "with --base-image / VALIDATOR_BASE_IMAGE (a mambaorg/micromamba CUDA image by digest, see "
        'docs/images.md "The base image")'
    )


def pull_failure_reason(error: str) -> str:
    """A few words for an engine's pull error, whose full text runs to a URL and a resolver's
    address; an error it does not know comes back as its first line."""
    lowered = error.lower()
    for words, reason in PULL_FAILURES:
        if any(word in lowered for word in words):
            return reason
    first_line = error.strip().splitlines()[0] if error.strip() else "no reason given"
    return first_line if len(first_line) <= 160 else first_line[:157] + "..."


def _explanation(exc: APIError) -> str:
    return str(exc.explanation or exc)


def ensure_given_image(client: docker.DockerClient, image: str) -> str:
    """`--image IMAGE`: use it if present, else pull it (within the pace of
    launcher/engine/pulls.py)."""
    try:
        client.images.get(image)
        return image
    except ImageNotFound:
        pass
    except APIError as exc:  # an invalid reference, which is not a lost engine
        raise _given_image_unavailable(image, _explanation(exc)) from exc
    print(f"[run.py] pulling {image}", file=sys.stderr, flush=True)
    repository, tag = parse_repository_tag(image)
    error = pull(client, repository, tag or "latest")
    if error is not None:
        raise _given_image_unavailable(image, error)
    return image


def _given_image_unavailable(image: str, error: str) -> LaunchError:
    reason = pull_failure_reason(error)
    return LaunchError(f"image {image!r} is not present and cannot be pulled ({reason})")
