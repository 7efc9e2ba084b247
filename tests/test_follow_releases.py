"""`run.py MODULE --pull --follow-releases` (launcher/release/follow.py): a worker moves
to a newer verified release of its major version between assignments, its journal carried over,
nothing lost or submitted twice (end to end against a local registry, a stand-in for the releases'
channel and the Fed Ledger simulator); a release that does not verify, or whose journal schema a
rollback could not read, is refused in one line and the worker stays."""

from __future__ import annotations

import io
import json
import subprocess
import threading
import uuid

import docker
import pytest
from docker.errors import ImageNotFound

from devkit.docker_env import launcher_env, make_module_repo, run_py_command, unique_volumes
from devkit.local_registry import LocalRegistry, free_port, push_image
from devkit.release_channel import LocalReleaseChannel, ReleaseKey
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import wait_for
from launcher.errors import UsageError
from launcher.release.channel import Channel
from launcher.release.follow import INTERVAL_ENV, Follower, check_options, interval
from launcher.release.manifest import FIX, trusted_keys
from launcher.release.published import checkout_version
from validator.state.store import SCHEMA_VERSION

DIGEST = "sha256:" + "e" * 64
LABEL = "org.flock-validator.module=fixture"
WAIT = 300
WAIT = 300


def test_follow_releases_needs_pull_and_no_check_and_a_sane_interval():
    check_options(pull=True, follow=True, check_file=None)
    with pytest.raises(UsageError, match="give --pull too"):
        check_options(pull=False, follow=True, check_file=None)
    with pytest.raises(UsageError, match="without --follow-releases"):
        check_options(pull=True, follow=True, check_file="input.json")
    assert interval({}) == 3600.0 and interval({INTERVAL_ENV: "0.5"}) == 0.5
    for bad in ("0", "-1", "soon", "nan"):
        with pytest.raises(UsageError, match=INTERVAL_ENV):
            interval({INTERVAL_ENV: bad})


class Worker:
    def __init__(self) -> None:
        self.moves: list[tuple[str, str]] = []

    def upgrade(self, image: str, why: str) -> None:
        self.moves.append((image, why))


def test_a_release_that_does_not_verify_or_would_strand_a_rollback_is_refused_once(tmp_path):
    key, stranger = ReleaseKey(), ReleaseKey()
    (tmp_path / "launcher" / "release").mkdir(parents=True)
    key.trust_in(tmp_path)
    worker, said = Worker(), []
    with LocalReleaseChannel() as channel:
        channel.publish(key.release("0.1.0", {"fixture": DIGEST}))
        channel.publish(stranger.release("0.1.1", {"fixture": DIGEST}))
        newer = key.release("0.1.2", {"fixture": DIGEST}, journal_schema=SCHEMA_VERSION + 1)
        channel.publish(newer)
        channel.publish(key.release("1.0.0", {"fixture": DIGEST}))  # another major: not followed
        keys = trusted_keys(tmp_path / "launcher" / "release" / "release_keys.json")
        follower = Follower(
            None, "127.0.0.1:9", "fixture", Channel(channel.url), "0.1.0", [worker],
            tell=said.append, keys=keys,
        )  # fmt: skip
        assert follower.check() is None
        assert follower.check() is None  # looked again: nothing said twice
    assert worker.moves == []
    assert said == [
        "not following release v0.1.2: release v0.1.2 keeps its journal at schema "
        f"{SCHEMA_VERSION + 1}, newer than v0.1.0's {SCHEMA_VERSION}: a rollback could not read "
        "it; upgrade by hand (docs/upgrading.md)",
        "not following release v0.1.1: release v0.1.1 is signed by key "
        f"'{stranger.id}', which this checkout does not trust; {FIX}",
    ]


def test_the_follower_keeps_looking_after_a_look_that_failed(tmp_path):
    # A look that fails past what it expects (here the engine is gone while a verified release
    # waits) is one line, and the next look comes: an exception that ended the thread
    # would stop the process following releases, silently.
    key = ReleaseKey()
    (tmp_path / "launcher" / "release").mkdir(parents=True)
    key.trust_in(tmp_path)
    gone = docker.DockerClient(base_url=f"tcp://127.0.0.1:{free_port()}", version="1.41")
    said, stop = [], threading.Event()
    with LocalReleaseChannel() as channel:
        channel.publish(key.release("0.1.1", {"fixture": DIGEST}))
        follower = Follower(
            gone, "127.0.0.1:9", "fixture", Channel(channel.url), "0.1.0", [Worker()],
            tell=said.append, keys=trusted_keys(tmp_path / "launcher" / "release" /
            "release_keys.json"),
        )  # fmt: skip
        thread = follower.start(0.05, stop)

        def looks() -> int:
            return sum("/api/v3/" in path for path in channel.requests)  # the releases' list

        try:
            wait_for(lambda: looks() >= 3, 30, "three looks")
        finally:
            stop.set()
            thread.join(10)
    assert said[0].startswith("following releases: this look failed (ConnectionError: ")
    assert said[0].endswith("; looking again later") and "\n" not in said[0]
    assert follower.version == "0.1.0"


