"""`python run.py release ...`: a release's signed manifest made and checked, its deployment
files, and this checkout pinned to it (docs/releasing.md, docs/images.md "How a released image
is verified").

The release workflow (.github/workflows/release.yml): `modules` and `build-args` for its jobs'
outputs; once every module's image is pushed, `manifest` (release.json), `sign` (with the key in
RELEASE_SIGNING_KEY), `verify` (against launcher/release/release_keys.json) and `deploy-files`
(compose*.yaml and deploy/kubernetes/ by digest). A maintainer, once: `keygen` and `pin-base`.
An operator: `pin`, this checkout's Compose files and Kubernetes base by its verified release.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import NoReturn

import click

from launcher.deploy.release_files import deploy_files as release_files
from launcher.deploy.release_files import write_files
from launcher.errors import LaunchError
from launcher.options import CHANNEL_ENV, DEFAULT_CHANNEL, PRODUCTION_BASE
from launcher.release import maintain
from launcher.release.channel import Channel, fetch_release
from launcher.release.manifest import ReleaseManifest, trusted_keys
from launcher.release.manifest import sign as signed
from launcher.release.manifest import verify as verified
from launcher.release.published import checkout_version, release_outputs
from validator.errors import ConfigError, ExitCode
from validator.spec import REPO_ROOT, find_modules


class ReleaseTools(click.Group):
    """A failed step is one line, `error: ...`, and its exit code: 2 for what was given wrong,
    3 for a file or a key that does not read, or a release that does not verify."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except LaunchError as exc:
            failed(exc, exc.exit_code)
        except ConfigError as exc:  # a module's spec, for its build arguments
            failed(exc, ExitCode.USAGE)
        except (OSError, ValueError) as exc:  # a file that cannot be read, a key that won't load
            failed(exc, ExitCode.OPERATOR)


def failed(exc: Exception, code: int) -> NoReturn:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(int(code))


@click.group(
    "release",
    cls=ReleaseTools,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
def release() -> None:
    """A release's signed manifest, its deployment files, and this checkout pinned to it."""


@release.command("modules")
def modules() -> None:
    """The modules, as modules=[...] (for $GITHUB_OUTPUT)."""
    print(f"modules={json.dumps(sorted(find_modules(REPO_ROOT)))}")


@release.command("build-args")
@click.argument("module")
@click.argument("owner")
@click.argument("tag", required=False)
def build_args(module: str, owner: str, tag: str | None) -> None:
    """MODULE's build arguments and tags as key=value lines (for $GITHUB_OUTPUT): OWNER, the
    GitHub owner (lower-cased for ghcr.io); TAG, the pushed tag, which must be v<version>."""
    outputs = release_outputs(REPO_ROOT, module, owner, tag)
    print("\n".join(f"{key}={value}" for key, value in outputs.items()))


@release.command("manifest")
@click.option("--digest", "digests", multiple=True, metavar="MODULE=sha256:...")
@click.option("--commit", required=True)
def manifest(digests: tuple[str, ...], commit: str) -> None:
    """release.json for this checkout, on stdout."""

    sys.stdout.buffer.write(maintain.make_manifest(REPO_ROOT, list(digests), commit).encoded())


@release.command("sign")
@click.argument("manifest_file", metavar="MANIFEST", type=click.Path(path_type=Path))
def sign(manifest_file: Path) -> None:
    """Write MANIFEST.sig with the key in $RELEASE_SIGNING_KEY."""
    key = maintain.private_key(os.environ.get(maintain.KEY_ENV, ""))
    signature = signed(manifest_file.read_bytes(), key)
    manifest_file.with_name(manifest_file.name + ".sig").write_bytes(signature)


@release.command("verify")
@click.argument("manifest_file", metavar="MANIFEST", type=click.Path(path_type=Path))
@click.argument("signature", type=click.Path(path_type=Path))
def verify(manifest_file: Path, signature: Path) -> None:
    """Check a manifest against the trusted keys."""

    body = manifest_file.read_bytes()
    version = ReleaseManifest.model_validate_json(body).version
    verified(body, signature.read_bytes(), version, trusted_keys())
    print(f"{manifest_file}: release v{version}, signed by a trusted key")


@release.command("deploy-files")
@click.argument("manifest_file", metavar="MANIFEST", type=click.Path(path_type=Path))
@click.argument("output", type=click.Path(path_type=Path))
def deploy_files(manifest_file: Path, output: Path) -> None:
    """A release's Compose and Kubernetes files, its images by digest, into OUTPUT."""
    made = ReleaseManifest.model_validate_json(manifest_file.read_bytes())
    write_files(output, release_files(REPO_ROOT, made))


@release.command("pin")
@click.option("--release-channel", envvar=CHANNEL_ENV, default=DEFAULT_CHANNEL, show_default=True)
def pin(release_channel: str) -> None:
    """This checkout's Compose and Kubernetes files by its verified release."""

    made = fetch_release(Channel(release_channel), checkout_version(REPO_ROOT))
    write_files(REPO_ROOT, release_files(REPO_ROOT, made))
    print(f"release v{made.version} verified: Compose and Kubernetes files by digest")


@release.command("keygen")
@click.argument("private_out", type=click.Path(path_type=Path))
@click.option("--note", default="release key", show_default=True)
def keygen(private_out: Path, note: str) -> None:
    """A new release key (maintainers): its private half to PRIVATE_OUT, its public half into
    launcher/release/release_keys.json."""
    maintain.keygen(private_out, note)


@release.command("pin-base")
@click.option("--digest", help="[default: what the registry holds for the base's tag]")
def pin_base(digest: str | None) -> None:
    """Name the production base by its digest."""
    base = PRODUCTION_BASE.split("@", 1)[0]
    changed = maintain.pin_base(REPO_ROOT, digest or maintain.registry_digest(base))
    print(f"pinned the base in {len(changed)} files; now run `make compose`")
