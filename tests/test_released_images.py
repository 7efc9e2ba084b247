"""`run.py MODULE --pull` against a real registry on 127.0.0.1 (Debian's docker-registry) and a
stand-in for the releases' channel (devkit/release_channel.py) with a release key the repo copy
trusts: the image the checkout's release signed is pulled by digest, verified, and run without a
build; an image substituted in the registry never runs; a release that does not
verify is one line and exit 3; and so is a release the channel does not have, a registry nobody
answers at, or one that trickles: `--pull` runs a verified image or nothing, and nothing is
built in its place."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import threading
import uuid

import pytest
from docker.errors import ImageNotFound

from devkit.docker_env import launcher_env, make_module_repo, run_py_command
from devkit.local_registry import LocalRegistry, free_port
from devkit.local_registry import push_image as push
from devkit.release_channel import LocalReleaseChannel, Release, ReleaseKey
from launcher.deploy.release_files import deploy_files, write_files
from launcher.engine import pulls
from launcher.engine.images import BuildSpec, ensure_base, source_hash
from launcher.errors import LaunchError, UsageError
from launcher.options import DEFAULT_REGISTRY, REGISTRY_ENV
from launcher.release.channel import Channel
from launcher.release.follow import Follower
from launcher.release.manifest import SIGNATURE, ReleaseManifest, ReleaseRefused, trusted_keys
from launcher.release.published import (
    checkout_version,
    published_image,
    pull_release,
    release_outputs,
)
from tests.helpers.docker_env import require_engine
from tests.helpers.hostile_server import HostileServer, answer
from validator.spec import REPO_ROOT

KEY = ReleaseKey()


@pytest.fixture(scope="module")
def engine():
    return require_engine()


@pytest.fixture(scope="module")
def repo(engine, tmp_path_factory):
    made = make_module_repo(tmp_path_factory.mktemp("repo"))
    KEY.trust_in(made)  # the copy trusts this run's release key, and only it
    return made


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def channel():
    with LocalReleaseChannel() as running:
        yield running


@pytest.fixture(scope="module")
def local_build(engine, repo) -> str:
    """The fixture module's image as this checkout builds it (the tag run.py prints)."""
    built = run_py(repo, "fixture", "--build-only")
    assert built.returncode == 0, built.stderr
    return built.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def substitute(engine, local_build) -> str:
    """Another image, as an attacker would push in the release's place: the same with a label."""
    dockerfile = f"FROM {local_build}\nLABEL substituted=yes\n".encode()
    # Tagged, so that dropping the registry's names of it leaves it here.
    name = f"fv-test-substitute:{uuid.uuid4().hex[:8]}"
    image, _ = engine.images.build(fileobj=io.BytesIO(dockerfile), rm=True, tag=name)
    yield image.id
    engine.images.remove(name, force=True)


