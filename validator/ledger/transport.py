"""The HTTP transport of the Fed Ledger client (ledger/client.py): tries, retries, deadlines.

requests' timeouts bound each read, not a call: a server that trickles a byte every few seconds
holds a call forever. So each try runs within what is left of the call's overall deadline, the
one outbound deadline (validator/outbound/deadline.py), which also ends it STOP_GRACE_S after a stop
signal: its socket is shut, so no try outlives the call and none goes on to send a request later.
Retries are made here, not by urllib3, so that they share that deadline, wait out a bounded
Retry-After, and report whether a try the API may have processed came before the final answer (a
submit refused as "not validating" after such a try was most likely taken by it). Which answers are
failures to try again is not decided here: ledger/answers.py says (`try_again`), with the call's
Policy; this module keeps the mechanics of trying.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime
from typing import Any

import requests
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError

from validator.errors import AnswerTooLarge, RequestNotSendable
from validator.ledger.answers import (
    ApiUnavailable,
    Policy,
    TryAgain,
    try_again,
)
from validator.observe import telemetry
from validator.outbound.answer_caps import ANSWER_CAPS, Cap
from validator.outbound.bounded_reader import capped_session
from validator.outbound.deadline import STOP_GRACE_S, CallAbandoned, overall_deadline

log = logging.getLogger(__name__)

DEFAULT_DEADLINE_S = 300.0
# STOP_GRACE_S (outbound/deadline.py): a try in progress when a stop signal comes gets this long to
# end by itself: a submit that is merely finishing still goes out, a stuck one no longer holds the
# shutdown. A longer Retry-After is not waited out inside a call: the call ends, and the runner
# retries it no sooner than that (bounded again to this) later.
MAX_RETRY_AFTER_S = 180.0
BACKOFF_MAX_S = 60.0
# Faults of the network or the server, which a later try may not meet. Any other error raised
# while sending (a URL without a host, a header value with a carriage return) happens before a
# byte is sent and would happen again on every try: retrying it kept the loop waiting forever.
TRANSIENT_REQUEST_ERRORS = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,
    requests.exceptions.ContentDecodingError,
    requests.exceptions.RetryError,
)
# Their text quotes the offending header value, which can only be the API key here.
HEADER_ERRORS = (requests.exceptions.InvalidHeader, UnicodeError)


class CallInterrupted(ApiUnavailable):
    """A stop signal ended the call before it had an answer."""


@dataclass(frozen=True)
class Reply:
    response: requests.Response
    # What an earlier try of this call met that the API may have processed, its answer lost.
    earlier: str | None = None
    retry_after: float | None = None


@dataclass(frozen=True)
class _Failure:
    why: str
    maybe_processed: bool
    retry_after: float | None = None
    final: bool = False
    kind: str = "error"  # the metrics' label: http_503, ReadTimeout, abandoned...


class Transport:
    def __init__(
        self,
        api_key: str,
        api_url: str,
        *,
        timeout: tuple[float, float],
        retries: int,
        backoff: float,
        deadline: float,
        stop: threading.Event | None,
    ) -> None:
        self.api_key = api_key
        self.api_url = api_url
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.deadline = deadline
        self.stop = stop or threading.Event()

    def call(self, method: str, path: str, body: dict[str, Any] | None, policy: Policy) -> Reply:
        # json.dumps' default allows Infinity/NaN, like the reference client (requests' json=).
        payload = None if body is None else json.dumps(body)
        end = time.monotonic() + self.deadline
        earlier: str | None = None
        tries = 0
        while True:
            tries += 1
            response: requests.Response | None = None
            try:
                response = self._try(method, f"{self.api_url}{path}", payload, end, policy)
                log.debug("%s %s -> %s", method, path, response.status_code)
                status = telemetry.status_label(response.status_code)
                telemetry.API_ANSWERS.labels(policy.name, status).inc()
                verdict = try_again(response, policy)
                if verdict is None:  # the call's answer
                    return Reply(response, earlier)
                failure = _answer_failure(verdict)
            except _Abandoned as abandoned:
                failure = _Failure(str(abandoned), abandoned.sent, final=True, kind="abandoned")
            except AnswerTooLarge as exc:
                # The API's doing, and what it sent once it would send again: not tried again
                # within the call. The request was processed (its answer is unreadable).
                failure = _Failure(str(exc), True, final=True, kind="over_cap")
            except TRANSIENT_REQUEST_ERRORS as exc:
                why, sent = f"{type(exc).__name__}: {exc}", not _never_sent(exc)
                failure = _Failure(why, sent, kind=type(exc).__name__)
            except (requests.RequestException, ValueError) as exc:
                # `from None`: the cause's text may quote the key, and nothing more is known.
                raise RequestNotSendable(_not_sendable(method, path, exc)) from None
            wait = self._wait_before(tries, failure, policy)
            if wait is not None and time.monotonic() + wait >= end:
                wait, failure = None, self._out_of_time(failure)
            if wait is None:
                telemetry.API_ERRORS.labels(policy.name, failure.kind).inc()
                return self._give_up(method, path, response, failure, earlier)
            telemetry.API_RETRIES.labels(policy.name, failure.kind).inc()
            log.warning("%s %s: %s; trying again in %.3gs", method, path, failure.why, wait)
            if failure.maybe_processed:
                earlier = failure.why
            if self.stop.wait(wait):
                raise CallInterrupted(
                    f"{method} {path}: {failure.why}; not tried again: stopping",
                    maybe_processed=earlier is not None,
                )

    def _wait_before(self, tries: int, failure: _Failure, policy: Policy) -> float | None:
        """Seconds to wait before the next try, None for no next try (the deadline aside)."""
        if failure.final or tries > self.retries or self.stop.is_set():
            return None
        if failure.maybe_processed and not policy.after_processing:
            return None
        # urllib3's schedule: at once, then backoff * 2, 4, 8...; a Retry-After instead.
        backoff = 0.0 if tries == 1 else min(self.backoff * 2 ** (tries - 1), BACKOFF_MAX_S)
        return max(backoff, failure.retry_after or 0.0)

    def _out_of_time(self, failure: _Failure) -> _Failure:
        """A try's own timeout may fire just before the call's deadline does: the call still
        ended for want of time, and says so whichever fired first."""
        why = f"{failure.why}; no time left of the {self.deadline:g} s deadline for another try"
        return replace(failure, why=why)

    def _give_up(
        self,
        method: str,
        path: str,
        response: requests.Response | None,
        failure: _Failure,
        earlier: str | None,
    ) -> Reply:
        if response is not None:  # the caller makes sense of the last answer
            return Reply(response, earlier, failure.retry_after)
        exc = CallInterrupted if self.stop.is_set() else ApiUnavailable
        raise exc(
            f"{method} {path}: {failure.why}",
            maybe_processed=failure.maybe_processed or earlier is not None,
        )

    def _try(
        self, method: str, url: str, payload: str | None, end: float, policy: Policy
    ) -> requests.Response:
        """One request, abandoned at `end` or STOP_GRACE_S after a stop signal; its answer read
        under the call's cap (past it: AnswerTooLarge, nothing more read)."""
        remaining = end - time.monotonic()
        if remaining <= 0:
            raise _Abandoned(f"no time left of the {self.deadline:g} s deadline", sent=False)
        timeout = (min(self.timeout[0], remaining), min(self.timeout[1], remaining))
        with _session(self.api_key, ANSWER_CAPS[policy.cap]) as session:
            try:
                with overall_deadline(
                    remaining, f"{method} {url}", stop=self.stop, stop_grace=STOP_GRACE_S
                ):
                    # Not streamed: the whole answer, up to its cap, is read within the deadline.
                    return session.request(
                        method, url, data=payload, timeout=timeout, allow_redirects=False
                    )
            except CallAbandoned as abandoned:
                why = (
                    "abandoned: stopping"
                    if abandoned.stopped
                    else f"no answer within the {self.deadline:g} s deadline"
                )
                raise _Abandoned(why) from None


