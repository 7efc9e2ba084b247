"""`python -m launcher.release.maintain`: the release's signed manifest, made and checked
(docs/images.md "How a released image is verified").

The release workflow (.github/workflows/release.yml), once every module's image is pushed:

    manifest --digest lora=sha256:... --digest rl=sha256:... --commit SHA > release.json
    sign release.json            # the key in RELEASE_SIGNING_KEY (PEM): release.json.sig
    verify release.json release.json.sig     # against launcher/release/release_keys.json
    deploy-files release.json OUT            # compose*.yaml, deploy/kubernetes/ by digest

A maintainer, once: `keygen FILE` (a new key: its private half to FILE, for the workflow's
secret; its public half into launcher/release/release_keys.json, to commit), and `pin-base`,
which names the production base by the digest the registry holds for its tag (run where the
registry can be reached). An operator: `pin`, which verifies the checkout's release on the
channel and writes its Compose files and Kubernetes base by digest into the checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from launcher.deploy import kubernetes
from launcher.deploy.compose_gpus import GPUS_FILE, HOSTS_FILE, load_hosts, render_gpus
from launcher.deploy.compose_services import (
    COMPOSE_FILE,
    CPU_OVERRIDE_FILE,
    render,
    specs_with_files,
)
from launcher.engine.images import PRODUCTION_BASE
from launcher.errors import LaunchError
from launcher.release.channel import CHANNEL_ENV, DEFAULT_CHANNEL, Channel, fetch_release
from launcher.release.manifest import (
    DIGEST,
    KEYS_FILE,
    ReleaseManifest,
    public_entry,
    sign,
    trusted_keys,
    verify,
)
from launcher.release.published import checkout_version
from validator.errors import ExitCode
from validator.spec import REPO_ROOT
from validator.state.store import SCHEMA_VERSION

KEY_ENV = "RELEASE_SIGNING_KEY"
# Where the production base is named, for pin-base (the test of the base checks they agree).
BASE_FILES = ("launcher/engine/images.py", "docker/Dockerfile", "docs/images.md")


def make_manifest(repo_root: Path, digests: list[str], commit: str) -> ReleaseManifest:
    images = {}
    for given in digests:
        module, _, digest = given.partition("=")
        if not re.fullmatch(DIGEST, digest):
            raise LaunchError(f"--digest {given!r}: give MODULE=sha256:<64 hex>", ExitCode.USAGE)
        images[module] = digest
    missing = sorted(set(specs_with_files(repo_root)) - set(images))
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


def deploy_files(repo_root: Path, manifest: ReleaseManifest) -> dict[Path, str]:
    """The release's Compose files and Kubernetes base, its images by digest, by path in a
    checkout."""
    specs = specs_with_files(repo_root)
    compose, cpu = render(specs, manifest.images)
    files = {Path(COMPOSE_FILE): compose, Path(CPU_OVERRIDE_FILE): cpu}
    hosts = repo_root / HOSTS_FILE
    if hosts.is_file():
        files[Path(GPUS_FILE)] = render_gpus(specs, load_hosts(hosts, specs), manifest.images)
    for path, text in kubernetes.render(specs, manifest.images).items():
        files[kubernetes.OUTPUT_DIR / path] = text
    return files


def write_files(root: Path, files: dict[Path, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


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


def _registry_digest(image: str) -> str:
    """The digest the registry holds for `image`'s tag, asked through the Docker engine within
    the manifest read's deadline (launcher/engine/pulls.py)."""
    from launcher.engine.docker_errors import docker_client  # noqa: PLC0415 - only this command
    from launcher.engine.pulls import registry_digest  # noqa: PLC0415

    return registry_digest(docker_client(), image)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m launcher.release.maintain", description=__doc__
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("manifest", help="release.json for this checkout, on stdout")
    made.add_argument("--digest", action="append", default=[], help="MODULE=sha256:...")
    made.add_argument("--commit", required=True)
    signed = commands.add_parser("sign", help=f"write FILE.sig with the key in ${KEY_ENV}")
    signed.add_argument("manifest", type=Path)
    checked = commands.add_parser("verify", help="check a manifest against the trusted keys")
    checked.add_argument("manifest", type=Path)
    checked.add_argument("signature", type=Path)
    files = commands.add_parser("deploy-files", help="a release's Compose and Kubernetes files")
    files.add_argument("manifest", type=Path)
    files.add_argument("output", type=Path)
    pin = commands.add_parser("pin", help="this checkout's files by its verified release")
    pin.add_argument("--release-channel", default=os.environ.get(CHANNEL_ENV, DEFAULT_CHANNEL))
    key = commands.add_parser("keygen", help="a new release key (maintainers)")
    key.add_argument("private_out", type=Path)
    key.add_argument("--note", default="release key")
    base = commands.add_parser("pin-base", help="name the production base by its digest")
    base.add_argument("--digest", help="[default: what the registry holds for the base's tag]")
    return parser


def run(args: argparse.Namespace) -> None:
    if args.command == "manifest":
        sys.stdout.buffer.write(make_manifest(REPO_ROOT, args.digest, args.commit).encoded())
    elif args.command == "sign":
        key = private_key(os.environ.get(KEY_ENV, ""))
        signature = sign(args.manifest.read_bytes(), key)
        args.manifest.with_name(args.manifest.name + ".sig").write_bytes(signature)
    elif args.command == "verify":
        manifest = args.manifest.read_bytes()
        version = ReleaseManifest.model_validate_json(manifest).version
        verify(manifest, args.signature.read_bytes(), version, trusted_keys())
        print(f"{args.manifest}: release v{version}, signed by a trusted key")
    elif args.command == "deploy-files":
        manifest = ReleaseManifest.model_validate_json(args.manifest.read_bytes())
        write_files(args.output, deploy_files(REPO_ROOT, manifest))
    elif args.command == "pin":
        manifest = fetch_release(Channel(args.release_channel), checkout_version(REPO_ROOT))
        write_files(REPO_ROOT, deploy_files(REPO_ROOT, manifest))
        print(f"release v{manifest.version} verified: Compose and Kubernetes files by digest")
    elif args.command == "keygen":
        keygen(args.private_out, args.note)
    elif args.command == "pin-base":
        digest = args.digest or _registry_digest(PRODUCTION_BASE.split("@", 1)[0])
        changed = pin_base(REPO_ROOT, digest)
        print(f"pinned the base in {len(changed)} files; now run `make compose`")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        run(args)
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (OSError, ValueError) as exc:  # a file that cannot be read, a key that does not load
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.OPERATOR
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(int(main()))
