"""launcher/fleet/run.py without a Docker engine: a stand-in client whose containers, one per
worker name, exit with the codes a test gives. Each worker restarts on its own, one that ends
for good is one line and the others go on, a stop reaches every worker at once."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from docker.errors import APIError, NotFound

from launcher.engine.containers import LABEL_LAUNCHER, ContainerSpec
from launcher.engine.supervisor import KILLED_EXIT, STOPPED_EXIT, Supervisor
from launcher.errors import LaunchError
from launcher.fleet.plan import FleetOptions, plan
from launcher.fleet.run import WORKER_ENV, FleetSupervisor, worker_containers
from validator.errors import ExitCode

WAIT = 30  # seconds a stand-in container waits for a stop before the test fails


class FakeContainer:
    def __init__(self, name: str, code: int | None, output: list[bytes], stops) -> None:
        self.name = name
        self.code = code  # None: runs until stopped
        self.output = output
        self.stops = stops
        self.ended = threading.Event()
        self.stopped_with: int | None = None
        self.removed = False

    def attach(self, **_kwargs):
        return iter([(chunk, None) for chunk in self.output])

    def start(self) -> None:
        pass

    def wait(self) -> dict:
        if self.code is None:
            assert self.ended.wait(WAIT), f"{self.name} was never stopped"
            return {"StatusCode": STOPPED_EXIT}
        return {"StatusCode": self.code}

    def stop(self, timeout: int) -> None:
        self.stopped_with = timeout
        self.stops.arrive()  # returns once every worker's stop has begun
        self.ended.set()

    def kill(self) -> None:
        self.ended.set()

    def remove(self, force: bool) -> None:
        self.removed = force


class Stops:
    """Every container's stop waits here for the others': passes only if they run at once."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=WAIT)
        self.broken = False

    def arrive(self) -> None:
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            self.broken = True


class FakeContainers:
    def __init__(self, codes: dict[str, list[int | None]], output=(), stops=None) -> None:
        self.codes = {name: list(c) for name, c in codes.items()}
        self.output = list(output)
        self.stops = stops or Stops(1)
        self.created: list[FakeContainer] = []
        self.kwargs: dict[str, dict] = {}
        self.lock = threading.Lock()

    def create(self, **kwargs) -> FakeContainer:
        with self.lock:
            name = kwargs["name"]
            self.kwargs[name] = kwargs
            container = FakeContainer(name, self.codes[name].pop(0), self.output, self.stops)
            self.created.append(container)
            return container

    def of(self, name: str) -> list[FakeContainer]:
        return [c for c in self.created if c.name == name]


class FakeClient:
    def __init__(self, codes, output=(), stops=None) -> None:
        self.containers = FakeContainers(codes, output, stops)

    def info(self) -> dict:
        return {"LoggingDriver": "json-file"}


def fleet_of(count: int, task_ids: str = "1,2,3,4"):
    options = FleetOptions("rl", None, False, None, count, None, task_ids, None, 9112)
    base = ContainerSpec(
        image="flock-validator-rl:test",
        module="rl",
        inner_args=["--task_ids", task_ids],
        secrets={},
        config_dir=Path("."),
        volumes={"flock-validator-rl-state": "/data/state", "flock-validator-hf-cache": "/hf"},
        gpus="none",
    )
    return worker_containers(base, plan(options))


def test_each_worker_gets_its_own_name_journal_share_and_port_and_shares_the_cache():
    client = FakeClient({f"flock-validator-rl-{k}": [ExitCode.OK] for k in range(2)})
    assert FleetSupervisor(client, fleet_of(2), 0, 30).run() == ExitCode.OK  # type: ignore[arg-type]
    first, second = (client.containers.kwargs[f"flock-validator-rl-{k}"] for k in range(2))
    assert first["command"][-4:] == ["--shard", "0/2", "--http-port", "9112"]
    assert second["command"][-4:] == ["--shard", "1/2", "--http-port", "9122"]
    assert set(first["volumes"]) - {str(Path(".").resolve())} == {
        "flock-validator-rl-state",
        "flock-validator-hf-cache",
    }
    assert set(second["volumes"]) - {str(Path(".").resolve())} == {
        "flock-validator-rl-state-1",
        "flock-validator-hf-cache",
    }
    assert first["environment"][WORKER_ENV] == "flock-validator-rl-0"
    assert second["environment"][WORKER_ENV] == "flock-validator-rl-1"