def next_patch(version: str) -> str:
    major, minor, patch = version.split(".")
    return f"{major}.{minor}.{int(patch) + 1}"


def test_a_worker_moves_to_the_next_release_between_assignments(tmp_path, engine):
    repo = make_module_repo(tmp_path / "repo")
    key = ReleaseKey()
    key.trust_in(repo)
    built = subprocess.run(
        run_py_command(repo, "fixture", "--build-only"),
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert built.returncode == 0, built.stderr
    first = built.stdout.strip().splitlines()[-1]
    # The next release's image: the same code under another digest.
    recipe = f"FROM {first}\nLABEL org.flock-validator.test-release=next\n".encode()
    second_name = f"fv-test-next-release:{uuid.uuid4().hex[:8]}"
    second, _ = engine.images.build(fileobj=io.BytesIO(recipe), rm=True, tag=second_name)
    version = checkout_version(repo)
    configs = tmp_path / "configs"
    configs.mkdir()
    # slow/held waits for this file (in the mounted configs) before it is scored.
    (configs / "fixture.json").write_text(
        json.dumps({"release_file": "/app/configs/release", "slow_seconds": 600})
    )
    volumes = unique_volumes()
    log = tmp_path / "run.log"
    tasks = [task(1, ["slow/held", "ok/b", "ok/c"])]
    (tmp_path / "registry-data").mkdir()
    pulled: list[str] = []  # what run.py pulls, removed after
    try:
        with (
            LocalRegistry(tmp_path / "registry-data") as registry,
            LocalReleaseChannel() as channel,
            Simulator({"tasks": tasks}, tmp_path) as sim,
        ):
            name = f"{registry.address}/flock-validator-fixture"
            old = push_image(engine, first, f"{name}:{version}")
            new = push_image(engine, second.id, f"{name}:{next_patch(version)}")
            pulled += [f"{name}@{old}", f"{name}@{new}"]
            channel.publish(key.release(version, {"fixture": old}))
            args = [
                "fixture", "--gpus", "none", "--task_ids", "1", "--api-url", sim.api_url,
                "--assignment-lookup-interval", "0.2", "--time-sleep", "0.3",
                "--config-dir", str(configs), "--max-assignments", "2", *volumes,
                "--pull", "--registry", registry.address, "--release-channel", channel.url,
                "--follow-releases",
            ]  # fmt: skip
            with log.open("w") as out:
                process = subprocess.Popen(
                    run_py_command(repo, *args),
                    env=launcher_env(**{INTERVAL_ENV: "0.5"}),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            try:
                wait_for(
                    lambda: any(a for a in sim.state()["assignments"]), WAIT, "slow/held handed out"
                )
                channel.publish(key.release(next_patch(version), {"fixture": new}))
                moving = "after the assignment in progress"
                wait_for(lambda: moving in log.read_text(), WAIT, "a move")
                assert sim.submissions() == []  # still held in its scoring: it is finished first
                (configs / "release").write_text("")
                process.wait(timeout=WAIT)
            finally:
                if process.poll() is None:  # a failed wait: nothing of the run outlives the test
                    process.kill()
                    process.wait()
                    mine = {"label": LABEL, "name": volumes[1]}  # named after its journal
                    for left in engine.containers.list(all=True, filters=mine):
                        left.remove(force=True)
            state = sim.state()
            report = subprocess.run(
                run_py_command(repo, "report", "fixture", "--json", "--state-volume", volumes[1]),
                env=launcher_env(),
                capture_output=True,
                text=True,
                timeout=WAIT,
            )
    finally:
        for reference in pulled:
            try:
                engine.images.remove(reference, force=True)
            except ImageNotFound:
                pass  # never pulled: the run ended before
        engine.images.remove(second_name, force=True)
        for volume in engine.volumes.list(filters={"name": volumes[1]}):
            volume.remove(force=True)  # the journal's; the fixture module has no HF cache volume
    output = log.read_text()
    assert process.returncode == 0, output
    # Each assignment handed out once, submitted once, completed: nothing lost, nothing twice.
    assert sorted(s["assignment_id"] for s in state["submissions"]) == sorted(
        a["id"] for a in state["assignments"]
    )
    assert len(state["submissions"]) == 3
    assert {s["status"] for s in state["submissions"]} == {"completed"}
    # The held assignment finished in the old release; the new one took the rest.
    assert f"[run.py] starting fixture in {name}@{old} " in output
    assert output.count(f"starting it on {name}@{new}") == 1, output
    held = next(a["id"] for a in state["assignments"] if "slow/held" in json.dumps(a))
    assert state["submissions"][0]["assignment_id"] == held  # submitted before the move
    assert "then killed" not in output
    # One journal across both releases.
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["records"] == 3
