"""Released images: what .github/workflows/release.yml publishes for a version tag, and how
`run.py MODULE --pull`, Compose and the Kubernetes base name them (docs/images.md "Released
images").

A release `vX.Y.Z` pushes `<registry>/flock-validator-<module>:X.Y.Z` and `:latest`, built from the
production base, and publishes a signed manifest of their digests (launcher/release/manifest.py). A
checkout runs the image of its own version, the one pyproject.toml holds, pulled by the digest the
manifest signed (never by tag, which a registry can move), so the code in the image is the code of
the checkout's release; the registry (host and owner) is `ghcr.io/flock-io` unless `--registry` /
VALIDATOR_IMAGE_REGISTRY says otherwise: a mirror serves the same digests, and one that does not is
refused. A release that cannot be had or verified runs nothing: building this checkout's image is
what run.py does without `--pull`, never a fallback of it."""

from __future__ import annotations

import re
from pathlib import Path

import docker
from docker.errors import ImageNotFound

from launcher.engine.images import BuildSpec, pull_failure_reason, source_hash
from launcher.engine.pulls import pull
from launcher.errors import UsageError, say
from launcher.options import DEFAULT_REGISTRY, PRODUCTION_BASE, REGISTRY_ENV
from launcher.release.channel import Channel, ReleaseUnavailable, fetch_release
from launcher.release.manifest import FIX, ReleaseManifest, ReleaseRefused
from validator.spec import load_spec, module_folder

# How an operator runs this checkout without a release: its own build, chosen, never a fallback.
BUILD_INSTEAD = "to build this checkout's image here instead, run it without --pull"
# `version = "..."` in pyproject.toml's [project] table: read with a pattern, as tomllib is
# Python 3.11's and the host runs 3.10.
_PROJECT_TABLE = re.compile(r"^\[project\]\s*$(?P<body>.*?)(?=^\[|\Z)", re.M | re.S)
_VERSION = re.compile(r"^version\s*=\s*\"(?P<version>[^\"]+)\"\s*$", re.M)
# A registry host with an optional port, then path components (an owner, a namespace).
_REGISTRY = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")


def checkout_version(repo_root: Path) -> str:
    """The version of this checkout: pyproject.toml's [project] version."""
    text = (repo_root / "pyproject.toml").read_text()
    table = _PROJECT_TABLE.search(text)
    found = _VERSION.search(table["body"]) if table else None
    if found is None:
        raise UsageError(f"{repo_root / 'pyproject.toml'} names no [project] version")
    return found["version"]


def repository(registry: str, module: str) -> str:
    """Where a module's released images live: `<registry>/flock-validator-<module>`."""
    if not _REGISTRY.fullmatch(registry.rstrip("/")):
        raise UsageError(
            f"--registry / {REGISTRY_ENV} {registry!r}: give a registry and owner such as "
            f"{DEFAULT_REGISTRY} or 127.0.0.1:5000/you"
        )
    return f"{registry.rstrip('/')}/flock-validator-{module.lower()}"


def published_image(registry: str, module: str, version: str) -> str:
    return f"{repository(registry, module)}:{version}"


def released_reference(registry: str, module: str, digest: str) -> str:
    """The image a release signed, by digest: `<registry>/flock-validator-<module>@sha256:...`.
    The engine checks what it pulls against the digest, so no registry or mirror can swap it."""
    return f"{repository(registry, module)}@{digest}"


def pull_verified(
    client: docker.DockerClient, registry: str, module: str, version: str, channel: Channel
) -> str:
    """The image release `version` signed for `module`, by digest, once the engine holds it
    (pulled when missing): verified before any container starts. ReleaseRefused (exit 3, one
    line) when the release cannot be had (not published, no key trusted yet, the channel or the
    registry unreachable), does not verify, or the registry does not hold what it signed:
    `--pull` runs a verified image or nothing, and building here is the operator's choice."""
    try:
        manifest = fetch_release(channel, version)
    except ReleaseUnavailable as exc:
        raise ReleaseRefused(
            f"release v{version} cannot be verified ({exc}): nothing was run; {BUILD_INSTEAD}"
        ) from None
    image = pull_release(client, registry, module, manifest)
    assert image is not None  # no `instead`: a pull that fails raises
    return image


def pull_release(
    client: docker.DockerClient,
    registry: str,
    module: str,
    manifest: ReleaseManifest,
    instead: str | None = None,
) -> str | None:
    """The image a verified `manifest` signed for `module` (see pull_verified). When the
    registry could not give it: None after a line ending in `instead` (the follower, which
    keeps the release it runs), or without one ReleaseRefused naming why (run.py --pull)."""
    reference = released_reference(registry, module, manifest.digest(module))
    version = manifest.version
    if _holds(client, reference):
        say(f"using the published image {reference} (already pulled, verified)")
        return reference
    say(f"pulling the published image {reference} (release v{version}, verified)")
    name, digest = reference.split("@", 1)
    error = pull(client, name, digest)
    if error is not None:
        reason = pull_failure_reason(error)
        if reason in ABSENT:
            raise ReleaseRefused(
                f"the registry holds no {reference} ({reason}), the image release v{version} "
                f"signed for {module}: it was removed or replaced there; nothing was run; {FIX}"
            )
        if instead is None:
            raise ReleaseRefused(
                f"published image {reference} not pulled ({reason}): nothing was run; check "
                f"--registry / {REGISTRY_ENV}, or {BUILD_INSTEAD}"
            )
        say(f"published image {reference} not pulled ({reason}): {instead}")
        return None
    if not _holds(client, reference):
        raise ReleaseRefused(f"the engine's {reference} is not what was pulled; {FIX}")
    return reference


# What a registry answers for a digest it does not hold (launcher/engine/images.py's words for it).
ABSENT = ("no such tag", "no such image")


def _holds(client: docker.DockerClient, reference: str) -> bool:
    """Whether the engine has an image whose registry digest is `reference`'s: a tag it holds
    (an image pulled by tag, or tagged here) is never taken for it."""
    try:
        image = client.images.get(reference)
    except ImageNotFound:
        return False
    return reference in image.attrs.get("RepoDigests", [])


def release_outputs(
    repo_root: Path, module: str, owner: str, ref: str | None, base: str = PRODUCTION_BASE
) -> dict[str, str]:
    """What the release workflow builds and pushes for `module`: the build arguments a
    `run.py` build of this checkout would use (so the image's source-hash label is the same)
    and the repository and version of its tags. `ref`, a pushed tag, must be `v<version>`: a
    checkout of the tag then pulls exactly what the tag pushed; and a release builds on a base
    named by digest (a tag is what a registry can move)."""
    version = checkout_version(repo_root)
    if ref is not None and ref != f"v{version}":
        raise UsageError(f"tag {ref!r} is not v{version}, the version in pyproject.toml")
    if ref is not None and "@sha256:" not in base:
        raise UsageError(
            f"the production base {base} is named by tag: pin it by digest first "
            "(python run.py release pin-base, then make compose)"
        )
    spec = load_spec(module_folder(module, repo_root))
    build = BuildSpec(module, repo_root, base, environment=spec.environment)
    return {
        "env_file": spec.environment,
        "base_image": base,
        "source_hash": source_hash(build),
        "repository": repository(f"ghcr.io/{owner.lower()}", module),
        "version": version,
    }