def test_a_worker_that_ends_for_good_is_one_line_and_the_others_go_on(capsys):
    client = FakeClient(
        {
            "flock-validator-rl-0": [ExitCode.RESTART, ExitCode.RESTART, ExitCode.OK],
            "flock-validator-rl-1": [ExitCode.OPERATOR],
            "flock-validator-rl-2": [KILLED_EXIT, ExitCode.OK],
        }
    )
    code = FleetSupervisor(client, fleet_of(3), 0, 30).run()  # type: ignore[arg-type]
    assert code == ExitCode.OPERATOR  # the one that did not end well
    assert len(client.containers.of("flock-validator-rl-0")) == 3  # its own restarts
    assert len(client.containers.of("flock-validator-rl-1")) == 1  # never restarted
    # Killed from outside (OOM, docker kill): a fleet's worker starts again on its own.
    assert len(client.containers.of("flock-validator-rl-2")) == 2
    assert all(c.removed for c in client.containers.created)
    err = capsys.readouterr().err
    assert err.count("worker flock-validator-rl-0: the validator asked for a restart") == 2
    assert "worker flock-validator-rl-0: the validator finished (exit 0)" in err
    assert "worker flock-validator-rl-1: the validator needs operator action (exit 3)" in err
    assert "worker flock-validator-rl-2: the validator was killed (exit 137); restarting" in err
    assert "all workers ended: flock-validator-rl-0 exit 0, flock-validator-rl-1 exit 3" in err


def test_a_stop_reaches_every_worker_at_once_with_the_grace(capsys):
    names = [f"flock-validator-rl-{k}" for k in range(3)]
    stops = Stops(3)
    client = FakeClient({name: [None] for name in names}, stops=stops)
    fleet = FleetSupervisor(client, fleet_of(3), 0, 45)  # type: ignore[arg-type]
    running = threading.Thread(target=lambda: setattr(fleet, "code", fleet.run()))
    running.start()
    while len(client.containers.created) < 3 or any(s.container is None for s in fleet.supervisors):
        running.join(0.05)
    fleet.handle_signal(signal.SIGTERM, None)
    running.join(WAIT)
    assert not running.is_alive()
    # The three stops were under way together: the total wait is one grace period, not three.
    assert not stops.broken
    assert [c.stopped_with for c in client.containers.created] == [45, 45, 45]
    assert fleet.code == ExitCode.OK  # type: ignore[attr-defined]
    assert "SIGTERM: stopping 3 worker(s)" in capsys.readouterr().err


def test_worker_output_lines_carry_its_name_whole(capsysbinary):
    client = FakeClient(
        {"flock-validator-rl-0": [ExitCode.OK], "flock-validator-rl-1": [ExitCode.OK]},
        output=[b"scoring as", b"signment 7\nsubmit", b"ted\n", b"no newline at the end"],
    )
    FleetSupervisor(client, fleet_of(2), 0, 30).run()  # type: ignore[arg-type]
    lines = capsysbinary.readouterr().out.splitlines()
    for name in ("flock-validator-rl-0", "flock-validator-rl-1"):
        assert [line for line in lines if line.startswith(f"[{name}] ".encode())] == [
            f"[{name}] scoring assignment 7".encode(),
            f"[{name}] submitted".encode(),
            f"[{name}] no newline at the end".encode(),
        ]


class Left:
    def __init__(self, status: str, launcher: str = "run.py") -> None:
        self.status = status
        self.labels = {LABEL_LAUNCHER: launcher}
        self.removed = False

    def remove(self, force: bool) -> None:
        self.removed = True


class NameTaken(FakeContainers):
    """The first create finds the name taken by `left`."""

    def __init__(self, left: Left) -> None:
        super().__init__({"flock-validator-rl-0": [ExitCode.OK]})
        self.left = left
        self.refused = False

    def create(self, **kwargs):
        if not self.refused:
            self.refused = True
            raise APIError("409 Conflict", response=_Response(409), explanation="name in use")
        return super().create(**kwargs)

    def get(self, name: str):
        if self.left is None:
            raise NotFound(name)
        return self.left


class _Response:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code


def test_a_container_left_by_a_killed_launcher_is_replaced_a_running_one_is_not():
    (worker, spec) = fleet_of(1)[0]
    client = FakeClient({})
    left = Left("exited")
    client.containers = NameTaken(left)
    assert Supervisor(client, spec, 0, 30).run() == ExitCode.OK  # type: ignore[arg-type]
    assert left.removed
    client.containers = NameTaken(Left("running"))
    with pytest.raises(LaunchError, match="a container named flock-validator-rl-0 is already"):
        Supervisor(client, spec, 0, 30).run()  # type: ignore[arg-type]
    assert worker.name == "flock-validator-rl-0"


def test_the_main_thread_stays_free_for_signals():
    # Signal handlers run in the main thread between its waits; a blocking join would hold a
    # Ctrl-C until every worker ended by itself.
    assert threading.current_thread() is threading.main_thread()
    names = [f"flock-validator-rl-{k}" for k in range(2)]
    client = FakeClient({name: [None] for name in names}, stops=Stops(2))
    fleet = FleetSupervisor(client, fleet_of(2), 0, 30)  # type: ignore[arg-type]
    previous = signal.signal(signal.SIGUSR1, fleet.handle_signal)
    try:
        timer = threading.Timer(1.0, os.kill, args=(os.getpid(), signal.SIGUSR1))
        timer.start()
        assert fleet.run() == ExitCode.OK
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert all(c.ended.is_set() for c in client.containers.created)
