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
from dataclasses import dataclass
from pathlib import Path

from validator.scope import (
    MAX_PENALTY_REASON,
    HostPhase,
    PenaltyKind,
    Scope,
    check_penalty_kind,
    entered,
)
from validator.text import bounded, one_line

log = logging.getLogger(__name__)

PHASE_FILE = "scoring.phase"
# A stretch of a phase this short is no time to speak of (the log shows 0.0 s).
MOMENT_S = 0.05
STOP_FILE = "stop.requested"
SUBMISSION = "submission"


class LoopScope(Scope):
    """The scope of one scoring in the loop: host work marked on disk and timed, notes into
    the record's facts, heartbeats to /healthz."""

    def __init__(
        self,
        record: Callable[[str], None],
        times: PhaseTimes,
        beat: Callable[[], None] | None,
    ) -> None:
        self._record, self._times, self._beat = record, times, beat

    def note(self, key: str, value: object) -> None:
        self._times.facts[key] = str(value)[:200]

    def penalty(self, kind: PenaltyKind, reason: str) -> None:
        check_penalty_kind(kind)
        self._times.penalty = Penalty(kind, bounded(one_line(str(reason)), MAX_PENALTY_REASON))

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


@dataclass(frozen=True)
class Penalty:
    """Why the metrics a module returned are the network's penalty (Scope.penalty)."""

    kind: str
    reason: str


class PhaseTimes:
    """Seconds spent in each phase of one scoring; "score" is what no host phase took. With
    them, what the module told of the scoring: its notes (facts) and its penalty, if any."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.seconds: dict[str, float] = {}
        self.facts: dict[str, str] = {}
        self.penalty: Penalty | None = None
        # Per phase, its longest stretch (seconds, when it began) and when its last one began.
        # Phases are listed in the order their longest stretches began: a phase entered for a
        # moment first (the submission's own work before a download) is not listed first; one
        # of no time to speak of (shown as 0.0 s) is listed where its last stretch began.
        self._longest: dict[str, tuple[float, float]] = {}
        self._last: dict[str, float] = {}
        self._current = SUBMISSION
        self._since = clock()

    def switch(self, phase: str) -> None:
        now = self._clock()
        name = phase_name(self._current)
        spent = now - self._since
        self.seconds[name] = self.seconds.get(name, 0.0) + spent
        if spent > self._longest.get(name, (-1.0, 0.0))[0]:
            self._longest[name] = (spent, self._since)
        self._last[name] = self._since
        self._current, self._since = phase, now

    def finish(self) -> dict[str, float]:
        """Seconds per phase, in time order."""
        self.switch(SUBMISSION)

        def began(name: str) -> float:
            spent, start = self._longest[name]
            return start if spent >= MOMENT_S else self._last[name]

        return {name: round(self.seconds[name], 3) for name in sorted(self.seconds, key=began)}


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
        reaches both through the scope entered here (validator/scope.py)."""
        times = PhaseTimes()

        def record(phase: str) -> None:
            _write(self.phase_path, f"{assignment_id}\n{phase}\n")
            times.switch(phase)
            if on_phase is not None:
                on_phase(phase)

        _write(self.phase_path, f"{assignment_id}\n{SUBMISSION}\n")
        try:
            with entered(LoopScope(record, times, on_beat)):
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
