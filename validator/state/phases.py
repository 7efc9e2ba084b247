"""What an assignment's scoring was doing when its process died, so that only deaths the
submission plausibly caused count against it (validator/errors.py, MAX_SCORING_ATTEMPTS).

Scoring is the submission's own work unless a module marks a section `host_work` (fetching
files, loading a base model: a death there is this host's doing). A stop request (SIGTERM,
Ctrl-C, `docker stop`) is marked too: a process killed after one, when its grace period ran out,
was stopped, not crashed. Both marks are small files beside the journal, written as they
happen, because after a SIGKILL nothing else is left to tell.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from validator.kit.scope import HostPhase, Scope, entered

log = logging.getLogger(__name__)

PHASE_FILE = "scoring.phase"
STOP_FILE = "stop.requested"
SUBMISSION = "submission"


class LoopScope(Scope):
    """The scope of one scoring in the loop: host work marked on disk and timed, notes into
    the record's facts, heartbeats to /healthz."""

    def __init__(
        self,
        record: Callable[[str], None],
        facts: dict[str, str],
        beat: Callable[[], None] | None,
    ) -> None:
        self._record, self._facts, self._beat = record, facts, beat

    def note(self, key: str, value: object) -> None:
        self._facts[key] = str(value)[:200]

    def heartbeat(self) -> None:
        if self._beat is not None:
            self._beat()

    def _enter(self, phase: HostPhase) -> None:
        self._record(f"host: {phase}")

    def _leave(self, phase: HostPhase) -> None:
        self._record(SUBMISSION)


def phase_name(mark: str) -> str:
    """The phase a mark names, as records and metrics call it: a host phase, or "score"."""
    return "score" if mark == SUBMISSION else mark.removeprefix("host: ")


class PhaseTimes:
    """Seconds spent in each phase of one scoring; "score" is what no host phase took."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.facts: dict[str, str] = {}
        self._current = SUBMISSION
        self._since = time.monotonic()

    def switch(self, phase: str) -> None:
        now = time.monotonic()
        name = phase_name(self._current)
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._since
        self._current, self._since = phase, now

    def finish(self) -> dict[str, float]:
        self.switch(SUBMISSION)
        return {name: round(value, 3) for name, value in self.seconds.items()}


class ScoringMarks:
    """The marks of one state directory (one validator process owns it)."""

    def __init__(self, state_dir: Path) -> None:
        self.phase_path = state_dir / PHASE_FILE
        self.stop_path = state_dir / STOP_FILE

    @contextmanager
    def scoring(
        self,
        assignment_id: str,
        on_phase: Callable[[str], None] | None = None,
        on_beat: Callable[[], None] | None = None,
    ) -> Iterator[PhaseTimes]:
        """While `assignment_id` is scored: its phase is kept on disk, and timed; the module
        reaches both through the scope entered here (validator/kit/scope.py)."""
        times = PhaseTimes()

        def record(phase: str) -> None:
            _write(self.phase_path, f"{assignment_id}\n{phase}\n")
            times.switch(phase)
            if on_phase is not None:
                on_phase(phase)

        _write(self.phase_path, f"{assignment_id}\n{SUBMISSION}\n")
        try:
            with entered(LoopScope(record, times.facts, on_beat)):
                yield times
        finally:
            self.phase_path.unlink(missing_ok=True)

    def watch_stop(self, stop: threading.Event) -> None:
        """Marks the stop request on disk as soon as `stop` is set."""

        def mark() -> None:
            stop.wait()
            self.mark_stopped()

        threading.Thread(target=mark, name="stop-mark", daemon=True).start()

    def mark_stopped(self) -> None:
        """The stop request, on disk (again: the write replaces the file whole)."""
        _write(self.stop_path, "stop requested\n")

    def not_counted(self, assignment_id: str) -> str | None:
        """Why the death of the process that was scoring `assignment_id` is not the
        submission's (None: it counts). Read once, at start-up."""
        if self.stop_path.exists():
            return "the process was stopped (a stop signal, then killed) while scoring"
        try:
            scored, phase = self.phase_path.read_text().splitlines()[:2]
        except (OSError, ValueError):
            return None
        if scored == assignment_id and phase != SUBMISSION:
            return f"the process ended in the host's work ({phase_name(phase)})"
        return None

    def clear(self) -> None:
        self.phase_path.unlink(missing_ok=True)
        self.stop_path.unlink(missing_ok=True)


def _write(path: Path, text: str) -> None:
    # Write then rename: a death mid-write leaves the previous mark whole. One partial file per
    # thread: the stop mark may be written by the watch thread and the loop at once.
    partial = path.with_name(f"{path.name}.{threading.get_ident()}.partial")
    partial.write_text(text)
    os.replace(partial, path)
