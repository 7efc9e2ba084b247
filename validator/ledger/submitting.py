"""Submitting a decided result, and recording truthfully what the API's answer tells of it
(docs/fed-ledger-api.md, "Submit answers"): nothing leaves the journal unless the API has it
or will never take it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from validator.ledger.answers import ApiUnavailable
from validator.ledger.client import FedLedgerClient
from validator.state.entry import Entry, State
from validator.state.journal import Journal

log = logging.getLogger(__name__)

# A submit answered with a 4xx the client does not know is sent again after this long.
REJECTED_RETRY_SECONDS = 3600.0
# How the journal's error of a kept result starts when a try of it may have reached the API,
# for the operator; what that try met is in the entry's maybe_taken, which decides.
MAYBE_TAKEN = "submit, maybe taken by the API: "
LATER = "; then: "


def submit_result(
    client: FedLedgerClient,
    journal: Journal,
    entry: Entry,
    time_sleep: float,
    now: Callable[[], float] = time.time,
) -> Entry:
    """Submits `entry`'s result; returns the entry as the journal then holds it: finished
    (submitted, or dropped as too late), or kept for a later try. A RecoverableException from
    the client (the key refused) is raised on. `now`: the runner's clock, for the next try."""
    # Below the floor still: a decided result is better submitted before it expires, and the
    # reserve that ensure_writable() keeps records the API's answer.
    journal.ensure_writable(floor=False)
    status = "completed" if entry.state is State.SCORED else "failed"
    # An earlier pass or process kept it after a try the API may have taken: what it met.
    kept_after = entry.maybe_taken
    try:
        result = client.submit(entry.id, status, entry.metrics)
    except ApiUnavailable as exc:
        wait = max(time_sleep, exc.retry_after or 0.0)
        taken = str(exc) if exc.maybe_processed else kept_after
        if exc.maybe_processed:
            reason = f"{MAYBE_TAKEN}{exc}"
        elif kept_after:
            reason = f"{MAYBE_TAKEN}{kept_after}{LATER}{exc}"
        else:
            reason = f"submit: {exc}"
        kept = journal.defer_submit(entry, reason, now() + wait, taken)
        log.warning(
            "assignment %s: submit failed (%s); kept in the journal, retrying in %gs",
            entry.id,
            exc,
            wait,
        )
        return kept
    earlier = result.earlier or kept_after
    if result.kind == "accepted":
        done = journal.submitted(entry)
        # At INFO the runner's line says what was submitted (validator/observe/lines.py).
        log.debug("assignment %s: submitted as %s", entry.id, status)
        return done
    if result.kind == "not_validating" and earlier:
        # Refused as a repeat: the API most likely has the result from the earlier try.
        note = (
            f"submitted; the API's answer to an earlier try was lost ({earlier}), the repeat "
            f"was refused as not validating (taken by that try, unless it expired between)"
        )
        done = journal.submitted(entry, note)
        log.warning("assignment %s: %s result %s", entry.id, status, note)
        return done
    if result.kind == "not_validating":
        reason = f"too late: the API says {result.detail!r}"
        if entry.received_at < client.started_at:
            # A process killed between the API's answer and its journal write left it.
            reason += "; or an earlier process submitted it and ended before recording that"
        done = journal.dropped(entry, reason)
        log.warning("assignment %s: %s; result dropped", entry.id, reason)
        return done
    # Not this result's fault that we know of, nor the API's final word on it: the operator is
    # told, and it is sent again after a long wait; once the assignment expires, the API's "not
    # validating" drops it.
    wait = max(time_sleep, REJECTED_RETRY_SECONDS)
    reason = f"the API rejected the submit: HTTP {result.status}: {result.detail}"
    if earlier:
        reason = f"{MAYBE_TAKEN}{earlier}{LATER}{reason}"
    kept = journal.defer_submit(entry, reason, now() + wait, earlier)
    log.error(
        "assignment %s: the API rejected the %s result (HTTP %s: %s); operator action may be "
        "needed (--api-url?); it stays in the journal, sent again in %gs",
        entry.id,
        status,
        result.status,
        result.detail,
        wait,
    )
    return kept
