"""Released images: what .github/workflows/release.yml publishes for a version tag, and how
`run.py MODULE --pull`, Compose and the Kubernetes base name them (docs/images.md "Released
images").

A release `vX.Y.Z` pushes `<registry>/flock-validator-<module>:X.Y.Z` and `:latest`, built from
the production base. A checkout runs the image of its own version, the one pyproject.toml
holds, so the code in the image is the code of the checkout's release; the registry (host and
owner) is `ghcr.io/flock-io` unless `--registry` / VALIDATOR_IMAGE_REGISTRY says otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound
from docker.utils import parse_repository_tag
from requests.exceptions import RequestException

from launcher.errors import UsageError
from launcher.images import PRODUCTION_BASE, BuildSpec, pull_failure_reason, source_hash
from validator.errors import AnswerTooLarge, ConfigError, ExitCode, JsonRefused
from validator.kit.bounded_reader import CAPS, json_lines
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
    if not _REGISTRY.match(registry.rstrip("/")):
        raise UsageError(
            f"--registry / {REGISTRY_ENV} {registry!r}: give a registry and owner such as "
            f"{DEFAULT_REGISTRY} or 127.0.0.1:5000/you"
        )
    return f"{registry.rstrip('/')}/flock-validator-{module.lower()}"


def published_image(registry: str, module: str, version: str) -> str:
    return f"{repository(registry, module)}:{version}"


def pull_published(client: docker.DockerClient, image: str) -> str | None:
    """`image` once the engine has it (pulled when missing), or None after one line saying why
    it could not be had, for the caller to build the image here instead."""
    try:
        client.images.get(image)
        _say(f"using the published image {image} (already pulled)")
        return image
    except ImageNotFound:
        pass
    except APIError as exc:
        return _not_pulled(image, str(exc.explanation or exc))
    _say(f"pulling the published image {image}")
    name, tag = parse_repository_tag(image)
    try:
        # Errors found before the download starts are HTTP errors; later ones are stream items,
        # each line read within the kit's registry.pull cap.
        stream = client.api.pull(name, tag=tag, stream=True, decode=False)
        for chunk in json_lines(stream, CAPS["registry.pull"], f"pulling {image}"):
            if isinstance(chunk, dict) and "error" in chunk:
                return _not_pulled(image, str(chunk["error"]))
    except APIError as exc:
        return _not_pulled(image, str(exc.explanation or exc))
    except (DockerException, RequestException) as exc:  # e.g. the engine's answer timed out
        return _not_pulled(image, str(exc))
    except (AnswerTooLarge, JsonRefused) as exc:
        return _not_pulled(image, str(exc)[:300])
    return image


def _not_pulled(image: str, error: str) -> None:
    _say(f"published image {image} not pulled ({pull_failure_reason(error)}): building it here")
    return None


def _say(message: str) -> None:
    print(f"[run.py] {message}", file=sys.stderr, flush=True)


def release_outputs(repo_root: Path, module: str, owner: str, ref: str | None) -> dict[str, str]:
    """What the release workflow builds and pushes for `module`: the build arguments a
    `run.py` build of this checkout would use (so the image's source-hash label is the same)
    and the repository and version of its tags. `ref`, a pushed tag, must be `v<version>`: a
    checkout of the tag then pulls exactly what the tag pushed."""
    version = checkout_version(repo_root)
    if ref is not None and ref != f"v{version}":
        raise UsageError(f"tag {ref!r} is not v{version}, the version in pyproject.toml")
    spec = load_spec(module_folder(module, repo_root))
    build = BuildSpec(module, repo_root, PRODUCTION_BASE, "micromamba", "", spec.environment)
    return {
        "env_file": spec.environment,
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
