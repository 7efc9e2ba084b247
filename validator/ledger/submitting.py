"""Submitting a decided result, and reading truthfully what the API's answer tells of it
(docs/fed-ledger-api.md, "Submit answers"): nothing leaves the journal unless the API has it
or will never take it. The verdict is the runner's to record (validator/runner.py); nothing here
writes the journal."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from validator.ledger.answers import ApiUnavailable
from validator.ledger.client import FedLedgerClient
from validator.state.entry import Entry, State

# A submit answered with a 4xx the client does not know is sent again after this long.
REJECTED_RETRY_SECONDS = 3600.0
# How the journal's error of a kept result starts when a try of it may have reached the API,
# for the operator; what that try met is in the entry's maybe_taken, which decides.
MAYBE_TAKEN = "submit, maybe taken by the API: "
LATER = "; then: "


@dataclass(frozen=True)
class SubmitVerdict:
    """What a submit's answer makes of the result: `submitted` (`reason`: a note when the API's
    having it is inferred), `dropped` as too late (`reason`), or `kept` for another try at
    `retry_at` (`reason`; `taken`: what a try met that the API may have taken, None: none
    did). `told` is the line the operator reads once the journal holds it, at `level`."""

    action: Literal["submitted", "dropped", "kept"]
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
    status = "completed" if entry.state is State.SCORED else "failed"
    # An earlier pass or process kept it after a try the API may have taken: what it met.
    kept_after = entry.maybe_taken
    try:
        result = client.submit(entry.id, status, entry.metrics)
    except ApiUnavailable as exc:  # no answer that settles it: kept for another try
        wait = max(time_sleep, exc.retry_after or 0.0)
        if exc.maybe_processed:
            taken, reason = str(exc), f"{MAYBE_TAKEN}{exc}"
        elif kept_after:
            taken, reason = kept_after, f"{MAYBE_TAKEN}{kept_after}{LATER}{exc}"
        else:
            taken, reason = kept_after, f"submit: {exc}"
        told = f"submit failed ({exc}); kept in the journal, retrying in {wait:g}s"
        return SubmitVerdict("kept", reason, now() + wait, taken, logging.WARNING, told)
    earlier = result.earlier or kept_after
    if result.kind == "accepted":
        # At INFO the runner's line says what was submitted (validator/observe/lines.py).
        return SubmitVerdict("submitted", told=f"submitted as {status}")
    if result.kind == "not_validating" and earlier:
        # Refused as a repeat: the API most likely has the result from the earlier try.
        note = (
            f"submitted; the API's answer to an earlier try was lost ({earlier}), the repeat "
            f"was refused as not validating (taken by that try, unless it expired between)"
        )
        return SubmitVerdict(
            "submitted", note, level=logging.WARNING, told=f"{status} result {note}"
        )
    if result.kind == "not_validating":
        reason = f"too late: the API says {result.detail!r}"
        if entry.received_at < client.started_at:
            # A process killed between the API's answer and its journal write left it.
            reason += "; or an earlier process submitted it and ended before recording that"
        return SubmitVerdict(
            "dropped", reason, level=logging.WARNING, told=f"{reason}; result dropped"
        )
    # Not this result's fault that we know of, nor the API's final word on it: the operator is
    # told, and it is sent again after a long wait; once the assignment expires, the API's "not
    # validating" drops it.
    wait = max(time_sleep, REJECTED_RETRY_SECONDS)
    reason = f"the API rejected the submit: HTTP {result.status}: {result.detail}"
    if earlier:
        reason = f"{MAYBE_TAKEN}{earlier}{LATER}{reason}"
    told = (
        f"the API rejected the {status} result (HTTP {result.status}: {result.detail}); "
        f"operator action may be needed (--api-url?); it stays in the journal, sent again in "
        f"{wait:g}s"
    )
    return SubmitVerdict("kept", reason, now() + wait, earlier, logging.ERROR, told)
