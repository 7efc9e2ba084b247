"""The assignment loop: round-robin lookups over tasks, scoring, and submission via the journal.

Every assignment is journaled before it is scored, so a crash, a kill or an API outage loses
nothing: undecided work is rescored and unsubmitted results are submitted by the next loop pass
or the next process. Observing (metrics, records, the status page) hooks around these steps
(validator/observe/hooks.py): the loop calls its hook list and reads nothing back.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import NamedTuple, NoReturn

from validator.clock import Clock
from validator.errors import (
    MAX_SCORING_ATTEMPTS,
    OUTCOMES,
    ExitCode,
    JournalAction,
    JournalUnwritable,
    OperatorError,
    Outcome,
    Verdict,
    assert_never,
    describe,
    outcome_of,
)
from validator.ledger.answers import Assignment, Task
from validator.ledger.client import FedLedgerClient
from validator.ledger.submitting import SubmitAction, submit_result
from validator.lookups import Lookups
from validator.observe.hooks import Hooks
from validator.observe.lines import result_line
from validator.options import DEFAULT_JOURNAL_KEEP_DAYS
from validator.scoring import InvalidInput, ModulePool, score
from validator.state.entry import FINAL, UNDECIDED, UNSUBMITTED, Entry, FailedKind, State
from validator.state.journal import Journal
from validator.state.phases import PhaseTimes, ScoringMarks
from validator.state.upkeep import Upkeep
from validator.text import MAX_INPUT_STRING, bounded, cut_strings, one_line, oversized_strings

log = logging.getLogger(__name__)

# Stop retrying an assignment that keeps hitting transient faults after this long.
PENDING_TTL_SECONDS = 24 * 3600


class Took(NamedTuple):
    """Where a scoring's time went, and the commit it scored: for its result's line."""

    phases: dict[str, float]
    commit: str | None


class Interrupted(BaseException):
    """A second stop signal: leave now, even in the middle of scoring."""


class Stop(Exception):
    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class LoopSettings:
    # The tasks to look up (a --shard's): the journal's work is finished whatever its task.
    task_ids: list[str]
    time_sleep: float
    lookup_interval: float
    max_assignments: int | None = None
    # Days finished rows stay in the journal in full (validator/state/upkeep.py; 0: for good).
    journal_keep_days: int = DEFAULT_JOURNAL_KEEP_DAYS


class Runner:
    def __init__(
        self,
        settings: LoopSettings,
        client: FedLedgerClient,
        journal: Journal,
        pool: ModulePool,
        stop: threading.Event,
        hooks: Hooks,
        clock: Clock = Clock(),  # noqa: B008 - stateless
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.hooks = hooks  # observing: metrics, records, the status page
        self.client = client
        self.journal = journal
        self.pool = pool
        self.module = pool.module_name
        self.stop = stop
        self.lookups = Lookups(
            settings.task_ids,
            settings.lookup_interval,
            settings.time_sleep,
            client,
            hooks,
            stop,
            clock,
        )
        self.finished = 0
        self.marks = ScoringMarks(journal.state_dir)
        self.upkeep = Upkeep(journal, settings.journal_keep_days)

    def run(self, listed: list[Task] | None = None) -> ExitCode:
        """The loop until a stop or --max-assignments; `listed`: the Fed Ledger's task list
        when start-up has read it already (else the lookups read it)."""
        try:
            self.lookups.check_listed(listed)
            self._settle_interrupted()
            self.marks.watch_stop(self.stop)
            self.journal.report_backlog(self.module)
            # A restart is when an operator expects kept results to go out: before any lookup,
            # whatever wait the last process set on them.
            self._submit_pending(self.journal.pending(self.module, UNSUBMITTED))
            while not self.stop.is_set():
                # One read of the journal per pass: a pass that does any work ends after it,
                # so what was read still holds for every step up to that work.
                pending = self.journal.pending(self.module, UNDECIDED + UNSUBMITTED)
                undecided = sum(entry.state in UNDECIDED for entry in pending)
                self.hooks.before_pass(undecided, len(pending) - undecided)
                if self._limit_reached():
                    log.info("finished %d assignments; exiting", self.finished)
                    return ExitCode.OK
                if self._submit_due(pending) or self._score_due(pending):
                    continue
                task_id = self.lookups.due()
                if task_id is None:
                    # Nothing due: the journal's upkeep, one bounded piece a pass, if due.
                    if self.upkeep.step(self.clock.time()):
                        continue
                    self._wait(pending)
                else:
                    self._lookup(task_id)
            log.info("stopped by signal")
            return ExitCode.OK
        except Interrupted:
            # A second stop ends an attempt in flight; it stays in `scoring`, and the stop mark
            # makes the next run take it back uncounted, as after any stopped process.
            try:
                self.marks.mark_stopped()
            except OSError as exc:
                log.warning("the stop could not be marked on disk (%s): counted as a crash", exc)
            raise
        except Stop as stop:
            log.error("%s", stop)
            return stop.code
        except JournalUnwritable as exc:
            # One line, no traceback: the journal still holds everything it recorded before.
            log.error("operator action needed: %s", exc)
            return ExitCode.OPERATOR

    def _settle_interrupted(self) -> None:
        """An assignment left in `scoring` was being scored when its process died, and that
        attempt was counted when it began; it is taken back unless the submission plausibly
        caused the death (validator/state/phases.py)."""
        for entry in self.journal.pending(self.module, (State.SCORING,)):
            reason = self.marks.not_counted(entry.id)
            if reason is not None:
                self.journal.postpone(entry, f"{reason}; attempt not counted", 0)
                log.info("assignment %s: %s; this attempt is not counted", entry.id, reason)
        self.marks.clear()

    def _limit_reached(self) -> bool:
        limit = self.settings.max_assignments
        return limit is not None and self.finished >= limit

    # --- lookups -----------------------------------------------------------------------

    def _wait(self, pending: list[Entry]) -> None:
        """Until a task's next lookup or a pending entry is due."""
        now = self.clock.time()
        delay = min([self.lookups.seconds_to_next(), *(e.not_before - now for e in pending)])
        if delay > 0:
            self.clock.wait(self.stop, delay)

    def _lookup(self, task_id: str) -> None:
        # An assignment handed out that cannot be journaled would sit in `validating`, lost to
        # this validator, until it expires: ask for none unless the journal can record it.
        self.journal.ensure_writable()
        try:
            assignment = self.lookups.lookup(task_id)
        except OperatorError as exc:
            raise Stop(ExitCode.OPERATOR, str(exc)) from exc
        if assignment is not None:
            self._take(task_id, assignment)

    def _take(self, task_id: str, assignment: Assignment) -> None:
        data = assignment.module_input(self.pool.module_cls.input_data_schema.submitter_fields)
        # Journaled whole, an input string of 30 MB made a 90 MB journal: cut, then failed.
        oversized = oversized_strings(data, MAX_INPUT_STRING)
        if oversized:
            data = cut_strings(data, MAX_INPUT_STRING)
        try:
            entry = self.journal.receive(assignment.id, self.module, task_id, data)
        except JournalUnwritable as exc:
            # Only a disk filled by someone else since ensure_writable() gets here.
            raise JournalUnwritable(
                f"{exc}; assignment {assignment.id} of task {task_id} was handed out but could "
                "not be journaled, it stays in validating until it expires"
            ) from exc
        log.debug("task %s: received assignment %s", task_id, assignment.id)
        if entry is None:
            log.warning(
                "assignment %s was handed out again but its journal row is set aside "
                "(quarantined); ignoring",
                assignment.id,
            )
        elif oversized and entry.state in UNDECIDED:
            fields = ", ".join(oversized[:5])
            reason = f"input {fields}: over {MAX_INPUT_STRING} characters, not scored"
            self._decide_failed(entry, reason, "invalid_input")
        elif entry.state in UNDECIDED:
            self._score(entry)
        elif entry.state in UNSUBMITTED:
            self._submit(entry)
        else:
            log.warning(
                "assignment %s was handed out again but is already %s; ignoring",
                entry.id,
                entry.state.value,
            )

    # --- scoring -----------------------------------------------------------------------

    def _due(self, pending: list[Entry], states: tuple[State, ...]) -> list[Entry]:
        now = self.clock.time()
        return [e for e in pending if e.state in states and e.not_before <= now]

    def _score_due(self, pending: list[Entry]) -> bool:
        due = self._due(pending, UNDECIDED)
        for entry in due:
            if self.stop.is_set():
                break
            self._score(entry)
        return bool(due)

    def _score(self, entry: Entry) -> None:
        if entry.attempts >= MAX_SCORING_ATTEMPTS:
            self._decide_failed(entry, *_attempts_used_up(entry))
            return
        # Scoring with no room to record its result would spend a scoring attempt for nothing.
        self.journal.ensure_writable()
        entry = self.journal.begin_scoring(entry)
        self.hooks.before_attempt(entry)
        try:
            log.info(
                "assignment %s (task %s%s): scoring (attempt %d)",
                entry.id,
                entry.task_id,
                _submission_of(entry),
                entry.attempts,
            )
            entry = self._score_once(entry)
        except BaseException as exc:
            self.hooks.after_attempt(entry, exc)
            raise
        self.hooks.after_attempt(entry)

    def _score_once(self, entry: Entry) -> Entry:
        """Scores `entry` and records what came of it; returns the entry as it then is."""
        times = None
        try:
            watch = self.marks.scoring(
                entry.id, on_phase=self.hooks.on_phase, on_beat=self.hooks.on_beat
            )
            with watch as times:
                # A module starts as the host's work ("load"): a death there is not counted.
                module = self.pool.module_for(entry.task_id)
                metrics = score(module, entry.input)
        except Exception as exc:  # noqa: BLE001 - every failure is classified below
            return self._on_error(entry, exc, self._after_score(entry, times))
        took = self._after_score(entry, times)
        log.debug("assignment %s: scored %s", entry.id, json.dumps(metrics))
        # The module's word that these metrics are the network's penalty: they are submitted
        # as they are, and the journal keeps why.
        penalty = (times.penalty.kind, times.penalty.reason) if times and times.penalty else None
        return self._submit(self.journal.scored(entry, metrics, penalty), took)

    def _after_score(self, entry: Entry, times: PhaseTimes | None) -> Took | None:
        if times is None:  # the module did not start
            return None
        took = Took(times.finish(), times.facts.get("commit"))
        self.hooks.after_score(entry, took.phases, took.commit)
        return took

    def _on_error(self, entry: Entry, exc: Exception, took: Took | None) -> Entry:
        """Does what validator.errors.OUTCOMES says for the error's verdict."""
        outcome = outcome_of(exc)
        if outcome.journal is JournalAction.FAIL:
            # Said once, with the submit (result_line); the traceback when it helps.
            if outcome.traceback or log.isEnabledFor(logging.DEBUG):
                log.warning("assignment %s: %s", entry.id, outcome.headline, exc_info=exc)
            kind: FailedKind = "invalid_input" if isinstance(exc, InvalidInput) else "rejected"
            return self._decide_failed(entry, describe(exc), kind, took)
        if outcome.exit_code is not None:
            self._stop(entry, exc, outcome)
        if outcome.journal is JournalAction.KEEP:
            return self._postpone_transient(entry, exc)
        return self._retry_or_fail(entry, exc, outcome)

    def _stop(self, entry: Entry, exc: Exception, outcome: Outcome) -> NoReturn:
        assert outcome.exit_code is not None
        if outcome.journal is JournalAction.COUNT:
            # Left in `scoring` with its attempt counted: the next process rescores it.
            message = f"assignment {entry.id}: {outcome.headline}: {describe(exc)}"
        else:
            message = f"assignment {entry.id} kept for a retry after you fix this: {exc}"
            try:
                self.journal.postpone(entry, str(exc), 0)
            except JournalUnwritable as full:
                message += f" (and {full})"
        raise Stop(outcome.exit_code, message) from exc

    def _retry_or_fail(self, entry: Entry, exc: Exception, outcome: Outcome) -> Entry:
        """An unexpected error: scored again after --time-sleep, while the loop goes on with
        other work, and failed once MAX_SCORING_ATTEMPTS attempts have been spent."""
        last = entry.attempts >= MAX_SCORING_ATTEMPTS
        then = "marking it failed" if last else f"scoring it again in {self.settings.time_sleep:g}s"
        log.error(
            "assignment %s: %s (attempt %d of %d, %s): %s",
            entry.id,
            outcome.headline,
            entry.attempts,
            MAX_SCORING_ATTEMPTS,
            then,
            describe(exc),
            exc_info=exc if outcome.traceback else None,
        )
        if last:
            reason = f"{outcome.headline} after {entry.attempts} attempts: {describe(exc)}"
            return self._decide_failed(entry, reason, "unexpected")
        retry_at = self.clock.time() + self.settings.time_sleep
        return self.journal.retry_later(entry, f"{outcome.headline}: {describe(exc)}", retry_at)

    def _postpone_transient(self, entry: Entry, exc: Exception) -> Entry:
        age = self.clock.time() - entry.received_at
        if age > PENDING_TTL_SECONDS:
            entry = self.journal.dropped(entry, f"transient faults for {age / 3600:.0f} h: {exc}")
            log.error(
                "assignment %s: dropped after %.0f h of transient faults", entry.id, age / 3600
            )
            self._finish(entry)
            return entry
        retry_at = self.clock.time() + self.settings.time_sleep
        entry = self.journal.postpone(entry, f"transient: {exc}", retry_at)
        log.warning(
            "assignment %s: transient fault (%s); retrying in %gs",
            entry.id,
            exc,
            self.settings.time_sleep,
        )
        return entry

    def _decide_failed(
        self, entry: Entry, reason: str, kind: FailedKind, took: Took | None = None
    ) -> Entry:
        return self._submit(self.journal.failed(entry, reason, kind), took)

    # --- submission --------------------------------------------------------------------

    def _submit_due(self, pending: list[Entry]) -> bool:
        return self._submit_pending(self._due(pending, UNSUBMITTED))

    def _submit_pending(self, entries: list[Entry]) -> bool:
        for entry in entries:
            if self.stop.is_set():  # each would get a grace period to end: kept for the next run
                break
            self._submit(entry)
        return bool(entries)

    def _submit(self, entry: Entry, took: Took | None = None) -> Entry:
        """Submits a decided result and records what the API's answer made of it
        (validator/ledger/submitting.py); once the API has it, one line says what it came to."""
        started = self.clock.monotonic()
        # Below the floor still: a decided result is better submitted before it expires, and
        # the reserve that ensure_writable() keeps records the API's answer.
        self.journal.ensure_writable(floor=False)
        try:
            verdict = submit_result(self.client, entry, self.settings.time_sleep, self.clock.time)
        except OperatorError as exc:  # the API refused the key
            raise Stop(ExitCode.OPERATOR, str(exc)) from exc
        # The verdict recorded, then told: a line never says what the journal does not hold.
        match verdict.action:
            case SubmitAction.SUBMITTED:
                entry = self.journal.submitted(entry, verdict.reason)
            case SubmitAction.DROPPED:
                entry = self.journal.dropped(entry, verdict.reason)
            case SubmitAction.KEPT:
                entry = self.journal.defer_submit(
                    entry, verdict.reason, verdict.retry_at, verdict.taken
                )
            case _:
                assert_never(verdict.action)
        log.log(verdict.level, "assignment %s: %s", entry.id, verdict.told)
        self.hooks.after_submit(entry, self.clock.monotonic() - started)
        if entry.state is State.SUBMITTED:
            plain = entry.outcome == "completed" and entry.penalty is None
            line = result_line(entry, *(took or Took({}, None)))
            log.log(logging.INFO if plain else logging.WARNING, "%s", line)
        if entry.state in FINAL:  # submitted, or dropped as too late
            self._finish(entry)
        return entry

    def _finish(self, entry: Entry) -> None:
        """Submitted or dropped: nothing more will happen to it."""
        self.finished += 1
        self.hooks.after_finish(entry)


def _attempts_used_up(entry: Entry) -> tuple[str, FailedKind]:
    """The reason for failing an assignment whose last attempt ended the process."""
    unexpected = OUTCOMES[Verdict.UNEXPECTED].headline
    if entry.error and entry.error.startswith(unexpected):
        return (
            f"{entry.attempts} scoring attempts without a result (unexpected errors, then the "
            f"process ended); the last error recorded: {entry.error}"
        ), "unexpected"
    return f"scoring ended the process {entry.attempts} times (crash or device fault)", "crashed"


def _submission_of(entry: Entry) -> str:
    """The submission's repo in the scoring line, where the input names one."""
    repo = entry.input.get("hg_repo_id")
    return f", {bounded(one_line(repo), 100)}" if isinstance(repo, str) and repo else ""
