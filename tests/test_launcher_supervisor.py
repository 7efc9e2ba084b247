"""launcher/engine/supervisor.py and launcher/engine/docker_errors.py without a Docker engine: a
stand-in client whose containers exit with the codes a test gives."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from docker.errors import APIError, DockerException

from launcher.engine.containers import ContainerSpec
from launcher.engine.docker_errors import docker_client, refused_to_run
from launcher.engine.supervisor import MAX_SIGNAL_RESTARTS, Supervisor
from launcher.errors import LaunchError
from validator.errors import ExitCode


class FakeContainer:
    def __init__(self, code: int) -> None:
        self.code = code
        self.removed = False

    def attach(self, **_kwargs):
        return iter([(b"validator says hello\n", None)])

    def start(self) -> None:
        pass

    def wait(self) -> dict:
        return {"StatusCode": self.code}

    def remove(self, force: bool) -> None:
        self.removed = force

    def stop(self, timeout: int) -> None:
        pass

    def kill(self) -> None:
        pass


class ProcessContainer(FakeContainer):
    """A container whose validator is a real process running `code`; its exit is what Docker
    reports, 128 + the signal's number for one ended by a signal."""

    def __init__(self, code: str) -> None:
        super().__init__(0)
        self.source = code
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", self.source])

    def wait(self) -> dict:
        assert self.process is not None
        code = self.process.wait(timeout=60)
        return {"StatusCode": 128 - code if code < 0 else code}


class FakeContainers:
    def __init__(self, codes: list, refusal: APIError | None = None, make=FakeContainer) -> None:
        self.codes = codes
        self.refusal = refusal
        self.make = make  # a container from its entry of `codes`
        self.created: list[FakeContainer] = []

    def create(self, **_kwargs) -> FakeContainer:
        if self.refusal is not None:
            raise self.refusal
        self.created.append(self.make(self.codes[len(self.created)]))
        return self.created[-1]


class FakeClient:
    def __init__(self, codes: list, refusal: APIError | None = None, make=FakeContainer) -> None:
        self.containers = FakeContainers(codes, refusal, make)

    def info(self) -> dict:
        return {"LoggingDriver": "json-file"}


def real_or_fake(entry: int | str) -> FakeContainer:
    """A real process for an entry that is code, a stand-in for an exit code."""
    return ProcessContainer(entry) if isinstance(entry, str) else FakeContainer(entry)


def supervise(
    codes: list, refusal: APIError | None = None, check_file: Path | None = None, make=FakeContainer
) -> tuple[int, FakeClient]:
    client = FakeClient(codes, refusal, make)
    spec = ContainerSpec(
        image="flock-validator-fixture:test",
        module="fixture",
        inner_args=["--task_ids", "1"],
        secrets={},
        config_dir=Path("."),
        volumes={"state": "/data/state"},
        gpus="none",
        check_file=check_file,
    )
    supervisor = Supervisor(client, spec, restart_delay=0, stop_timeout=30)  # type: ignore[arg-type]
    return supervisor.run(), client


def test_a_restart_request_restarts_until_the_validator_is_done(capsys):
    code, client = supervise([ExitCode.RESTART, ExitCode.RESTART, ExitCode.OK])
    assert code == ExitCode.OK
    assert len(client.containers.created) == 3
    assert all(c.removed for c in client.containers.created)  # none left behind
    err = capsys.readouterr().err
    assert err.count("[run.py] the validator asked for a restart (exit 100)") == 2
    assert "[run.py] the validator finished (exit 0)" in err


def test_a_check_is_never_restarted(capsys, tmp_path):
    # Scoring the one input again would fault again: run.py --check reports and stops.
    check = tmp_path / "input.json"
    check.write_text("{}")
    code, client = supervise([ExitCode.RESTART, ExitCode.OK], check_file=check)
    assert code == ExitCode.RESTART
    assert len(client.containers.created) == 1
    assert "a fault only a new process recovers from (exit 100)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (ExitCode.USAGE, "rejected its options or configuration (exit 2); fix them and rerun"),
        (ExitCode.OPERATOR, "needs operator action (exit 3): see its last error above"),
        (ExitCode.BUG, "the validator crashed (exit 1); see its log above"),
    ],
)
def test_other_exits_stop_with_an_explanation(capsys, code, message):
    got, client = supervise([code])
    assert got == code
    assert len(client.containers.created) == 1
    assert message in capsys.readouterr().err


# A validator whose CPU limit a process of its user cut (prlimit64 to its usage + 2 s): the
# kernel's SIGXCPU, sent here by the process itself so that no second of CPU is spent on it.
SIGXCPU_DEATH = "import os, signal; os.kill(os.getpid(), signal.SIGXCPU)"


def test_a_validator_killed_by_a_signal_run_py_did_not_send_is_restarted(capsys):
    code, client = supervise([SIGXCPU_DEATH, ExitCode.OK], make=real_or_fake)
    assert code == ExitCode.OK
    assert len(client.containers.created) == 2
    err = capsys.readouterr().err
    assert err.count("[run.py] ") == 2, err
    assert (
        "[run.py] the validator was killed (exit 152); restarting in 0s (SIGXCPU, not sent by "
        "run.py)"
    ) in err
    assert "[run.py] the validator finished (exit 0)" in err


def test_signal_deaths_in_a_row_stop_once_the_restarts_are_spent(capsys):
    killed = 128 + signal.SIGKILL  # the kernel's OOM killer, each time
    code, client = supervise([killed] * (MAX_SIGNAL_RESTARTS + 1))
    assert code == killed
    assert len(client.containers.created) == MAX_SIGNAL_RESTARTS + 1
    err = capsys.readouterr().err
    assert (
        err.count("killed (exit 137); restarting in 0s (SIGKILL, not sent") == MAX_SIGNAL_RESTARTS
    )
    assert f"killed by SIGKILL (exit 137) {MAX_SIGNAL_RESTARTS + 1} times in a row" in err


def test_the_validators_own_interrupted_exit_is_not_a_signal_death(capsys):
    # 130 is ExitCode.INTERRUPTED (a second stop signal cut scoring short), as 128 + SIGINT.
    code, client = supervise([ExitCode.INTERRUPTED])
    assert code == ExitCode.INTERRUPTED
    assert len(client.containers.created) == 1


@pytest.mark.parametrize(
    ("explanation", "message"),
    [
        (
            'could not select device driver "" with capabilities: [[gpu]]',
            "cannot provide them (no NVIDIA Container Toolkit?). Install it, or run without "
            "GPUs: --gpus none",
        ),
        (
            "nvidia-container-cli: initialization error: nvml error: driver not loaded",
            "the NVIDIA container runtime could not give the container its GPUs",
        ),
        ("no such image", "Docker refused to run the validator: no such image"),
    ],
)
def test_docker_refusals_are_one_line(explanation, message):
    error = refused_to_run(APIError("500 Server Error", explanation=explanation))
    assert message in str(error)
    assert "\n" not in str(error)
    assert error.exit_code == ExitCode.OPERATOR
    with pytest.raises(LaunchError, match="Docker refused"):
        supervise([0], APIError("500", explanation="no such image"))


def test_an_unreachable_engine_is_one_line(monkeypatch):
    def no_engine():
        raise DockerException("Error while fetching server API version")

    monkeypatch.setattr("launcher.engine.docker_errors.docker.from_env", no_engine)
    with pytest.raises(LaunchError, match="^cannot reach the Docker engine .*docker group") as e:
        docker_client()
    assert e.value.exit_code == ExitCode.OPERATOR
