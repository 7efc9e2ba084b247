"""Submitting a decided result, and reading truthfully what the API's answer tells of it
(docs/fed-ledger-api.md, "Submit answers"): nothing leaves the journal unless the API has it
or will never take it. The verdict is the runner's to record (validator/runner.py); nothing here
writes the journal."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from validator.errors import assert_never
from validator.ledger.answers import ApiUnavailable, SubmitAnswer, SubmitResult, SubmitStatus
from validator.ledger.client import FedLedgerClient
from validator.state.entry import Entry, State

# A submit answered with a 4xx the client does not know is sent again after this long.
REJECTED_RETRY_SECONDS = 3600.0
# How the journal's error of a kept result starts when a try of it may have reached the API,
# for the operator; what that try met is in the entry's maybe_taken, which decides.
MAYBE_TAKEN = "submit, maybe taken by the API: "
LATER = "; then: "


class SubmitAction(Enum):
    """What the runner does with a result once the API has answered its submit."""

    SUBMITTED = "submitted"  # the API has it: recorded as submitted
    DROPPED = "dropped"  # too late: the API will never take it
    KEPT = "kept"  # kept in the journal, sent again at `retry_at`


@dataclass(frozen=True)
class SubmitVerdict:
    """What a submit's answer makes of the result: its `action`, with `reason` (a note when
    the API's having it is inferred, why it was dropped or kept), `retry_at` for a kept one,
    and `taken`: what a try met that the API may have taken (None: none did). `told` is the
    line the operator reads once the journal holds it, at `level`."""

    action: SubmitAction
    reason: str = ""
    retry_at: float = 0.0
    taken: str | None = None
    level: int = logging.DEBUG
    told: str = ""


def submit_result(
    client: FedLedgerClient,
    entry: Entry,
    time_sleep: float,
    now: Callable[[], float] = time.time,
) -> SubmitVerdict:
    """Submits `entry`'s result; returns what the API's answer makes of it. A
    OperatorError from the client (the key refused) is raised on. `now`: the runner's
    clock, for the next try."""
    status: SubmitStatus = "completed" if entry.state is State.SCORED else "failed"
    # An earlier pass or process kept it after a try the API may have taken: what it met.
    kept_after = entry.maybe_taken
    try:
        result = client.submit(entry.id, status, entry.metrics)
    except ApiUnavailable as exc:  # no answer that settles it: kept for another try
        wait = max(time_sleep, exc.retry_after or 0.0)
        taken: str | None
        if exc.maybe_processed:
            taken, reason = str(exc), f"{MAYBE_TAKEN}{exc}"
        elif kept_after:
            taken, reason = kept_after, f"{MAYBE_TAKEN}{kept_after}{LATER}{exc}"
        else:
            taken, reason = kept_after, f"submit: {exc}"
        told = f"submit failed ({exc}); kept in the journal, retrying in {wait:g}s"
        return SubmitVerdict(SubmitAction.KEPT, reason, now() + wait, taken, logging.WARNING, told)
    earlier = result.earlier or kept_after
    match result.kind:
        case SubmitAnswer.ACCEPTED:
            # At INFO the runner's line says what was submitted (validator/observe/lines.py).
            return SubmitVerdict(SubmitAction.SUBMITTED, told=f"submitted as {status}")
        case SubmitAnswer.NOT_VALIDATING:
            return _not_validating(client, entry, result, status, earlier)
        case SubmitAnswer.REJECTED:
            return _rejected(result, status, earlier, max(time_sleep, REJECTED_RETRY_SECONDS), now)
        case _:
            assert_never(result.kind)


def _not_validating(
    client: FedLedgerClient,
    entry: Entry,
    result: SubmitResult,
    status: SubmitStatus,
    earlier: str | None,
) -> SubmitVerdict:
    if earlier:
        # Refused as a repeat: the API most likely has the result from the earlier try.
        note = (
            f"submitted; the API's answer to an earlier try was lost ({earlier}), the repeat "
            f"was refused as not validating (taken by that try, unless it expired between)"
        )
        return SubmitVerdict(
            SubmitAction.SUBMITTED, note, level=logging.WARNING, told=f"{status} result {note}"
        )
    reason = f"too late: the API says {result.detail!r}"
    if entry.received_at < client.started_at:
        # A process killed between the API's answer and its journal write left it.
        reason += "; or an earlier process submitted it and ended before recording that"
    return SubmitVerdict(
        SubmitAction.DROPPED, reason, level=logging.WARNING, told=f"{reason}; result dropped"
    )


def _rejected(
    result: SubmitResult,
    status: SubmitStatus,
    earlier: str | None,
    wait: float,
    now: Callable[[], float],
) -> SubmitVerdict:
    """Not this result's fault that we know of, nor the API's final word on it: the operator is
    told, and it is sent again after a long wait; once the assignment expires, the API's "not
    validating" drops it."""
    reason = f"the API rejected the submit: HTTP {result.status}: {result.detail}"
    if earlier:
        reason = f"{MAYBE_TAKEN}{earlier}{LATER}{reason}"
    told = (
        f"the API rejected the {status} result (HTTP {result.status}: {result.detail}); "
        f"operator action may be needed (--api-url?); it stays in the journal, sent again in "
        f"{wait:g}s"
    )
    return SubmitVerdict(SubmitAction.KEPT, reason, now() + wait, earlier, logging.ERROR, told)
