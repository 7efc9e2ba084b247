"""Runs the validator's container until it exits for good: streams its logs, restarts it with
backoff when it asks for a restart or a signal run.py did not send ended it, stops it on
Ctrl-C/SIGTERM, and explains every other exit.
A fleet (launcher/fleet/run.py) runs one Supervisor per worker, each in its own thread.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from types import FrameType

import docker
from docker.errors import APIError, NotFound
from docker.models.containers import Container

from launcher.engine.containers import LABEL_LAUNCHER, LOG_DRIVER, ContainerSpec
from launcher.engine.docker_errors import refused_to_run
from launcher.engine.fault_hook import kill_point
from launcher.engine.takeover import owner_labels
from launcher.errors import LaunchError, say
from validator.errors import ExitCode

MAX_RESTART_DELAY = 300.0
HEALTHY_RUN = 600.0  # a run this long resets the restart backoff
# What Docker reports for a container ended by a signal: 128 + its number.
STOPPED_EXIT = 128 + signal.SIGTERM
KILLED_EXIT = 128 + signal.SIGKILL
# A validator ended by a signal that run.py did not send (SIGXCPU of a limit cut from outside,
# the kernel's OOM kill, a crash in native code) is a fault a new process may recover from:
# restarted, this many times in a row at most (a run of HEALTHY_RUN starts the count again).
MAX_SIGNAL_RESTARTS = 5

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


class Supervisor:
    """Runs the container until it exits for good; restarts it on ExitCode.RESTART and when a
    signal run.py did not send ended it (MAX_SIGNAL_RESTARTS in a row; a fleet's worker always)."""

    def __init__(
        self,
        client: docker.DockerClient,
        spec: ContainerSpec,
        restart_delay: float,
        stop_timeout: float,
        *,
        worker: str | None = None,
        restart_killed: bool = False,
    ) -> None:
        self.client = client
        self.spec = spec
        self.restart_delay = restart_delay
        # Seconds the validator gets to finish the assignment in progress before it is killed.
        self.stop_timeout = stop_timeout
        # A fleet's worker: its lines name it and its output lines carry its name.
        self.worker = worker
        # A fleet's worker killed from outside (OOM, docker kill) starts again on its own, as
        # the others go on, however often; its journal counts the assignment it was killed in,
        # which fails after its restarts like any other fault.
        self.restart_killed = restart_killed
        self.stop_requested = threading.Event()
        # --follow-releases (launcher/release/follow.py): the image to start on once this one
        # stopped.
        self.next_image: str | None = None
        self.signals = 0
        self.container: Container | None = None
        self._output = PrefixedOutput(f"[{worker}] ") if worker else None

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self.handle_signal)
        signal.signal(signal.SIGTERM, self.handle_signal)

    def handle_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.container is not None and self.signals == 0:
            say(f"{signal.Signals(signum).name}: stopping the validator (again to kill it)")
        self.stop(kill=self.signals > 0)

    def stop(self, kill: bool) -> None:
        """A stop (the module's grace, then killed) or, `kill`, an immediate kill. Returns at
        once: Docker calls block, and a thread keeps the log stream flowing meanwhile, so a
        fleet's workers all stop in parallel."""
        self.signals = max(self.signals + 1, 2 if kill else 1)  # two or more: killed
        self.stop_requested.set()
        container = self.container
        if container is None:
            return
        action: Callable[..., None]
        kwargs: dict[str, float]
        if kill:
            action, kwargs = container.kill, {}
        else:
            action, kwargs = container.stop, {"timeout": self.stop_timeout}
        threading.Thread(target=_quietly, args=(action,), kwargs=kwargs, daemon=True).start()

    def upgrade(self, image: str, why: str) -> None:
        """Moves to `image` (a verified release's, already pulled) after the assignment in
        progress: the container is stopped as an operator's stop does (SIGTERM: it finishes
        and submits it), then started again on `image` with the same volumes."""
        self.next_image = image
        self.say(f"{why}: moving to {image} after the assignment in progress")
        self._stop_for_upgrade()

    def _stop_for_upgrade(self) -> None:
        container = self.container
        if container is not None and self.next_image not in (None, self.spec.image):
            kwargs = {"timeout": self.stop_timeout}
            threading.Thread(
                target=_quietly, args=(container.stop,), kwargs=kwargs, daemon=True
            ).start()

    def say(self, message: str) -> None:
        say(f"worker {self.worker}: {message}" if self.worker else message)

    def run(self) -> int:
        delay = self.restart_delay
        signalled = 0  # signal deaths in a row
        while True:
            started = time.monotonic()
            code = self._run_once()
            if self.stop_requested.is_set():
                return self._stopped(code)
            if self.next_image is not None and self.next_image != self.spec.image:
                kill_point("switch:stopped")
                self.spec = replace(self.spec, image=self.next_image)
                self.say(f"the validator stopped (exit {code}); starting it on {self.spec.image}")
                delay = self.restart_delay
                continue
            if time.monotonic() - started > HEALTHY_RUN:
                delay, signalled = self.restart_delay, 0
            killed = signal_of(code)
            signalled = signalled + 1 if killed else 0
            restarted = code == ExitCode.RESTART or (
                killed is not None and (signalled <= MAX_SIGNAL_RESTARTS or self.restart_killed)
            )
            # A --check scores one input: a restart would score it again, and fault again.
            if not restarted or self.spec.check_file is not None:
                return self._report(code, signalled)
            if killed is not None:
                self.say(
                    f"the validator was killed (exit {code}); restarting in {delay:g}s ({killed}, "
                    "not sent by run.py)"
                )
            else:
                self.say(
                    f"the validator asked for a restart (exit {code}); restarting in {delay:g}s"
                )
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
        container = self._create()
        try:
            stream = container.attach(stream=True, logs=True, demux=True)
            try:
                container.start()
            except APIError as exc:
                raise refused_to_run(exc) from exc
            self.container = container
            if self.stop_requested.is_set():  # a signal came before the container was known
                _quietly(container.stop, timeout=self.stop_timeout)
            self._stop_for_upgrade()  # a release came before the container was known
            for out, err in stream:
                if self._output is not None:
                    self._output.write(out, err)
                    continue
                if out:
                    sys.stdout.buffer.write(out)
                    sys.stdout.flush()
                if err:
                    sys.stderr.buffer.write(err)
                    sys.stderr.flush()
            if self._output is not None:
                self._output.flush()
            return int(container.wait()["StatusCode"])
        finally:
            self.container = None
            _quietly(container.remove, force=True)

    def _create(self) -> Container:
        try:
            return self.client.containers.create(**self._run_kwargs())
        except APIError as exc:
            if exc.status_code != 409 or not self.spec.name:
                raise refused_to_run(exc) from exc
        # The name is taken: a container this launcher left when it was killed itself (kill -9)
        # is removed if it has stopped; a running one is another launcher's, or still working.
        name = self.spec.name
        try:
            found = self.client.containers.get(name)
        except NotFound:
            found = None
        if found is not None and (
            found.status == "running" or found.labels.get(LABEL_LAUNCHER) != "run.py"
        ):
            raise LaunchError(
                f"a container named {name} is already {found.status} (another run.py with this "
                f"journal, or one left running): stop it with `docker stop {name}`, or give "
                "another --state-volume"
            )
        if found is not None:
            _quietly(found.remove, force=True)
        try:
            return self.client.containers.create(**self._run_kwargs())
        except APIError as exc:
            raise refused_to_run(exc) from exc

    def _run_kwargs(self) -> dict:
        """The spec's, and the label naming this process, which a later start reads to take
        the container over if this process dies (launcher/engine/takeover.py)."""
        kwargs = self.spec.run_kwargs(self._log_driver())
        kwargs["labels"] = {**kwargs["labels"], **owner_labels()}
        return kwargs

    def _log_driver(self) -> str:
        """The engine's default log driver (json-file, Docker's own default, when it does not
        say)."""
        try:
            return str(self.client.info().get("LoggingDriver") or LOG_DRIVER)
        except APIError:
            return LOG_DRIVER

    def _report(self, code: int, signalled: int = 0) -> int:
        if code == ExitCode.OK:
            self.say(f"the validator finished (exit {code})")
        elif signalled > MAX_SIGNAL_RESTARTS:
            self.say(killed_in_a_row(code, signalled))
        else:
            self.say(
                EXIT_MESSAGES.get(code, f"the validator crashed (exit {code}); see its log above")
            )
        return code


