"""Moves that lose nothing, through run.py, a real Docker engine and the Fed Ledger simulator: a
journal's move from a volume named after a GPU (launcher/fleet/volumes.py), a release switch under
--follow-releases (launcher/release/follow.py) and the launcher's own death, each killed (kill -9)
at one step, or given a damaged journal, then started again as an operator would.

Counted in the simulator, which saw every call: lost (handed out, never finished), sent twice (a
result the API took twice, or an update sent again for one it had taken) and starts that needed a
person (a start that ended by itself with an error before everything was submitted). A kill at a
step is FLOCK_FAULT_KILL_AT=<step> (launcher/engine/fault_hook.py): the launcher kills itself with
SIGKILL there, so each step is a trial of its own rather than a race. The container's own steps of a
move are killed in tests/test_journal_move.py.

They need the engine, so they run with the Docker tests, one after another (the marker below),
and print their figures with the fault suite's.
"""

from __future__ import annotations

import io
import json
import subprocess
import uuid
from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from devkit.docker_env import launcher_env, make_module_repo, run_py_command
from devkit.local_registry import LocalRegistry, push_image
from devkit.release_channel import LocalReleaseChannel, ReleaseKey
from devkit.simulator.process import Simulator, task
from devkit.validator_cli import wait_for
from launcher.release.channel import Channel
from launcher.release.follow import INTERVAL_ENV, Follower
from launcher.release.manifest import trusted_keys
from launcher.release.published import checkout_version
from tests.faults.figures import record
from tests.faults.ledger import Ledger
from tests.faults.moves import (
    LOOP,
    WAIT,
    Starts,
    clean,
    counted,
    handed_out,
    into_volume,
    scored_journal,
)
from tests.helpers.damaged_journals import DAMAGES

# The test module under a name of its own: these trials run beside the other Docker tests, whose
# checks count the fixture module's images and containers (scripts/test_suites.sh).
MODULE = "fixture_moves"

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def key() -> ReleaseKey:
    return ReleaseKey()


@pytest.fixture(scope="module")
def repo(engine, tmp_path_factory, key) -> Path:
    repo = make_module_repo(tmp_path_factory.mktemp("repo"), MODULE)
    key.trust_in(repo)  # before the build: the image is this copy's
    return repo


