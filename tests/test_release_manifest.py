"""A release's signed manifest (launcher/release/manifest.py) and its channel
(launcher/release/channel.py, against devkit's stand-in on 127.0.0.1): what verifies, what is
refused in one line, and what counts as not published (the caller builds here). The trust anchor
is the checkout's own keys file, which no option or environment variable adds to."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from devkit.release_channel import ASSETS, LocalReleaseChannel, Release, ReleaseKey
from launcher.commands import release as release_command
from launcher.deploy.release_files import deploy_files
from launcher.options import PRODUCTION_BASE
from launcher.release import maintain
from launcher.release import manifest as release
from launcher.release.channel import (
    Channel,
    ReleaseUnavailable,
    _redirected,
    fetch_release,
    newer_versions,
)
from launcher.release.manifest import (
    KEYS_FILE,
    MANIFEST,
    SIGNATURE,
    ReleaseManifest,
    ReleaseRefused,
    trusted_keys,
    verify,
    version_key,
)
from launcher.release.published import repository
from tests.helpers.run_py import run_py
from validator.spec import REPO_ROOT

DIGEST_A, DIGEST_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


@pytest.fixture
def key(tmp_path):
    made = ReleaseKey()
    (tmp_path / "launcher" / "release").mkdir(parents=True)
    made.trust_in(tmp_path)
    return made, trusted_keys(tmp_path / "launcher" / "release" / "release_keys.json")


def test_a_signed_release_verifies_and_names_its_digests(key):
    made, keys = key
    files = made.release("0.1.1", {"rl": DIGEST_A}).files
    manifest = verify(files[MANIFEST], files[SIGNATURE], "0.1.1", keys)
    assert manifest.digest("rl") == DIGEST_A
    with pytest.raises(ReleaseRefused, match="signs no image for lora"):
        manifest.digest("lora")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ("other key", "which this checkout does not trust"),
        ("tampered", "the signature of its release.json is wrong"),
        ("other version", "its signed release.json is v0.1.0's"),
        ("not a signature", "release.json.sig is not a signature"),
        ("nested signature", "release.json.sig is not a signature"),
        ("no key", "this checkout trusts no release key"),
    ],
)
def test_what_does_not_verify_is_refused_in_one_line(key, change, words):
    made, keys = key
    files = made.release("0.1.0" if change == "other version" else "0.1.1", {"rl": DIGEST_A}).files
    manifest, signature = files[MANIFEST], files[SIGNATURE]
    if change == "other key":
        signature = ReleaseKey().release("0.1.1", {"rl": DIGEST_A}).files[SIGNATURE]
    elif change == "tampered":
        manifest = manifest.replace(DIGEST_A.encode(), DIGEST_B.encode())
    elif change == "not a signature":
        signature = b"<html>rate limited</html>"
    elif change == "nested signature":  # 4 kB, past json.loads' recursion limit
        signature = b"[" * 4000
    elif change == "no key":
        keys = {}
    with pytest.raises(ReleaseRefused) as refused:
        verify(manifest, signature, "0.1.1", keys)
    assert words in str(refused.value) and "\n" not in str(refused.value)
    assert refused.value.exit_code == 3


def test_a_keys_file_edited_wrong_is_refused(tmp_path, key):
    path = tmp_path / "launcher" / "release" / "release_keys.json"
    entries = json.loads(path.read_text())
    entries["keys"][0]["id"] = "0" * 16  # an id that is not the key's
    path.write_text(json.dumps(entries))
    with pytest.raises(ReleaseRefused, match="not a list of release keys"):
        trusted_keys(path)


def test_the_trust_anchor_is_the_checkouts_file_and_nothing_else():
    # The file beside the launcher's code: no option names another, and the code that reads
    # and checks releases reads no environment variable (one in an attacker's reach would
    # otherwise make a host trust their images).
    assert KEYS_FILE == (REPO_ROOT / "launcher" / "release" / "release_keys.json").resolve()
    assert KEYS_FILE.is_file()
    for name in ("release/manifest.py", "release/channel.py"):
        text = (REPO_ROOT / "launcher" / name).read_text()
        assert "os.environ" not in text and "getenv" not in text, name
    assert "release_keys" not in (REPO_ROOT / "launcher" / "commands" / "run.py").read_text()


def test_channel_addresses_are_githubs():
    github = Channel("https://github.com/FLock-io/flock-validator")
    assert github.asset("0.1.1", MANIFEST) == (
        "https://github.com/FLock-io/flock-validator/releases/download/v0.1.1/release.json"
    )
    assert github.listing() == (
        "https://api.github.com/repos/FLock-io/flock-validator/releases?per_page=100"
    )
    mirror = Channel("http://127.0.0.1:9/o/r")
    assert mirror.listing() == "http://127.0.0.1:9/api/v3/repos/o/r/releases?per_page=100"
    for bad in ("ftp://github.com/o/r", "https://github.com/o", "https://github.com/o/r/x"):
        with pytest.raises(release.LaunchError, match="give a repository's address"):
            Channel(bad)


def test_the_channel_gives_verified_releases_and_the_newer_ones_of_a_major(key):
    made, keys = key
    with LocalReleaseChannel() as channel:
        for version in ("0.1.0", "0.1.1", "0.2.0", "1.0.0"):
            channel.publish(made.release(version, {"rl": DIGEST_A}))
        channel.publish(ReleaseKey().release("0.3.0", {"rl": DIGEST_B}))  # not ours: listed
        channel.publish(Release("0.4.0\n", {}))  # no release tag of ours
        found = fetch_release(Channel(channel.url), "0.1.1", keys)
        assert found.version == "0.1.1" and found.digest("rl") == DIGEST_A
        # Each asset came from where its download redirected, as GitHub's do.
        assert f"/{ASSETS}/v0.1.1/{MANIFEST}" in channel.requests
        assert newer_versions(Channel(channel.url), "0.1.0") == ["0.3.0", "0.2.0", "0.1.1"]
        assert newer_versions(Channel(channel.url), "1.0.0") == []
        with pytest.raises(ReleaseRefused, match="does not trust"):
            fetch_release(Channel(channel.url), "0.3.0", keys)
        with pytest.raises(ReleaseUnavailable, match="not published"):
            fetch_release(Channel(channel.url), "0.9.9", keys)
        with pytest.raises(ReleaseUnavailable, match="trusts no release key"):
            fetch_release(Channel(channel.url), "0.1.1", {})
    with pytest.raises(ReleaseUnavailable, match="cannot be reached"):
        fetch_release(Channel(channel.url), "0.1.1", keys)  # the channel is down now


def test_a_release_writes_compose_and_kubernetes_by_digest(key, tmp_path):
    made, keys = key
    digests = {name: f"sha256:{i:064x}" for i, name in enumerate(("llm_judge", "lora", "rl"))}
    files = made.release("0.1.0", digests).files
    manifest = verify(files[MANIFEST], files[SIGNATURE], "0.1.0", keys)
    written = deploy_files(REPO_ROOT, manifest)
    compose = yaml.safe_load(written[Path("compose.yaml")])
    for name, digest in digests.items():
        service = compose["services"][f"validator-{name}"]
        assert service["image"] == (
            f"${{VALIDATOR_IMAGE_REGISTRY:-ghcr.io/flock-io}}/flock-validator-{name}@{digest}"
        )
        assert "build" not in service  # the signed image or nothing, never a build under its name
    gpus = yaml.safe_load(written[Path("compose.gpus.yaml")])
    assert all("@sha256:" in s["image"] and "build" not in s for s in gpus["services"].values())
    base = yaml.safe_load(written[Path("deploy/kubernetes/base/kustomization.yaml")])
    assert base["images"] == [
        {"name": f"ghcr.io/flock-io/flock-validator-{name}", "digest": digest}
        for name, digest in digests.items()
    ]


def test_the_release_command_signs_what_the_checkouts_keys_verify(tmp_path, monkeypatch):
    keys = tmp_path / "launcher" / "release" / "release_keys.json"
    keys.parent.mkdir(parents=True)
    keys.write_text('{"keys": []}\n')
    monkeypatch.setattr(maintain, "KEYS_FILE", keys)
    monkeypatch.setattr(release_command, "trusted_keys", lambda: trusted_keys(keys))
    private = tmp_path / "release.pem"
    made = run_py("release", "keygen", str(private))
    assert made.exit_code == 0 and "added key" in made.stdout
    assert os.stat(private).st_mode & 0o777 == 0o600
    digests = [f"--digest={n}={DIGEST_A}" for n in ("llm_judge", "lora", "rl")]
    made = run_py("release", "manifest", *digests, "--commit", "abc1234")
    assert made.exit_code == 0
    manifest = tmp_path / "release.json"
    manifest.write_bytes(made.stdout_bytes)
    signing = {maintain.KEY_ENV: private.read_text()}
    assert run_py("release", "sign", str(manifest), **signing).exit_code == 0
    signature = tmp_path / "release.json.sig"
    assert run_py("release", "verify", str(manifest), str(signature)).exit_code == 0
    manifest.write_text(manifest.read_text().replace("abc1234", "abc1235"))
    refused = run_py("release", "verify", str(manifest), str(signature))
    assert refused.exit_code == 3
    assert "the signature of its release.json is wrong" in refused.stderr
    refused = run_py("release", "manifest", "--digest", f"rl={DIGEST_A}", "--commit", "abc1")
    assert refused.exit_code == 2 and "error: no --digest for llm_judge, lora" in refused.stderr


def test_pin_base_names_the_production_base_by_digest_everywhere(tmp_path):
    tag = PRODUCTION_BASE
    for name in maintain.BASE_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((REPO_ROOT / name).read_text())
    changed = maintain.pin_base(tmp_path, DIGEST_A)
    assert len(changed) == len(maintain.BASE_FILES)
    for name in maintain.BASE_FILES:
        text = (tmp_path / name).read_text()
        assert f"{tag}@{DIGEST_A}" in text and text.count(tag) == text.count(f"{tag}@{DIGEST_A}")
    maintain.pin_base(tmp_path, DIGEST_B)  # again: the digest replaced, not appended
    assert f"{tag}@{DIGEST_B}" in (tmp_path / "docker/Dockerfile").read_text()
    assert DIGEST_A not in (tmp_path / "docker/Dockerfile").read_text()


def test_a_trailing_newline_makes_no_version_digest_or_registry():
    # `re.match` with `$` lets one through: each is matched whole.
    assert version_key("0.1.1") == (0, 1, 1)
    with pytest.raises(ValueError, match="not a release version"):
        version_key("0.1.1\n")
    manifest = ReleaseManifest(
        version="0.1.1", commit="0" * 40, journal_schema=1, images={"rl": DIGEST_A + "\n"}
    )
    with pytest.raises(ReleaseRefused, match="signs no image for rl"):
        manifest.digest("rl")
    with pytest.raises(release.LaunchError, match="give a registry and owner"):
        repository("ghcr.io/flock-io\n", "rl")


def test_a_redirect_of_the_channel_stays_on_http_and_never_goes_down_from_https():
    assert _redirected("https://github.com/o/r/x", "/y") == "https://github.com/y"
    assert _redirected("http://127.0.0.1:9/a", "https://example.org/b") == "https://example.org/b"
    for location in (None, "", "http://example.org/b", "file:///etc/passwd", "http://[::1"):
        with pytest.raises(ReleaseUnavailable, match="redirects to"):
            _redirected("https://github.com/o/r/x", location)
