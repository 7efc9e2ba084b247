"""What the trials of tests/faults/test_moves.py share: run.py started again and again on one
journal as an operator would, journals under an earlier volume name made through the journal's
own code from assignments the Fed Ledger simulator handed out, and the count of a trial."""

from __future__ import annotations

import io
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import NotFound

from devkit.docker_env import launcher_env, run_py_command
from devkit.simulator.process import Simulator
from devkit.validator_cli import API_KEY
from launcher.engine.fault_hook import KILL_AT_ENV
from tests.faults.ledger import Ledger
from validator.ledger.client import FedLedgerClient
from validator.spec import STATE_PATH
from validator.state.journal import Journal

WAIT = 120
UID = 10001  # the image's user, who owns its state volume
LOOP = ["--assignment-lookup-interval", "0.2", "--time-sleep", "0.3"]
STARTED = "[run.py] starting "  # a worker's container started (launcher/engine/supervisor.py)


@dataclass
class Count:
    lost: int  # handed out, never finished in the simulator
    twice: int  # a result the API took twice, or an update sent again for one it had taken
    stuck: int  # starts that stopped before everything was submitted: a person needed

    def __str__(self) -> str:
        return f"{self.lost} lost, {self.twice} sent twice, {self.stuck} starts needing a person"


def counted(sim: Simulator, expected: int, stuck: int) -> Count:
    ledger = Ledger.of(sim)
    unfinished = ledger.unfinished() + ["?"] * max(0, expected - len(ledger.assignments))
    return Count(len(unfinished), len(ledger.doubles()) + len(ledger.repeats()), stuck)


class Starts:
    """`python run.py ...` started on one journal, one start at a time, each start's output in
    a log of its own; counts the starts that ended by themselves with an error."""

    def __init__(self, repo: Path, logs: Path, args: list[str], **env: str) -> None:
        self.repo, self.logs, self.args, self.env = repo, logs, args, env
        self.stuck = 0
        self.outputs: list[str] = []

    def start(self, kill_at: str | None = None) -> tuple[subprocess.Popen, Path]:
        env = launcher_env(**self.env, **({KILL_AT_ENV: kill_at} if kill_at else {}))
        log = self.logs / f"start-{len(self.outputs)}.log"
        self.outputs.append("")
        with log.open("w") as out:
            process = subprocess.Popen(
                run_py_command(self.repo, *self.args),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        return process, log

    def killed_at(self, step: str, before: Callable[[], None] | None = None) -> str:
        """A start that kills itself at `step` (the hook); `before` is done while it runs."""
        process, log = self.start(step)
        try:
            if before is not None:
                before()
            code = process.wait(timeout=WAIT)
        finally:
            _end(process)
        output = self.outputs[-1] = log.read_text()
        assert code == -signal.SIGKILL, f"not killed at {step} (exit {code}): {output}"
        return output

    def until(self, done: Callable[[], bool], *, then: Callable | None = None) -> str:
        """A start that runs until `done()`, then is stopped as an operator stops it (SIGTERM);
        one that ends before by itself with an error needed a person."""
        process, log = self.start()
        deadline = time.monotonic() + WAIT

        def running() -> bool:
            # Its worker started: what an earlier start left may have finished everything
            # already, and a start stopped before it is up proves nothing.
            return STARTED in log.read_text()

        try:
            while (
                process.poll() is None
                and not (running() and done())
                and time.monotonic() < deadline
            ):
                if then is not None and then():
                    then = None
                time.sleep(0.2)
            ended_by_itself = process.poll() is not None
            if not ended_by_itself:
                process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
        finally:
            _end(process)
        output = self.outputs[-1] = log.read_text()
        if code != 0:
            self.stuck += 1
        return output

    def output(self) -> str:
        return "".join(self.outputs)


def _end(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


def handed_out(sim: Simulator, count: int) -> list:
    """`count` assignments of task 1, handed out to the tests' key as to a validator."""
    client = FedLedgerClient(API_KEY, sim.api_url, retries=0)
    found = [client.request_assignment("1") for _ in range(count)]
    assert all(hasattr(a, "id") for a in found), found
    return found


def scored_journal(state: Path, assignments: list, module: str) -> Path:
    """A journal holding each assignment scored by `module`, not yet submitted, as a validator
    stopped while the API was down leaves it."""
    journal = Journal(state)
    try:
        for a in assignments:
            entry = journal.receive(a.id, module, "1", a.module_input())
            entry = journal.begin_scoring(entry)
            repo = entry.input["hg_repo_id"]
            metrics = {"loss": len(repo) / 100, "repo_length": len(repo), "context_length": 0}
            journal.scored(entry, metrics)
    finally:
        journal.close()
    return state / "journal.sqlite3"


def into_volume(engine: docker.DockerClient, image: str, volume: str, state: Path) -> None:
    """The state dir's files into `volume`, owned by the image's user, as its validator left
    them there."""
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for path in sorted(state.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(state)))
            info.uid = info.gid = UID
            info.uname = info.gname = ""
            if path.is_file():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)
    holder = engine.containers.create(
        image, volumes={volume: {"bind": STATE_PATH, "mode": "rw"}}, entrypoint=["true"]
    )
    try:
        assert holder.put_archive(STATE_PATH, archive.getvalue())
    finally:
        holder.remove(force=True)


def clean(engine: docker.DockerClient, containers: list[str], volumes: list[str]) -> None:
    for name in containers:
        try:
            engine.containers.get(name).remove(force=True)
        except NotFound:
            pass
    for name in volumes:
        for volume in engine.volumes.list(filters={"name": name}):
            for user in engine.containers.list(all=True, filters={"volume": volume.name}):
                user.remove(force=True)  # e.g. a move's container a killed start left
            volume.remove(force=True)