@pytest.fixture(scope="module")
def image(engine, repo) -> str:
    built = subprocess.run(
        run_py_command(repo, MODULE, "--build-only"),
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    return built.stdout.strip().splitlines()[-1]


def names() -> tuple[str, str]:
    """An old-named journal volume (compose.gpus.yaml's name before) and a worker's."""
    tag = uuid.uuid4().hex[:8]
    return f"flock-validator-{MODULE}-gpu{tag}-state", f"fv-test-state-{tag}"


def all_finished(sim: Simulator, expected: int):
    def done() -> bool:
        ledger = Ledger.of(sim)
        return len(ledger.assignments) >= expected and not ledger.unfinished()

    return done


@pytest.mark.parametrize("step", ["move:started", "move:done", "move:removed"])
def test_a_move_killed_at_each_step_finishes_on_the_next_start(engine, repo, image, tmp_path, step):
    old, new = names()
    try:
        with Simulator({"tasks": [task(1, ["ok/a", "ok/b"])]}, tmp_path) as sim:
            journal = scored_journal(tmp_path / "old", handed_out(sim, 2), MODULE)
            into_volume(engine, image, old, journal.parent)
            args = [MODULE, "--gpus", "none", "--task_ids", "1", "--api-url", sim.api_url]
            starts = Starts(repo, tmp_path, [*args, *LOOP, "--state-volume", new])
            starts.killed_at(step)
            second = starts.until(all_finished(sim, 2))
            count = counted(sim, 2, starts.stuck)
        record(f"kill -9 of run.py at {step} of a journal's move, then a start", str(count))
        assert (count.lost, count.twice, count.stuck) == (0, 0, 0), starts.output()
        assert not engine.volumes.list(filters={"name": old}), second  # moved, then removed
        if step != "move:removed":
            assert f"the journal of {old} (compose.gpus.yaml's name before)" in second
    finally:
        clean(engine, [f"{new}-0", f"{old}-move"], [old, new])


def test_a_move_into_a_journal_holding_the_same_ids_sends_each_once(engine, repo, image, tmp_path):
    # What a move cut short used to leave, and what "run --state-volume OLD once" then sent
    # twice: both volumes hold the same two results.
    old, new = names()
    try:
        with Simulator({"tasks": [task(1, ["ok/a", "ok/b"])]}, tmp_path) as sim:
            journal = scored_journal(tmp_path / "old", handed_out(sim, 2), MODULE)
            into_volume(engine, image, old, journal.parent)
            into_volume(engine, image, new, journal.parent)
            args = [MODULE, "--gpus", "none", "--task_ids", "1", "--api-url", sim.api_url]
            starts = Starts(repo, tmp_path, [*args, *LOOP, "--state-volume", new])
            output = starts.until(all_finished(sim, 2))
            count = counted(sim, 2, starts.stuck)
        record("a move into a journal that holds the same ids", str(count))
        assert (count.lost, count.twice, count.stuck) == (0, 0, 0), output
        assert f"is merged by assignment into the journal in {new}" in output
        assert "2 results to submit and 0 assignments to score" in output
    finally:
        clean(engine, [f"{new}-0"], [old, new])


def test_damaged_old_journals_move_their_readable_rows_and_are_kept(engine, repo, image, tmp_path):
    # Three workers, each given an old journal damaged in its own way (in the order of the
    # volumes' names): truncated, of a newer schema, holding a row with a NULL id.
    tag = uuid.uuid4().hex[:8]
    olds = [f"flock-validator-{MODULE}-gpu{tag}{letter}-state" for letter in "abc"]
    new = f"fv-test-state-{tag}"
    submissions = [f"ok/{n}" for n in range(6)]
    try:
        with Simulator({"tasks": [task(1, submissions)]}, tmp_path) as sim:
            for old, damage in zip(olds, DAMAGES, strict=True):
                journal = scored_journal(tmp_path / old, handed_out(sim, 2), MODULE)
                DAMAGES[damage][0](journal)
                into_volume(engine, image, old, journal.parent)
            args = [MODULE, "--workers", "3", "--task_ids", "1", "--api-url", sim.api_url]
            starts = Starts(repo, tmp_path, [*args, *LOOP, "--state-volume", new])
            first = starts.until(all_finished(sim, 6))
            before = len(sim.lookups())
            # The next start: nothing sent again, nobody needed; each kept volume said again.
            # Each worker submits what it holds before its first lookup: one from each, done.
            again = starts.until(lambda: len({r["agent"] for r in sim.lookups()[before:]}) == 3)
            count = counted(sim, 6, starts.stuck)
        record(
            "old journals truncated, of a newer schema, with a NULL id, moved by 3 workers; "
            "then a start",
            str(count),
        )
        assert (count.lost, count.twice, count.stuck) == (0, 0, 0), starts.output()
        for old, damage in zip(olds, DAMAGES, strict=True):
            kept = [line for line in first.splitlines() if f"the journal of {old} " in line]
            assert len(kept) == 1 and DAMAGES[damage][1] in kept[0], first
            assert "its 2 readable rows are moved into" in kept[0]
            assert f"the rest stays in volume {old}" in kept[0]
            assert engine.volumes.list(filters={"name": old}), f"{old} removed"
            assert sum(f"the journal of {old} " in line for line in again.splitlines()) == 1
    finally:
        clean(engine, [f"{new}-{k}" for k in range(3)], [*olds, new])


def test_a_launcher_killed_leaves_a_worker_the_next_start_takes_over(engine, repo, image, tmp_path):
    _, new = names()
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / f"{MODULE}.json").write_text(json.dumps({"slow_seconds": 3}))
    try:
        with Simulator({"tasks": [task(1, ["slow/a", "ok/b", "ok/c"])]}, tmp_path) as sim:
            args = [MODULE, "--gpus", "none", "--task_ids", "1", "--api-url", sim.api_url]
            args += [*LOOP, "--state-volume", new, "--config-dir", str(configs)]
            starts = Starts(repo, tmp_path, args)
            process, _ = starts.start()
            try:  # killed in the held assignment's scoring, its validator left running
                wait_for(lambda: len(sim.state()["assignments"]) >= 1, WAIT, "an assignment")
            finally:
                process.kill()
                process.wait()
            assert engine.containers.get(f"{new}-0").status == "running"
            output = starts.until(all_finished(sim, 3))
            count = counted(sim, 3, starts.stuck)
        record("kill -9 of run.py while its validator scores, then a start", str(count))
        assert (count.lost, count.twice, count.stuck) == (0, 0, 0), output
        assert f"{new}-0: a validator left running by a run.py that ended" in output
    finally:
        clean(engine, [f"{new}-0"], [new])