class _Abandoned(Exception):
    """A try given up on: its socket was shut, or it was never started (`sent`: False)."""

    def __init__(self, why: str, *, sent: bool = True) -> None:
        super().__init__(why)
        self.sent = sent


def _answer_failure(verdict: TryAgain) -> _Failure:
    """An answer that answers.try_again found unsettling, with the wait it asks for, bounded."""
    retry_after = retry_after_seconds(verdict.retry_after)
    return _Failure(verdict.why, verdict.maybe_processed, retry_after, kind=verdict.kind)


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """A Retry-After header (seconds, or an HTTP date) as seconds from now, within
    [0, MAX_RETRY_AFTER_S]; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            # A year past what a C integer holds is an OverflowError: uncaught, one header of
            # any 408, 429 or 5xx would end the validator.
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _never_sent(exc: Exception) -> bool:
    """Whether connecting failed, so that nothing was sent (refused, no such host, timeout)."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    cause = exc.args[0] if exc.args else None
    return isinstance(exc, requests.ConnectionError) and (
        isinstance(cause, MaxRetryError) and isinstance(cause.reason, ConnectTimeoutError)
    )


def _not_sendable(method: str, path: str, exc: Exception) -> str:
    if isinstance(exc, HEADER_ERRORS):
        what = "a header value is not valid in HTTP; check --flock-api-key / FLOCK_API_KEY"
    else:
        what = f"{exc}; check --api-url / FLOCK_API_URL"
    return f"{method} {path} cannot be sent ({type(exc).__name__}: {what})"


def user_agent() -> str:
    """The validator names itself to the API; a fleet's worker (run.py sets VALIDATOR_WORKER)
    adds its name, so that the API's logs can tell one host's workers apart."""
    worker = os.environ.get("VALIDATOR_WORKER", "").strip()
    return f"flock-validator (worker {worker})" if worker else "flock-validator"


def _session(api_key: str, cap: Cap) -> requests.Session:
    """A session for one try: nothing is reused, so every connection of a try is connected
    within its deadline (which covers only those) and nothing of an abandoned try lingers. No
    retries by urllib3 (Transport.call makes them) and, as requests' default, none after a
    read error. Its answers are read under `cap` (the bounded reader)."""
    session = capped_session(cap)
    session.headers.update(
        {"flock-api-key": api_key, "Content-Type": "application/json", "User-Agent": user_agent()}
    )
    return session
