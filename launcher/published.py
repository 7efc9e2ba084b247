"""Released images: what .github/workflows/release.yml publishes for a version tag, and how
`run.py MODULE --pull`, Compose and the Kubernetes base name them (docs/images.md "Released
images").

A release `vX.Y.Z` pushes `<registry>/flock-validator-<module>:X.Y.Z` and `:latest`, built from
the production base, and publishes a signed manifest of their digests (launcher/release.py). A
checkout runs the image of its own version, the one pyproject.toml holds, pulled by the digest
the manifest signed (issue 40: never by tag, which a registry can move), so the code in the
image is the code of the checkout's release; the registry (host and owner) is
`ghcr.io/flock-io` unless `--registry` / VALIDATOR_IMAGE_REGISTRY says otherwise: a mirror
serves the same digests, and one that does not is refused.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound
from docker.utils import kwargs_from_env
from requests.exceptions import RequestException

from launcher.errors import UsageError
from launcher.images import PRODUCTION_BASE, BuildSpec, pull_failure_reason, source_hash
from launcher.release import FIX, ReleaseManifest, ReleaseRefused
from launcher.release_channel import Channel, ReleaseUnavailable, fetch_release
from validator.errors import AnswerTooLarge, ConfigError, ExitCode, JsonRefused
from validator.outbound.answer_caps import ANSWER_CAPS
from validator.outbound.bounded_reader import json_lines
from validator.outbound.deadline import CallAbandoned, overall_deadline
from validator.spec import REPO_ROOT, find_modules, load_spec, module_folder

DEFAULT_REGISTRY = "ghcr.io/flock-io"
REGISTRY_ENV = "VALIDATOR_IMAGE_REGISTRY"
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
) -> str | None:
    """The image release `version` signed for `module`, by digest, once the engine holds it
    (pulled when missing): verified before any container starts. None after one line saying
    why when the release cannot be had (not published, channel or registry unreachable): the
    caller builds this checkout's image instead. ReleaseRefused (exit 3, one line) when the
    release does not verify or the registry does not hold what it signed."""
    try:
        manifest = fetch_release(channel, version)
    except ReleaseUnavailable as exc:
        _say(f"release v{version} not verified ({exc}): building the image here")
        return None
    return pull_release(client, registry, module, manifest)


def pull_release(
    client: docker.DockerClient,
    registry: str,
    module: str,
    manifest: ReleaseManifest,
    instead: str = "building it here",
) -> str | None:
    """The image a verified `manifest` signed for `module` (see pull_verified); None, after a
    line ending in `instead`, when the registry could not give it."""
    reference = released_reference(registry, module, manifest.digest(module))
    version = manifest.version
    if _holds(client, reference):
        _say(f"using the published image {reference} (already pulled, verified)")
        return reference
    _say(f"pulling the published image {reference} (release v{version}, verified)")
    error = _pull(client, reference)
    if error is not None:
        reason = pull_failure_reason(error)
        if reason in ABSENT:
            raise ReleaseRefused(
                f"the registry holds no {reference} ({reason}), the image release v{version} "
                f"signed for {module}: it was removed or replaced there; nothing was run; {FIX}"
            )
        return _not_pulled(reference, error, instead)
    if not _holds(client, reference):
        raise ReleaseRefused(f"the engine's {reference} is not what was pulled; {FIX}")
    return reference


# What a registry answers for a digest it does not hold (launcher/images.py's words for it).
ABSENT = ("no such tag", "no such image")


def _holds(client: docker.DockerClient, reference: str) -> bool:
    """Whether the engine has an image whose registry digest is `reference`'s: a tag it holds
    (an image pulled by tag, or tagged here) is never taken for it."""
    try:
        image = client.images.get(reference)
    except ImageNotFound:
        return False
    return reference in image.attrs.get("RepoDigests", [])


def _pull(client: docker.DockerClient, reference: str) -> str | None:
    """Pulls `reference` (repository@digest); the engine's error, or None once pulled. The
    pull runs in the engine, which reads the registry with no deadline of its own: the pull is
    abandoned once it falls behind PullPace (closing the engine's stream cancels it there)."""
    name, digest = reference.split("@", 1)
    pace = PullPace()
    try:
        # Its own connection, made inside the deadline, which can only end what it saw connect.
        with _own_api(client) as api, overall_deadline(PULL_MOST_S, "the pull", guard=pace.over):
            # Errors found before the download starts are HTTP errors; later ones are stream
            # items, each line read within the kit's registry.pull cap.
            stream = api.pull(name, tag=digest, stream=True, decode=False)
            for chunk in json_lines(stream, ANSWER_CAPS["registry.pull"], f"pulling {reference}"):
                if isinstance(chunk, dict) and "error" in chunk:
                    return str(chunk["error"])
                pace.add(chunk)
    except CallAbandoned as exc:  # past its pace: the engine's stream closed, the pull with it
        return str(exc)
    except APIError as exc:
        return str(exc.explanation or exc)
    except (DockerException, RequestException) as exc:  # e.g. the engine's answer timed out
        return str(exc)
    except (AnswerTooLarge, JsonRefused) as exc:  # a pull stream past its cap: not pulled
        return str(exc)[:300]
    return None


# A pull may take PULL_BASE_S, plus a second for each PULL_MIN_RATE bytes of its layers that
# arrived (and as many again to extract them): a registry that trickles is abandoned, however
# slowly it trickles, by the time the layers' sizes (the signed digest's, so no registry can
# inflate them) would have come at that rate; PULL_MOST_S in any case.
PULL_BASE_S = 300.0
PULL_MIN_RATE = 512 * 1024
PULL_MOST_S = 6 * 3600.0


class PullPace:
    """What a pull has earned of time: the engine's progress lines give, per layer and step
    (Downloading, Extracting), the bytes done out of the layer's size."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._done: dict[tuple[str, str], int] = {}
        self.done = 0  # bytes, all layers and steps; read by the deadline's watcher thread

    def add(self, line: object) -> None:
        detail = line.get("progressDetail") if isinstance(line, dict) else None
        if not isinstance(detail, dict):
            return
        current, total = detail.get("current"), detail.get("total")
        if not isinstance(current, int) or current < 0:
            return
        if isinstance(total, int) and total > 0:
            current = min(current, total)  # never more than the layer's signed size
        key = (str(line.get("status")), str(line.get("id")))
        self.done += current - self._done.get(key, 0)
        self._done[key] = current

    def over(self) -> str | None:
        elapsed = time.monotonic() - self.started
        if elapsed <= PULL_BASE_S + self.done / PULL_MIN_RATE:
            return None
        return (
            f"abandoned after {elapsed:.0f} s, {self.done} bytes of its layers in: slower than "
            f"{PULL_MIN_RATE // 1024} KiB/s after its first {PULL_BASE_S:g} s"
        )


@contextmanager
def _own_api(client: docker.DockerClient) -> Iterator[docker.APIClient]:
    """A low-level client of the engine `client` speaks to (the launcher's clients are all
    docker.from_env()'s), with a connection of its own: the shared client's pool would hand
    the pull a connection made before, out of its deadline's reach."""
    api = docker.APIClient(version=client.api.api_version, **kwargs_from_env())
    if api.base_url != client.api.base_url:
        api.close()
        raise DockerException(f"the engine at {client.api.base_url} is not the environment's")
    try:
        yield api
    finally:
        api.close()


def _not_pulled(image: str, error: str, instead: str) -> None:
    _say(f"published image {image} not pulled ({pull_failure_reason(error)}): {instead}")
    return None


def _say(message: str) -> None:
    print(f"[run.py] {message}", file=sys.stderr, flush=True)


def release_outputs(
    repo_root: Path, module: str, owner: str, ref: str | None, base: str = PRODUCTION_BASE
) -> dict[str, str]:
    """What the release workflow builds and pushes for `module`: the build arguments a
    `run.py` build of this checkout would use (so the image's source-hash label is the same)
    and the repository and version of its tags. `ref`, a pushed tag, must be `v<version>`: a
    checkout of the tag then pulls exactly what the tag pushed; and a release builds on a base
    named by digest (issue 40: a tag is what a registry can move)."""
    version = checkout_version(repo_root)
    if ref is not None and ref != f"v{version}":
        raise UsageError(f"tag {ref!r} is not v{version}, the version in pyproject.toml")
    if ref is not None and "@sha256:" not in base:
        raise UsageError(
            f"the production base {base} is named by tag: pin it by digest first "
            "(python -m launcher.release_cli pin-base, then make compose)"
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


def main(argv: list[str]) -> int:
    """`modules`: the modules as a JSON list; `build-args MODULE OWNER [TAG]`: release_outputs
    as key=value lines. The release workflow appends both to $GITHUB_OUTPUT."""
    parser = argparse.ArgumentParser(prog="python -m launcher.published", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("modules", help="the modules, as modules=[...]")
    build_args = commands.add_parser("build-args", help="a module's build arguments and tags")
    build_args.add_argument("module")
    build_args.add_argument("owner", help="the GitHub owner (lower-cased for ghcr.io)")
    build_args.add_argument("tag", nargs="?", help="the pushed tag, which must be v<version>")
    args = parser.parse_args(argv)
    if args.command == "modules":
        print(f"modules={json.dumps(sorted(find_modules(REPO_ROOT)))}")
        return ExitCode.OK
    try:
        outputs = release_outputs(REPO_ROOT, args.module, args.owner, args.tag)
    except (UsageError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    print("\n".join(f"{key}={value}" for key, value in outputs.items()))
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(int(main(sys.argv[1:])))