def run_py(repo, *args, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        run_py_command(repo, *args),
        env=launcher_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def pull_args(registry: str, channel, *more: str) -> list[str]:
    return ["fixture", "--pull", "--registry", registry, "--release-channel", channel.url, *more]


def check_file(tmp_path) -> str:
    check = tmp_path / "input.json"
    check.write_text(json.dumps({"hg_repo_id": "ok/abc"}))
    return str(check)


def test_pull_runs_the_verified_release_by_digest_without_a_build(
    engine, repo, registry, channel, local_build, tmp_path
):
    # What the release workflow does for a version tag: push the module's image, sign the
    # digest the push answered, publish the manifest on the channel.
    version = checkout_version(repo)
    digest = push(engine, local_build, f"{registry.address}/flock-validator-fixture:{version}")
    channel.publish(KEY.release(version, {"fixture": digest}))
    released = f"{registry.address}/flock-validator-fixture@{digest}"
    asked_before = len(registry.requests())
    try:
        result = run_py(
            repo, *pull_args(registry.address, channel, "--check", check_file(tmp_path))
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.strip().splitlines()[-1])["repo_length"] == 6
        assert (
            f"[run.py] pulling the published image {released} (release v{version}, verified)\n"
            in result.stderr
        )
        assert f"[run.py] starting fixture in {released} " in result.stderr
        assert "building image" not in result.stderr
        # The registry was asked for the digest, never the tag.
        asked = registry.requests()[asked_before:]
        assert any(re.match(rf'(GET|HEAD) /v2/flock-validator-fixture/manifests/{digest} ', line)
                   for line in asked), asked  # fmt: skip
        assert not [line for line in asked if f"/manifests/{version} " in line]
        # Pulled once: a second start uses what the engine holds by that digest.
        again = run_py(repo, *pull_args(registry.address, channel, "--build-only"))
        assert again.stdout.strip().splitlines()[-1] == released
        assert f"using the published image {released} (already pulled, verified)" in again.stderr
    finally:
        engine.images.remove(released, force=True)


def test_an_image_substituted_in_the_registry_never_runs(
    engine, repo, registry, channel, local_build, substitute, tmp_path
):
    version = checkout_version(repo)
    name = f"{registry.address}/flock-validator-fixture"
    digest = push(engine, local_build, f"{name}:{version}")
    channel.publish(KEY.release(version, {"fixture": digest}))
    # The registry's tag now names another image, and this engine pulled it by that tag (an
    # image a pull by tag would reuse as "already pulled").
    push(engine, substitute, f"{name}:{version}")
    engine.images.pull(name, tag=version)
    assert engine.images.get(f"{name}:{version}").id == substitute
    # Elsewhere, a registry that holds only the substitute (a mirror, a compromised one).
    evil = f"{registry.address}/evil"
    push(engine, substitute, f"{evil}/flock-validator-fixture:{version}")
    try:
        ran = run_py(repo, *pull_args(registry.address, channel, "--check", check_file(tmp_path)))
        assert ran.returncode == 0, ran.stderr
        assert f"[run.py] starting fixture in {name}@{digest} " in ran.stderr
        assert engine.images.get(f"{name}@{digest}").id == engine.images.get(local_build).id
        refused = run_py(repo, *pull_args(evil, channel, "--check", check_file(tmp_path)))
        assert refused.returncode == 3, refused.stderr
        errors = [line for line in refused.stderr.splitlines() if "error:" in line]
        assert errors == [
            f"[run.py] error: the registry holds no {evil}/flock-validator-fixture@{digest} (no "
            f"such tag), the image release v{version} signed for fixture: it was removed or "
            'replaced there; nothing was run; see docs/images.md "When verification fails"'
        ], refused.stderr
        assert "starting fixture" not in refused.stderr and refused.stdout == ""
    finally:
        for image in (f"{name}:{version}", f"{name}@{digest}"):
            engine.images.remove(image, force=True)


@pytest.mark.parametrize(
    ("forgery", "words"),
    [
        ("another key", "which this checkout does not trust"),
        # 4,000 `[`: past json.loads' recursion limit, never a traceback and exit 1.
        ("a nested signature", "release.json.sig is not a signature"),
    ],
)
def test_a_release_that_does_not_verify_is_one_line_and_exit_3(
    engine, repo, registry, channel, local_build, tmp_path, forgery, words
):
    version = checkout_version(repo)
    digest = push(engine, local_build, f"{registry.address}/flock-validator-fixture:{version}")
    forged = ReleaseKey().release(version, {"fixture": digest})  # a key the copy does not trust
    if forgery == "a nested signature":
        forged = Release(version, {**forged.files, SIGNATURE: b"[" * 4000})
    channel.publish(forged)
    result = run_py(repo, *pull_args(registry.address, channel, "--check", check_file(tmp_path)))
    assert result.returncode == 3, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and words in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "pulling" not in result.stderr and "starting fixture" not in result.stderr


@pytest.mark.parametrize("where", ["unpublished", "closed"])
def test_a_release_that_cannot_be_had_runs_nothing_and_builds_nothing(
    engine, repo, registry, channel, local_build, where
):
    # Before: one line, then "building it here", on a base by tag with installs not pinned by
    # hash; the operator asked for the verified release.
    version = checkout_version(repo)
    digest = "sha256:" + "c" * 64
    env = {}
    if where == "closed":  # a registry nobody answers at, set as a .env would set it
        owner = f"127.0.0.1:{free_port()}"
        channel.publish(KEY.release(version, {"fixture": digest}))
        args = ["fixture", "--pull", "--release-channel", channel.url, "--build-only"]
        env = {REGISTRY_ENV: owner}
    else:  # the channel answers 404
        owner = registry.address
        channel.releases.pop(version, None)
        args = pull_args(owner, channel, "--build-only")
    built = {
        tag for image in engine.images.list(name="flock-validator-fixture") for tag in image.tags
    }
    asked_before = len(registry.requests())
    result = run_py(repo, *args, **env)
    assert result.returncode == 3, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    build = "to build this checkout's image here instead, run it without --pull"
    if where == "unpublished":
        assert errors == [
            f"[run.py] error: release v{version} cannot be verified (not published): nothing "
            f"was run; {build}"
        ], result.stderr
    else:
        assert errors == [
            f"[run.py] error: published image {owner}/flock-validator-fixture@{digest} not "
            "pulled (the registry cannot be reached): nothing was run; check --registry / "
            f"{REGISTRY_ENV}, or {build}"
        ], result.stderr
    # Nothing built, nothing pulled by tag (the base included), nothing run.
    assert result.stdout == ""
    for said in ("building", "using image", "pulling the base", "starting fixture"):
        assert said not in result.stderr, result.stderr
    assert registry.requests()[asked_before:] == []
    now = {
        tag for image in engine.images.list(name="flock-validator-fixture") for tag in image.tags
    }
    assert now == built


def trickled_image() -> tuple[str, dict[str, bytes], str]:
    """(manifest digest, what a registry serves whole by path part, the layer's digest) of an
    image whose one layer a hostile registry trickles."""
    layer = "sha256:" + hashlib.sha256(b"never sent whole").hexdigest()
    rootfs = {"type": "layers", "diff_ids": ["sha256:" + "0" * 64]}
    config = json.dumps({"architecture": "amd64", "os": "linux", "rootfs": rootfs}).encode()
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "size": len(config),
            "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
        },
        "layers": [{
            "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
            "size": 10_000_000,
            "digest": layer,
        }],
    }).encode()  # fmt: skip
    return (
        "sha256:" + hashlib.sha256(manifest).hexdigest(),
        {"manifest": manifest, "config": config},
        layer,
    )


