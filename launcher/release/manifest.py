"""What a release says its images are: a manifest signed by the release workflow, checked
against the keys this checkout trusts before any released image runs (docs/images.md "How a
released image is verified").

A release `vX.Y.Z` publishes, beside its images and through another channel than the registry
(the GitHub release's assets, launcher/release/channel.py), two files:

- `release.json`: the version, the commit it was built from, the journal's schema version, and
  each module's image digest (`sha256:...`, the digest of what the registry holds for the tag);
- `release.json.sig`: an Ed25519 signature of those exact bytes, and the id of the key.

The trust anchor is `launcher/release/release_keys.json` in this checkout: the public keys whose
signatures count. Nothing else can add one (no option, no environment variable): whoever could
set the validator's environment (a .env file, a unit's Environment=) could otherwise make a
host trust their own images. A checkout trusts the keys its own history committed; a new key is
a commit, reviewed like code.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from launcher.errors import LaunchError
from validator.outbound.safe_json import loads_bounded

KEYS_FILE = Path(__file__).resolve().with_name("release_keys.json")
MANIFEST = "release.json"
SIGNATURE = "release.json.sig"
MAX_MANIFEST_BYTES = 64 * 1024
MAX_SIGNATURE_BYTES = 4 * 1024
VERSION = re.compile(r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$")
DIGEST = r"^sha256:[0-9a-f]{64}$"
FIX = 'see docs/images.md "When verification fails"'


class ReleaseRefused(LaunchError):
    """A release that cannot be had or does not verify, or whose image is not what it signed:
    never run, and nothing run in its place (exit 3)."""


class ReleaseManifest(BaseModel):
    """`release.json`, as the release workflow writes it (`python -m launcher.release.maintain`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal[1] = 1
    version: str = Field(pattern=VERSION.pattern)
    commit: str = Field(pattern=r"^[0-9a-f]{7,64}$")
    journal_schema: int = Field(ge=1)
    images: dict[str, str]

    def digest(self, module: str) -> str:
        found = self.images.get(module)
        if found is None or not re.fullmatch(DIGEST, found):
            raise ReleaseRefused(f"release v{self.version} signs no image for {module}; {FIX}")
        return found

    def encoded(self) -> bytes:
        """The bytes the workflow signs and publishes."""
        return (json.dumps(self.model_dump(), indent=2, sort_keys=True) + "\n").encode()


def version_key(version: str) -> tuple[int, int, int]:
    found = VERSION.fullmatch(version)  # `$` alone lets a trailing newline through
    if found is None:
        raise ValueError(f"not a release version: {version!r}")
    return int(found[1]), int(found[2]), int(found[3])


def key_id(public: Ed25519PublicKey) -> str:
    """A key's name in the keys file and in a signature: the start of its SHA-256."""
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def public_entry(public: Ed25519PublicKey, note: str) -> dict[str, str]:
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return {"id": key_id(public), "ed25519": base64.b64encode(raw).decode(), "note": note}


def trusted_keys(path: Path = KEYS_FILE) -> dict[str, Ed25519PublicKey]:
    """The keys whose signatures this checkout accepts, by id. A key whose id does not match
    its bytes is an edit gone wrong: refused, as is a file that is not the expected JSON."""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["keys"]
        keys = {}
        for entry in entries:
            public = Ed25519PublicKey.from_public_bytes(base64.b64decode(entry["ed25519"]))
            if key_id(public) != entry["id"]:
                raise ValueError(f"key {entry['id']} is not the key its bytes make")
            keys[entry["id"]] = public
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReleaseRefused(f"{path}: not a list of release keys ({exc}); restore it") from None
    return keys


def sign(manifest: bytes, private: Ed25519PrivateKey) -> bytes:
    """`release.json.sig` for `manifest`."""
    signature = base64.b64encode(private.sign(manifest)).decode()
    body = {"key": key_id(private.public_key()), "ed25519": signature}
    return (json.dumps(body, sort_keys=True) + "\n").encode()


def verify(
    manifest: bytes, signature: bytes, version: str, keys: dict[str, Ed25519PublicKey]
) -> ReleaseManifest:
    """The manifest of release `version`, once its signature is one of `keys`' and it names
    that version; ReleaseRefused in one line otherwise."""
    where = f"release v{version}"
    if not keys:
        raise ReleaseRefused(f"{where}: this checkout trusts no release key ({KEYS_FILE.name})")
    if len(manifest) > MAX_MANIFEST_BYTES or len(signature) > MAX_SIGNATURE_BYTES:
        raise ReleaseRefused(f"{where}: its {MANIFEST} or signature is oversized; {FIX}")
    try:
        # The channel's bytes, before anything verifies them: decoded within a size and a
        # nesting (4,000 `[` would be a RecursionError out of json.loads).
        signed = loads_bounded(signature, SIGNATURE, max_bytes=MAX_SIGNATURE_BYTES, max_values=16)
        public = keys.get(str(signed["key"]))
        raw = base64.b64decode(str(signed["ed25519"]), validate=True)
    except (ValueError, KeyError, TypeError):  # JsonRefused is a ValueError
        raise ReleaseRefused(f"{where}: {SIGNATURE} is not a signature; {FIX}") from None
    if public is None:
        raise ReleaseRefused(
            f"{where} is signed by key {str(signed['key'])[:16]!r}, which this checkout does "
            f"not trust; {FIX}"
        )
    try:
        public.verify(raw, manifest)
    except InvalidSignature:
        raise ReleaseRefused(f"{where}: the signature of its {MANIFEST} is wrong; {FIX}") from None
    try:
        found = ReleaseManifest.model_validate_json(manifest)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ReleaseRefused(f"{where}: {MANIFEST} is malformed ({first['msg']})") from None
    if found.version != version:
        raise ReleaseRefused(f"{where}: its signed {MANIFEST} is v{found.version}'s; {FIX}")
    return found
