"""The caps of the bounded reader (bounded_reader.py): what each kind of call may send, in bytes
and JSON values (`ANSWER_CAPS`, docs/reliability.md "Byte caps on answers": a test compares the
two), the cap of the calls in progress (`reading_at_most`), and the counting against a cap that
every hook of the reader shares (docs/internals.md, "The bounded reader")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from validator.errors import AnswerTooLarge
from validator.outbound.safe_json import MAX_DEPTH, shape

KIB = 1024
MIB = 1024 * KIB
CHUNK = 64 * KIB


@dataclass(frozen=True)
class Cap:
    """What one kind of call may send: `max_bytes` of answer, and for JSON `max_values`
    values (None: not JSON, a file streamed to disk); `over` says what an answer past it gets
    (the docs' table)."""

    kind: str
    max_bytes: int
    max_values: int | None
    over: str
    listed: int | None = None  # a file's: the size its listing gave


# The table (docs/reliability.md "Byte caps on answers" is this table; a test compares them).
# Each cap is many times the biggest honest answer of its kind, and small enough that decoding
# an answer at the cap costs the validator's process tens of megabytes at most.
ANSWER_CAPS: dict[str, Cap] = {
    cap.kind: cap
    for cap in (
        Cap(
            "ledger.tasks",
            2 * MIB,
            100_000,
            "transient: GET /tasks/list fails (at start: one warning, and it is asked again after "
            "`--time-sleep` before any lookup), not tried again within the call",
        ),
        Cap(
            "ledger.lookup",
            4 * MIB,
            20_000,
            "transient: no assignment taken (the one the API handed out expires there); the "
            "task is asked again after its interval",
        ),
        Cap(
            "ledger.submit",
            64 * KIB,
            1_000,
            "transient, the API may have taken it: the result is kept and submitted again "
            "(a repeat refused as not validating is recorded as submitted)",
        ),
        Cap(
            "hub.listing",
            4 * MIB,
            100_000,
            "a submission's repo: the submission's (failed; -999 in llm_judge); a base "
            "model's: transient (the cached snapshot stands in when there is one)",
        ),
        Cap(
            "hub.metadata",
            1 * MIB,
            20_000,
            "as the call it belongs to (any other Hub answer: headers, redirects, errors)",
        ),
        Cap(
            "hub.file",
            1 * MIB,
            None,
            "the file's listed size plus this: a submission's file, the submission's; a base "
            "model's, transient",
        ),
        Cap(
            "hub.unlisted",
            64 * MIB,
            None,
            "a file the Hub's listing gives no size for (the kit's own downloads refuse one "
            "before asking for it): as `hub.file`",
        ),
        Cap(
            "judge.models",
            4 * MIB,
            100_000,
            "the listing fails: the judge is unusable (exit 3 at start)",
        ),
        Cap(
            "judge.completion",
            1 * MIB,
            20_000,
            "a failed attempt, tried again; after the retries the judge is failing "
            "(the assignment kept, exit 3)",
        ),
        Cap(
            "github.commits",
            1 * MIB,
            50_000,
            "the protocol drift is unknown (said once), asked again in 30 min",
        ),
        Cap(
            "release.listing",
            4 * MIB,
            100_000,
            "the releases' list is unavailable: --follow-releases keeps its release and asks "
            "again at its next look",
        ),
        Cap(
            "release.asset",
            64 * KIB,
            None,  # decoded by verify alone: the signature within 16 values, the manifest signed
            "the release is unavailable (its signature: 4 KiB): --pull stops (exit 3, nothing "
            "built), --follow-releases asks again at its next look",
        ),
        Cap(
            "registry.pull",
            64 * KIB,
            1_000,
            "a line of the engine's pull progress: the pull fails (run.py --pull, a build's base, "
            "an `--image`: one line, exit 3)",
        ),
    )
}


def file_cap(size: int | None) -> Cap:
    """The cap of a file listed at `size` bytes (None: not listed, the `hub.unlisted` cap: a
    2 MiB gzip answer inflates to gigabytes in the HF cache)."""
    if size is None:
        return ANSWER_CAPS["hub.unlisted"]
    base = ANSWER_CAPS["hub.file"]
    return Cap(base.kind, size + base.max_bytes, None, base.over, listed=size)


# -- the cap of the calls in progress ---------------------------------------------------------

_UNSET: Any = object()
_current: ContextVar[Any] = ContextVar("validator_answer_cap", default=_UNSET)


@contextmanager
def reading_at_most(cap: Cap | None) -> Iterator[None]:
    """Answers read in this thread within: capped at `cap` by any capped adapter or transport,
    whatever cap it was given; None: not capped (a file of unknown size streamed to disk)."""
    token = _current.set(cap)
    try:
        yield
    finally:
        _current.reset(token)


def current_cap(default: Cap | None) -> Cap | None:
    """The cap of `reading_at_most` around this call, else `default`."""
    cap = _current.get()
    return default if cap is _UNSET else cap


def where(url: str) -> str:
    """A URL as messages name it: without its query."""
    split = urlsplit(str(url))
    return f"{split.scheme}://{split.netloc}{split.path}"


def too_large(cap: Cap, what: str, read: int) -> AnswerTooLarge:
    if cap.listed is not None:
        why = f"the Hub sent more than {cap.max_bytes} bytes of a file it listed at {cap.listed}"
    else:
        why = f"the answer is over the {cap.max_bytes} bytes a {cap.kind} answer may have"
    return AnswerTooLarge(f"{what}: {why}", kind=cap.kind, max_bytes=cap.max_bytes)


def encoded(cap: Cap, what: str, coding: str) -> AnswerTooLarge:
    """An answer that came content-encoded where none was asked for: its size once decoded is
    not bounded by what was sent (a gzip bomb), nor, for a file, what it writes to disk."""
    return AnswerTooLarge(
        f"{what}: the answer came {coding}-encoded, which was not asked for (its size once "
        "decoded is not bounded)",
        kind=cap.kind,
        max_bytes=cap.max_bytes,
    )


def _too_many_values(cap: Cap, what: str) -> AnswerTooLarge:
    return AnswerTooLarge(
        f"{what}: the answer holds more than the {cap.max_values} JSON values a {cap.kind} "
        "answer may have",
        kind=cap.kind,
        max_bytes=cap.max_bytes,
    )


def check_values(data: bytes, cap: Cap, what: str) -> None:
    """Raises AnswerTooLarge when `data` (within the byte cap) holds more JSON values than
    `cap` allows, or nests deeper than MAX_DEPTH; counted on the bytes, nothing decoded, so
    that whatever parses it next (the library's own `.json()`) neither grows without bound
    nor recurses past what Python can."""
    if cap.max_values is None:
        return
    values, too_deep = shape(data)
    if values > cap.max_values:
        raise _too_many_values(cap, what)
    if too_deep:
        raise AnswerTooLarge(
            f"{what}: the answer nests deeper than the {MAX_DEPTH} levels any answer may have",
            kind=cap.kind,
            max_bytes=cap.max_bytes,
        )


class ByteCounter:
    """Bytes of one answer against its cap."""

    def __init__(self, cap: Cap, what: str) -> None:
        self.cap, self.what, self.read = cap, what, 0

    def add(self, size: int) -> None:
        self.read += size
        if self.read > self.cap.max_bytes:
            raise too_large(self.cap, self.what, self.read)