def test_a_trickling_registry_is_abandoned_and_the_engine_cancels_the_pull(
    engine, tmp_path, monkeypatch, capsys
):
    # The registry serves the signed digest's manifest and config, then a byte of the layer
    # every 0.2 s (before: the pull, and run.py --pull or the follower with it, waited for as
    # long as it kept trickling; a byte every 5 s was still being waited for after 150 s; and
    # the base's pull before a build had no deadline at all).
    monkeypatch.setattr(pulls, "PULL_BASE_S", 2.0)
    digest, served, layer = trickled_image()
    kinds = ["Content-Type: application/vnd.docker.distribution.manifest.v2+json",
             f"Docker-Content-Digest: {digest}"]  # fmt: skip

    def respond(request):
        if request.path == "/v2/":
            yield answer(b"{}", headers=["Docker-Distribution-API-Version: registry/2.0"])
        elif "/manifests/" in request.path:
            whole = answer(served["manifest"], headers=kinds)
            yield whole.split(b"\r\n\r\n")[0] + b"\r\n\r\n" if request.method == "HEAD" else whole
        elif request.path.endswith(layer):
            yield b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n"
            while True:
                yield b"\0"
                yield 0.2
        elif "/blobs/" in request.path:
            yield answer(served["config"])
        else:
            yield answer(b"", "404 Not Found")

    key = ReleaseKey()
    (tmp_path / "launcher" / "release").mkdir(parents=True)
    key.trust_in(tmp_path)
    with HostileServer(respond) as registry, LocalReleaseChannel() as channel:
        owner = f"127.0.0.1:{registry.port}/fv-attack"
        image = f"{owner}/flock-validator-fixture@{digest}"
        # run.py --pull's path: exit 3 in one line, nothing built in its place.
        manifest = ReleaseManifest(
            version="0.1.1", commit="0" * 40, journal_schema=1, images={"fixture": digest}
        )
        refused = within(PULL_WAIT, lambda: pull_release(engine, owner, "fixture", manifest))
        assert isinstance(refused, ReleaseRefused) and refused.exit_code == 3
        assert any(request.path.endswith(layer) for request in registry.requests)
        assert registry.cut_off.wait(30), "the engine went on reading the layer"
        slow = (
            r"the pull: abandoned after \d+ s, 0 bytes of its layers in: slower than 512 KiB/s "
            r"after its first 2 s"
        )
        abandoned = rf"\[run.py\] published image {re.escape(image)} not pulled \({slow}\): "
        pattern = rf"published image {re.escape(image)} not pulled \({slow}\): nothing was run; .*"
        assert re.fullmatch(pattern, str(refused)), str(refused)
        # The follower's: it stays on its release, and pulls again at its next look.
        channel.publish(key.release("0.1.1", {"fixture": digest}))
        worker, said = Worker(), []
        keys = trusted_keys(tmp_path / "launcher" / "release" / "release_keys.json")
        follower = Follower(
            engine, owner, "fixture", Channel(channel.url), "0.1.0", [worker],
            tell=said.append, keys=keys,
        )  # fmt: skip
        assert within(PULL_WAIT, follower.check) is None
        assert worker.moves == [] and follower.version == "0.1.0" and said == []
        said_follower = capsys.readouterr().err.splitlines()[-1]
        staying = r"staying on v0\.1\.0, pulled again at the next look"
        assert re.fullmatch(abandoned + staying, said_follower), said_follower
        # A build's base, pulled by tag from the same registry: abandoned and named.
        registry.cut_off.clear()
        base = f"127.0.0.1:{registry.port}/fv-attack/base:1"
        refused = within(PULL_WAIT, lambda: ensure_base(engine, base))
        assert isinstance(refused, LaunchError) and refused.exit_code == 3
        assert re.fullmatch(rf"base image '{re.escape(base)}' cannot be pulled \({slow}\); .*",
                            str(refused)), str(refused)  # fmt: skip
        assert registry.cut_off.wait(30), "the engine went on reading the base's layer"
    for pulled in (image, base):
        with pytest.raises(ImageNotFound):
            engine.images.get(pulled)