class PrefixedOutput:
    """A worker's output, line by line with its name in front: a fleet's workers write to one
    terminal, and a line must not be cut by another worker's."""

    lock = threading.Lock()  # one for every worker: a whole line at a time

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix.encode()
        self.pending = {"out": b"", "err": b""}

    def write(self, out: bytes | None, err: bytes | None) -> None:
        for name, chunk in (("out", out), ("err", err)):
            if chunk:
                *lines, self.pending[name] = (self.pending[name] + chunk).split(b"\n")
                self._emit(name, lines)

    def flush(self) -> None:
        for name, rest in self.pending.items():
            if rest:
                self._emit(name, [rest])
                self.pending[name] = b""

    def _emit(self, name: str, lines: list[bytes]) -> None:
        if not lines:
            return
        stream = sys.stdout if name == "out" else sys.stderr
        text = b"".join(self.prefix + line + b"\n" for line in lines)
        with self.lock:
            stream.buffer.write(text)
            stream.flush()


def killed_in_a_row(code: int, times: int) -> str:
    """The line when signal deaths in a row have spent the restarts."""
    killed = f"the validator was killed by {signal_of(code)} (exit {code})"
    return f"{killed} {times} times in a row; see its log above"


def signal_of(code: int) -> str | None:
    """The signal's name when `code` is what Docker reports for a container ended by one (128 +
    its number); None for a code of the validator's own (ExitCode.INTERRUPTED is 130)."""
    if code in {int(c) for c in ExitCode} or not 128 < code < 128 + signal.NSIG:
        return None
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


def _quietly(action: Callable[..., object], **kwargs: object) -> None:
    try:
        action(**kwargs)
    except (NotFound, APIError):
        pass  # the container is already gone, which is what was wanted
