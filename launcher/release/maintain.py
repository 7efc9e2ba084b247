"""The release's signed manifest made, a maintainer's release key, and the production base
pinned by digest: the steps of `python run.py release` (launcher/commands/release.py) that
write something (docs/releasing.md)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from launcher.errors import LaunchError
from launcher.options import PRODUCTION_BASE
from launcher.release.manifest import DIGEST, KEYS_FILE, ReleaseManifest, public_entry
from launcher.release.published import checkout_version
from validator.errors import ExitCode
from validator.spec import find_modules
from validator.state.store import SCHEMA_VERSION

KEY_ENV = "RELEASE_SIGNING_KEY"
# Where the production base is named, for pin-base (the test of the base checks they agree).
BASE_FILES = ("launcher/options.py", "docker/Dockerfile", "docs/images.md")


def make_manifest(repo_root: Path, digests: list[str], commit: str) -> ReleaseManifest:
    images = {}
    for given in digests:
        module, _, digest = given.partition("=")
        if not re.fullmatch(DIGEST, digest):
            raise LaunchError(f"--digest {given!r}: give MODULE=sha256:<64 hex>", ExitCode.USAGE)
        images[module] = digest
    missing = sorted(set(find_modules(repo_root)) - set(images))
    if missing:
        raise LaunchError(f"no --digest for {', '.join(missing)}", ExitCode.USAGE)
    return ReleaseManifest(
        version=checkout_version(repo_root),
        commit=commit,
        journal_schema=SCHEMA_VERSION,
        images=images,
    )


def private_key(pem: str) -> Ed25519PrivateKey:
    key = load_pem_private_key(pem.encode(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise LaunchError(f"{KEY_ENV} is not an Ed25519 private key")
    return key


def keygen(private_out: Path, note: str) -> None:
    """A new release key: the private half to `private_out` (mode 0600, for the workflow's
    secret, never committed), the public half added to the trusted keys."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    fd = os.open(private_out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    entries = json.loads(KEYS_FILE.read_text())["keys"]
    entries.append(public_entry(key.public_key(), note))
    KEYS_FILE.write_text(json.dumps({"keys": entries}, indent=2) + "\n")
    print(f"wrote {private_out} (set it as {KEY_ENV}) and added key {entries[-1]['id']}")


def pin_base(repo_root: Path, digest: str) -> list[Path]:
    """Names the production base by `digest` wherever it is named by its tag alone."""
    if not re.fullmatch(DIGEST, digest):
        raise LaunchError(f"{digest!r} is not a sha256 digest", ExitCode.USAGE)
    tag = PRODUCTION_BASE.split("@", 1)[0]
    changed = []
    for name in BASE_FILES:
        path = repo_root / name
        text = path.read_text()
        pinned = re.sub(rf"{re.escape(tag)}(@sha256:[0-9a-f]{{64}})?", f"{tag}@{digest}", text)
        if pinned != text:
            path.write_text(pinned)
            changed.append(path)
    return changed


def registry_digest(image: str) -> str:
    """The digest the registry holds for `image`'s tag, asked through the Docker engine within
    the manifest read's deadline (launcher/engine/pulls.py)."""
    from launcher.engine.docker_errors import docker_client  # noqa: PLC0415 - only pin-base
    from launcher.engine.pulls import registry_digest as asked  # noqa: PLC0415

    return asked(docker_client(), image)