def progress(status: str, layer: str, current: object, total: object = None) -> dict:
    return {"status": status, "id": layer, "progressDetail": {"current": current, "total": total}}


def test_a_pull_earns_time_by_its_layers_bytes_never_past_their_sizes():
    rate = pulls.PULL_MIN_RATE
    pace = pulls.PullPace()
    pace.started -= pulls.PULL_BASE_S + 10  # 10 s past its base, nothing in yet
    assert "abandoned after" in (pace.over() or "")
    pace.add(progress("Downloading", "a", 5 * rate, 30 * rate))
    pace.add(progress("Downloading", "a", 20 * rate, 30 * rate))  # a layer's line replaces its last
    assert pace.over() is None and pace.done == 20 * rate  # 20 s earned
    pace.add(progress("Downloading", "b", 10**12, rate))  # more than its (signed) size: its size
    pace.add(progress("Extracting", "a", rate, 30 * rate))  # each step counts
    for noise in ([], "x", {"progressDetail": "x"}, progress("Downloading", "c", "9", 9),
                  progress("Downloading", "c", -5, 9), {"status": "Pulling fs layer"}):  # fmt: skip
        pace.add(noise)
    assert pace.done == 22 * rate
    pace.add(progress("Downloading", "d", 3 * rate))  # a size the engine does not know: as sent
    assert pace.done == 25 * rate


PULL_WAIT = 60  # seconds: a pull abandoned at 2 s ends long before; one never abandoned fails


def within(seconds: float, call):
    """What `call` returns, or the LaunchError it raises, in a thread: a test fails, never
    hangs, on a call that never ends."""
    ended = []

    def run() -> None:
        try:
            ended.append(call())
        except LaunchError as exc:
            ended.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert ended, f"still running after {seconds} s"
    return ended[0]


class Worker:
    def __init__(self) -> None:
        self.moves: list[str] = []

    def upgrade(self, image: str, why: str) -> None:
        self.moves.append(image)