def next_patch(version: str) -> str:
    major, minor, patch = version.split(".")
    return f"{major}.{minor}.{int(patch) + 1}"


@pytest.fixture(scope="module")
def releases(engine, image, repo, tmp_path_factory):
    """A local registry holding the checkout's release and the next one (the same code under
    another digest): (registry, repository, {version: digest})."""
    recipe = f"FROM {image}\nLABEL org.flock-validator.test-release=next\n".encode()
    second_name = f"fv-test-next-release:{uuid.uuid4().hex[:8]}"
    second, _ = engine.images.build(fileobj=io.BytesIO(recipe), rm=True, tag=second_name)
    version = checkout_version(repo)
    folder = tmp_path_factory.mktemp("registry")
    pulled = []
    try:
        with LocalRegistry(folder) as registry:
            name = f"{registry.address}/flock-validator-{MODULE}"
            digests = {
                version: push_image(engine, image, f"{name}:{version}"),
                next_patch(version): push_image(engine, second.id, f"{name}:{next_patch(version)}"),
            }
            pulled += [f"{name}@{digest}" for digest in digests.values()]
            yield registry, name, digests
    finally:
        for reference in [*pulled, second_name]:
            try:
                engine.images.remove(reference, force=True)
            except ImageNotFound:
                pass


@pytest.mark.parametrize("step", ["switch:pulled", "switch:asked", "switch:stopped"])
def test_a_release_switch_killed_at_each_step_resumes_the_release_on_the_next_start(
    engine, repo, key, releases, tmp_path, step
):
    registry, name, digests = releases
    first, second = sorted(digests, key=lambda v: tuple(map(int, v.split("."))))
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / f"{MODULE}.json").write_text(json.dumps({"slow_seconds": 2}))
    old, new = names()
    try:
        with (
            LocalReleaseChannel() as channel,
            Simulator({"tasks": [task(1, ["slow/a", "ok/b", "ok/c"])]}, tmp_path) as sim,
        ):
            channel.publish(key.release(first, {MODULE: digests[first]}))
            args = [MODULE, "--gpus", "none", "--task_ids", "1", "--api-url", sim.api_url]
            args += [*LOOP, "--state-volume", new, "--config-dir", str(configs), "--pull"]
            args += ["--registry", registry.address, "--release-channel", channel.url]
            starts = Starts(repo, tmp_path, [*args, "--follow-releases"], **{INTERVAL_ENV: "0.5"})

            def publish_once_working() -> None:
                wait_for(lambda: sim.state()["assignments"], WAIT, "an assignment")
                channel.publish(key.release(second, {MODULE: digests[second]}))

            starts.killed_at(step, publish_once_working)
            output = starts.until(all_finished(sim, 3))
            count = counted(sim, 3, starts.stuck)
        record(f"kill -9 of run.py at {step} of a release switch, then a start", str(count))
        assert (count.lost, count.twice, count.stuck) == (0, 0, 0), starts.output()
        # The restart looked at once: it resumed the release it followed, verified again.
        assert f"following releases: starting on release v{second}" in output
        assert f"starting {MODULE} in {name}@{digests[second]} " in output
        assert f"{name}@{digests[first]}" not in output.split("following releases:", 1)[1]
    finally:
        clean(engine, [f"{new}-0"], [old, new])


def test_a_release_signing_the_running_image_is_followed_without_a_move(
    engine, repo, key, releases
):
    registry, name, digests = releases
    first, second = sorted(digests, key=lambda v: tuple(map(int, v.split("."))))
    said, moves = [], []

    class Worker:
        def upgrade(self, image: str, why: str) -> None:
            moves.append(image)

    with LocalReleaseChannel() as channel:
        # The newest release signs the image running; the one before it, another image: the
        # follower takes the newest, without a move, and never the older one after it.
        channel.publish(key.release(second, {MODULE: digests[second]}))
        channel.publish(key.release(next_patch(second), {MODULE: digests[first]}))
        follower = Follower(
            engine, registry.address, MODULE, Channel(channel.url), first, [Worker()],
            tell=said.append, keys=trusted_keys(repo / "launcher" / "release" /
            "release_keys.json"),
        )  # fmt: skip
        assert follower.start_on(f"{name}@{digests[first]}") == f"{name}@{digests[first]}"
        assert follower.check() is None  # looked again: nothing newer
    assert moves == [] and follower.version == next_patch(second)
    assert said[-1].endswith(
        f"signs the image already running, {name}@{digests[first]}: nothing to move"
    )
