"""Supervises a fleet: one Supervisor per worker, each in its own thread, restarting its own
container with its own backoff. A worker that ends for good (exit 2, 3, a Docker refusal) is
one line naming it, and the others go on; Ctrl-C or SIGTERM stops them all at once, so the
whole stop takes one grace period, not one per worker."""

from __future__ import annotations

import signal
import threading
from dataclasses import replace
from types import FrameType

import docker
from docker.errors import DockerException

from launcher.engine.containers import ContainerSpec
from launcher.engine.docker_errors import lost_engine
from launcher.engine.supervisor import Supervisor
from launcher.errors import LaunchError, say
from launcher.fleet.plan import Worker
from validator.errors import ExitCode
from validator.spec import STATE_PATH

# The worker's name, in its container's environment.
WORKER_ENV = "VALIDATOR_WORKER"
# How often the main thread looks up from waiting: signal handlers run in it between waits.
JOIN_SECONDS = 0.5


class FleetSupervisor:
    def __init__(
        self,
        client: docker.DockerClient,
        workers: list[tuple[Worker, ContainerSpec]],
        restart_delay: float,
        stop_timeout: float,
    ) -> None:
        self.workers = [worker for worker, _ in workers]
        self.supervisors = [
            Supervisor(
                client,
                spec,
                restart_delay,
                stop_timeout,
                worker=worker.name,
                restart_killed=True,
            )
            for worker, spec in workers
        ]
        self.codes: dict[str, int] = {}
        self.signals = 0

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGINT, self.handle_signal)
        signal.signal(signal.SIGTERM, self.handle_signal)

    def handle_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals += 1
        running = [
            s
            for s, w in zip(self.supervisors, self.workers, strict=True)
            if w.name not in self.codes
        ]
        if self.signals == 1:
            say(
                f"{signal.Signals(signum).name}: stopping {len(running)} worker(s) "
                "(again to kill them)"
            )
        for supervisor in running:
            supervisor.stop(kill=self.signals > 1)

    def run(self) -> int:
        threads = [
            threading.Thread(target=self._supervise, args=(worker, supervisor), daemon=True)
            for worker, supervisor in zip(self.workers, self.supervisors, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(JOIN_SECONDS)
        return self._outcome()

    def _supervise(self, worker: Worker, supervisor: Supervisor) -> None:
        try:
            code = supervisor.run()
        except LaunchError as exc:
            supervisor.say(f"error: {exc}")
            code = exc.exit_code
        except DockerException as exc:
            supervisor.say(f"error: {lost_engine(exc)}")
            code = ExitCode.OPERATOR
        except Exception as exc:  # noqa: BLE001 - one worker's bug must not end the others
            supervisor.say(f"error: {type(exc).__name__}: {exc}")
            code = ExitCode.BUG
        self.codes[worker.name] = code
        if code != ExitCode.OK and not supervisor.stop_requested.is_set():
            others = len(self.workers) - len(self.codes)
            if others:
                say(f"worker {worker.name} stopped for good (exit {code}); {others} go on")

    def _outcome(self) -> int:
        """0 when every worker ended well; else the first failing worker's code (in order)."""
        codes = [self.codes.get(worker.name, ExitCode.BUG) for worker in self.workers]
        summary = ", ".join(f"{w.name} exit {c}" for w, c in zip(self.workers, codes, strict=True))
        say(f"all workers ended: {summary}")
        if self.signals > 1:
            return ExitCode.INTERRUPTED
        return next((code for code in codes if code != ExitCode.OK), ExitCode.OK)


def worker_containers(
    base: ContainerSpec, workers: list[Worker]
) -> list[tuple[Worker, ContainerSpec]]:
    """Each worker's container: its name, GPUs, journal volume (in place of the one-container
    run's) and options; everything else, the HF cache volume included, is shared."""
    shared = {name: path for name, path in base.volumes.items() if path != STATE_PATH}
    fleet = len(workers) > 1
    return [
        (
            worker,
            replace(
                base,
                name=worker.name,
                gpus=worker.gpus,
                volumes={worker.state_volume: STATE_PATH, **shared},
                inner_args=[*base.inner_args, *worker.inner_args()],
                # The validator names itself with it to the API (its User-Agent), so that a
                # fleet's requests can be told apart.
                env={**base.env, WORKER_ENV: worker.name} if fleet else base.env,
            ),
        )
        for worker in workers
    ]