# The generated rl service, its journal in a volume of this test.
RL_OVERRIDE = """
services:
  validator-rl:
    volumes: !override
      - rl-state:/data/state
volumes:
  rl-state:
    name: ${STATE_VOLUME}
"""


def test_the_releases_compose_file_runs_the_signed_image_not_the_tag(
    engine, repo, registry, local_build, substitute
):
    # The release's compose.yaml names each image by the digest it signed; the registry's tag
    # names another image by now. Any validator image will do under rl's name: the container
    # is created, not run.
    version = checkout_version(repo)
    name = f"{registry.address}/flock-validator-rl"
    digest = push(engine, local_build, f"{name}:{version}")
    push(engine, substitute, f"{name}:{version}")
    manifest = ReleaseManifest(
        version=version,
        commit="0" * 40,
        journal_schema=2,
        images={module: digest for module in ("fixture", "llm_judge", "lora", "rl")},
    )
    release = repo / "release-files"
    write_files(release, deploy_files(repo, manifest))
    (repo / "compose.release.yaml").write_text((release / "compose.yaml").read_text())
    (repo / "compose.pull-test.yaml").write_text(RL_OVERRIDE)
    project, volume = f"fvtest{uuid.uuid4().hex[:8]}", f"fv-test-pull-{uuid.uuid4().hex[:8]}"
    files = ["-p", project, "-f", "compose.release.yaml", "-f", "compose.pull-test.yaml"]
    env = launcher_env(TASK_IDS="1", VALIDATOR_IMAGE_REGISTRY=registry.address, STATE_VOLUME=volume)
    try:
        result = subprocess.run(
            ["docker", "compose", *files, "up", "--no-start", "validator-rl"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        container = engine.containers.get(f"{project}-validator-rl-1")
        assert container.image.id == engine.images.get(local_build).id
        assert container.image.id != substitute
        assert "load build definition" not in result.stdout + result.stderr  # no build ran
    finally:
        subprocess.run(["docker", "compose", *files, "down"], cwd=repo, env=env, timeout=120)
        engine.volumes.get(volume).remove(force=True)
        engine.images.remove(f"{name}@{digest}", force=True)


def test_the_released_image_is_named_from_the_checkout_version(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\n\n[project]\nname = "x"\nversion = "1.2.3"\n'
        '\n[tool.other]\nversion = "9"\n'
    )
    assert checkout_version(tmp_path) == "1.2.3"
    assert published_image(DEFAULT_REGISTRY, "llm_judge", "1.2.3") == (
        "ghcr.io/flock-io/flock-validator-llm_judge:1.2.3"
    )
    assert published_image("127.0.0.1:5000/me/", "rl", "1.2.3") == (
        "127.0.0.1:5000/me/flock-validator-rl:1.2.3"
    )
    for bad in ("https://ghcr.io/x", "ghcr.io/X Y", ""):
        with pytest.raises(UsageError, match="give a registry and owner"):
            published_image(bad, "rl", "1.2.3")


def test_a_release_tag_must_be_the_checkout_version_on_a_base_by_digest():
    version = checkout_version(REPO_ROOT)
    pinned = "mambaorg/micromamba:2.3.3-cuda12.6.3-ubuntu22.04@sha256:" + "d" * 64
    outputs = release_outputs(REPO_ROOT, "rl", "FLock-io", f"v{version}", pinned)
    assert outputs["repository"] == "ghcr.io/flock-io/flock-validator-rl"
    assert outputs["version"] == version
    assert outputs["base_image"] == pinned
    # The label a release carries is the one run.py's build of this checkout on that base carries.
    assert outputs["source_hash"] == source_hash(BuildSpec("rl", REPO_ROOT, pinned))
    with pytest.raises(UsageError, match=f"is not v{version}"):
        release_outputs(REPO_ROOT, "rl", "flock-io", "v0.0.0-not-this", pinned)
    # A release never builds on a base named by tag (a pull request's build may, pushing nothing).
    with pytest.raises(UsageError, match="is named by tag: pin it by digest first"):
        release_outputs(REPO_ROOT, "rl", "FLock-io", f"v{version}", pinned.split("@")[0])
    assert release_outputs(REPO_ROOT, "rl", "FLock-io", None, pinned.split("@")[0])
