"""Runs the validator's container until it exits for good: streams its logs, restarts it with
backoff when it asks for a restart, stops it on Ctrl-C/SIGTERM, and explains every other exit.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import docker
from docker.errors import APIError, NotFound

from launcher.containers import ContainerSpec
from launcher.docker_errors import refused_to_run
from validator.errors import ExitCode

MAX_RESTART_DELAY = 300.0
HEALTHY_RUN = 600.0  # a run this long resets the restart backoff
# What Docker reports for a container ended by a signal: 128 + its number.
STOPPED_EXIT = 128 + signal.SIGTERM
KILLED_EXIT = 128 + signal.SIGKILL

EXIT_MESSAGES = {
    ExitCode.USAGE: (
        f"the validator rejected its options or configuration (exit {ExitCode.USAGE:d}); "
        "fix them and rerun"
    ),
    ExitCode.OPERATOR: (
        f"the validator needs operator action (exit {ExitCode.OPERATOR:d}): see its last error "
        "above; fix it and rerun"
    ),
    ExitCode.RESTART: (
        f"the validator hit a fault only a new process recovers from (exit "
        f"{ExitCode.RESTART:d}), e.g. a GPU fault: see its last error above"
    ),
    KILLED_EXIT: (
        f"the validator was killed (exit {KILLED_EXIT:d}): out of memory, or killed from outside"
    ),
}


def say(message: str) -> None:
    print(f"[run.py] {message}", file=sys.stderr, flush=True)


class Supervisor:
    """Runs the container until it exits for good; restarts it on ExitCode.RESTART."""

    def __init__(
        self,
        client: docker.DockerClient,
        spec: ContainerSpec,
        restart_delay: float,
        stop_timeout: float,
    ) -> None:
        self.client = client
        self.spec = spec
        self.restart_delay = restart_delay
        # Seconds the validator gets to finish the assignment in progress before it is killed.
        self.stop_timeout = stop_timeout
        self.stop_requested = threading.Event()
        self.signals = 0
        self.container = None

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self.handle_signal)
        signal.signal(signal.SIGTERM, self.handle_signal)

    def handle_signal(self, signum: int, _frame) -> None:
        self.signals += 1
        self.stop_requested.set()
        container = self.container
        if container is None:
            return
        if self.signals == 1:
            say(f"{signal.Signals(signum).name}: stopping the validator (again to kill it)")
            action, kwargs = container.stop, {"timeout": self.stop_timeout}
        else:
            action, kwargs = container.kill, {}
        # Docker calls block; a thread keeps the log stream flowing meanwhile.
        threading.Thread(target=_quietly, args=(action,), kwargs=kwargs, daemon=True).start()

    def run(self) -> int:
        delay = self.restart_delay
        while True:
            started = time.monotonic()
            code = self._run_once()
            if self.stop_requested.is_set():
                return self._stopped(code)
            # A --check scores one input: a restart would score it again, and fault again.
            if code != ExitCode.RESTART or self.spec.check_file is not None:
                return _report(code)
            if time.monotonic() - started > HEALTHY_RUN:
                delay = self.restart_delay
            say(f"the validator asked for a restart (exit {code}); restarting in {delay:g}s")
            if self.stop_requested.wait(delay):
                return ExitCode.OK
            delay = min(delay * 2, MAX_RESTART_DELAY)

    def _stopped(self, code: int) -> int:
        """The exit after the operator's stop: killed by a second signal, stopped cleanly, or
        the validator's own code."""
        if self.signals > 1:
            return ExitCode.INTERRUPTED
        return ExitCode.OK if code in (ExitCode.OK, STOPPED_EXIT) else code

    def _run_once(self) -> int:
        try:
            container = self.client.containers.create(**self.spec.run_kwargs())
        except APIError as exc:
            raise refused_to_run(exc) from exc
        try:
            stream = container.attach(stream=True, logs=True, demux=True)
            try:
                container.start()
            except APIError as exc:
                raise refused_to_run(exc) from exc
            self.container = container
            if self.stop_requested.is_set():  # a signal came before the container was known
                _quietly(container.stop, timeout=self.stop_timeout)
            for out, err in stream:
                if out:
                    sys.stdout.buffer.write(out)
                    sys.stdout.flush()
                if err:
                    sys.stderr.buffer.write(err)
                    sys.stderr.flush()
            return int(container.wait()["StatusCode"])
        finally:
            self.container = None
            _quietly(container.remove, force=True)


def _quietly(action, **kwargs) -> None:
    try:
        action(**kwargs)
    except (NotFound, APIError):
        pass  # the container is already gone, which is what was wanted


def _report(code: int) -> int:
    if code == ExitCode.OK:
        say(f"the validator finished (exit {code})")
    else:
        say(EXIT_MESSAGES.get(code, f"the validator crashed (exit {code}); see its log above"))
    return code
