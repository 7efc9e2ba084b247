"""The one reader of answers from outside: the Fed Ledger's, the Hub's, a judge's, GitHub's, a
registry's. Whatever library makes the call, what the validator's process reads of an answer is
capped by the kind of call (`ANSWER_CAPS`, answer_caps.py): in bytes as they arrive, in JSON
values and depth before anything decodes them, within the overall deadline (deadline.py). One
hook per HTTP stack: `CappedAdapter` for requests, `capped_event_hooks` for httpx and httpx2.
How and why: docs/internals.md, "The bounded reader".
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import requests
from pydantic import BaseModel
from requests.adapters import BaseAdapter, HTTPAdapter

from validator.errors import AnswerTooLarge
from validator.outbound.answer_caps import (
    ANSWER_CAPS,
    CHUNK,
    ByteCounter,
    Cap,
    check_values,
    current_cap,
    encoded,
    too_large,
    where,
)
from validator.outbound.deadline import overall_deadline
from validator.outbound.safe_json import loads_bounded

M = TypeVar("M", bound=BaseModel)

# -- requests ---------------------------------------------------------------------------------


def wire_limit(cap: Cap) -> int:
    """What the connection may carry of one answer after its head: its body's cap, and a 16th
    of it (at least CHUNK) for the chunked framing and trailers around the body."""
    return cap.max_bytes + max(cap.max_bytes // 16, CHUNK)


class _CountedFile:
    """The socket file that http.client reads one answer's body from (`HTTPResponse.fp`), every
    byte taken from it counted against `wire_limit`: the body's count (_CappedRaw) never sees a
    chunked answer's framing nor its trailer fields, which http.client and urllib3 read and
    discard without any limit on their number (6 GB of trailers after a 2 MiB-capped task list:
    9.3 s of reading, and the list accepted, were they not counted here)."""

    def __init__(self, fp: Any, cap: Cap, what: str, close: Any) -> None:
        self._fp, self._cap, self._what, self._close = fp, cap, what, close
        self._limit, self._read = wire_limit(cap), 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fp, name)

    def _took(self, size: int) -> None:
        self._read += size
        if self._read > self._limit:
            self._close()  # nothing more is read; the connection is not reused
            raise too_large(self._cap, self._what, self._read)

    def read(self, amt: int | None = None) -> bytes:
        # A chunk may declare any size, and http.client reads it in one call: read here a
        # CHUNK at a time, so that what is taken is counted before more is.
        want = amt if amt is not None and amt >= 0 else None
        parts, got = [], 0
        while want is None or got < want:
            part = self._fp.read(CHUNK if want is None else min(CHUNK, want - got))
            if not part:
                break
            self._took(len(part))
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def read1(self, amt: int = -1) -> bytes:
        data = self._fp.read1(amt)
        self._took(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        size = self._fp.readinto(buffer)
        self._took(size or 0)
        return size

    def readline(self, limit: int = -1) -> bytes:
        left = self._limit - self._read + 1  # a line that fills it is past the limit
        line = self._fp.readline(left if limit < 0 else min(limit, left))
        self._took(len(line))
        return line


def _count_the_connection(raw: Any, cap: Cap, what: str) -> None:
    """Puts a _CountedFile under urllib3's response (`raw`), between http.client and the
    socket: urllib3 2.x reads through `raw._fp` (http.client's HTTPResponse), whose `fp` is the
    socket file, on HTTP and HTTPS alike."""
    answer = getattr(raw, "_fp", None)
    fp = getattr(answer, "fp", None)
    if answer is not None and fp is not None and not isinstance(fp, _CountedFile):
        answer.fp = _CountedFile(fp, cap, what, raw.close)


class _CappedRaw:
    """A urllib3 response whose reads count against a cap; everything else is the response's.
    requests reads a body through `stream` (or `read`), so that is where the cap sits, and the
    connection's bytes are counted beneath (`_CountedFile`). A JSON answer is read whole
    (within the cap) and its values counted before the first byte goes on to whoever parses
    it."""

    def __init__(self, raw: Any, cap: Cap, what: str) -> None:
        self._raw = raw
        self._counter = ByteCounter(cap, what)
        _count_the_connection(raw, cap, what)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def _count(self, size: int) -> None:
        try:
            self._counter.add(size)
        except AnswerTooLarge:
            self._raw.close()  # nothing more is read; the connection is not reused
            raise

    def stream(self, amt: int | None = CHUNK, decode_content: bool | None = None) -> Iterator:
        cap = self._counter.cap
        if cap.max_values is None:
            for chunk in self._raw.stream(amt, decode_content=decode_content):
                self._count(len(chunk))
                yield chunk
            return
        body = bytearray()
        for chunk in self._raw.stream(amt, decode_content=decode_content):
            self._count(len(chunk))
            body += chunk
        check_values(bytes(body), cap, self._counter.what)
        if body:
            yield bytes(body)

    def read(
        self, amt: int | None = None, decode_content: bool | None = None, **kwargs: Any
    ) -> bytes:
        if amt is not None:
            # Never more than one byte past the cap in one read (a caller may ask for a whole
            # chunk of any size the server declared); a short read is a read.
            amt = max(min(amt, self._counter.cap.max_bytes - self._counter.read + 1), 1)
            data = self._raw.read(amt, decode_content=decode_content, **kwargs)
            self._count(len(data))
            return data
        parts = []  # never one unbounded read
        while chunk := self._raw.read(CHUNK, decode_content=decode_content, **kwargs):
            self._count(len(chunk))
            parts.append(chunk)
        return b"".join(parts)


class CappedAdapter(BaseAdapter):
    """A requests transport adapter around `inner` (an HTTPAdapter unless given) whose answers
    are read under `cap` (or the cap of `reading_at_most` around the call; None: not capped).
    Mount it where the session would mount the adapter it wraps."""

    def __init__(self, cap: Cap | None, inner: BaseAdapter | None = None) -> None:
        super().__init__()
        self.cap = cap
        self.inner = inner if inner is not None else HTTPAdapter(max_retries=0)

    def send(
        self, request: requests.PreparedRequest, *args: Any, **kwargs: Any
    ) -> requests.Response:
        # The session's arguments (stream, timeout, verify, cert, proxies) go on to `inner`.
        cap = current_cap(self.cap)
        if cap is not None and cap.max_values is None:
            # A file goes to disk as it is sent: no content coding asked for, none taken.
            request.headers["Accept-Encoding"] = "identity"
        response = self.inner.send(request, *args, **kwargs)
        if cap is not None and response.raw is not None:
            what = f"{request.method} {where(request.url or '')}"
            coding = response.headers.get("Content-Encoding", "").strip().lower()
            if cap.max_values is None and coding not in ("", "identity"):
                response.close()
                raise encoded(cap, what, coding)
            response.raw = _CappedRaw(response.raw, cap, what)
        return response

    def close(self) -> None:
        self.inner.close()


def capped_session(cap: Cap | None, inner: BaseAdapter | None = None) -> requests.Session:
    """A session whose http(s) answers are read under `cap` (CappedAdapter); without `inner`,
    urllib3 makes no retries of its own."""
    session = requests.Session()
    adapter = CappedAdapter(cap, inner)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def cap_session(session: requests.Session, cap: Cap | None) -> requests.Session:
    """`session` with each adapter it mounts wrapped in a CappedAdapter (a library's own
    session, made by its factory)."""
    for prefix, adapter in list(session.adapters.items()):
        if not isinstance(adapter, CappedAdapter):
            session.mount(prefix, CappedAdapter(cap, adapter))
    return session


# -- httpx and httpx2 -------------------------------------------------------------------------

_stream_classes: dict[str, type] = {}
_stream_lock = threading.Lock()


def _library(response: Any) -> Any:
    """The httpx-like library (`httpx` or `httpx2`) that `response` belongs to."""
    return importlib.import_module(type(response).__module__.split(".")[0])


def _capped_stream_class(lib: Any) -> type:
    """The library's SyncByteStream (its client checks the type) counting against a cap."""
    with _stream_lock:
        if lib.__name__ in _stream_classes:
            return _stream_classes[lib.__name__]

        class CappedStream(lib.SyncByteStream):
            def __init__(self, inner: Any, cap: Cap, what: str) -> None:
                self.inner, self.counter = inner, ByteCounter(cap, what)

            def __iter__(self) -> Iterator[bytes]:
                cap = self.counter.cap
                body = bytearray()
                try:
                    for chunk in self.inner:
                        self.counter.add(len(chunk))
                        if cap.max_values is None:
                            yield chunk
                        else:
                            body += chunk
                except AnswerTooLarge:
                    self.inner.close()
                    raise
                if cap.max_values is not None:
                    check_values(bytes(body), cap, self.counter.what)
                    yield bytes(body)

            def close(self) -> None:
                self.inner.close()

        _stream_classes[lib.__name__] = CappedStream
        return CappedStream


def capped_event_hooks(cap: Cap | None = None) -> dict[str, list]:
    """Event hooks for an httpx or httpx2 client (`Client(event_hooks=...)`) that read its
    answers under `cap` (or the cap of `reading_at_most` around the call; None: not capped):
    the client calls the response hook before it reads the body, whatever transport, proxy or
    mount carries it, and the hook hands it the body through a counting stream. Requests ask
    for no content coding: the client would decode a compressed answer whole, whatever its
    size once decoded, so an answer that comes encoded all the same is refused."""

    def on_request(request: Any) -> None:
        if current_cap(cap) is not None:
            request.headers["Accept-Encoding"] = "identity"

    def on_response(response: Any) -> None:
        limit = current_cap(cap)
        if limit is None:
            return
        what = f"{response.request.method} {where(response.request.url)}"
        coding = response.headers.get("Content-Encoding", "").strip().lower()
        if coding not in ("", "identity"):
            response.close()
            raise encoded(limit, what, coding)
        stream_class = _capped_stream_class(_library(response))
        response.stream = stream_class(response.stream, limit, what)

    return {"request": [on_request], "response": [on_response]}


# -- our own calls ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """An answer read within its cap: status, headers, the body's bytes."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes
    cap: Cap
    what: str

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body decoded within the cap (JsonRefused, a ValueError, when it is not JSON or
        nests too deep)."""
        return parse(self.content, self.cap, self.what)

    def model(self, model: type[M]) -> M:
        """The body as `model` (pydantic; its `extra` setting decides what unknown keys do)."""
        return model.model_validate(self.json())


def parse(data: bytes, cap: Cap, what: str) -> Any:
    """JSON `data` decoded only within `cap` (bytes, values, depth) and only when its text is
    all Unicode (a lone surrogate would reach a journal, a log line or a request that cannot
    carry it): JsonRefused otherwise."""
    return loads_bounded(
        data, what, max_bytes=cap.max_bytes, max_values=cap.max_values, unicode_only=True
    )


def json_lines(chunks: Iterable[bytes | str], cap: Cap, what: str) -> Iterator[Any]:
    """A stream of JSON messages, one a line (the Docker engine's pull progress), each decoded
    within `cap` as it completes: a line past the cap raises AnswerTooLarge, a line that is not
    JSON JsonRefused; nothing is kept between lines."""
    pending = bytearray()
    for chunk in chunks:
        pending += chunk.encode() if isinstance(chunk, str) else chunk
        while (end := pending.find(b"\n")) >= 0:
            line = bytes(pending[:end]).strip()
            del pending[: end + 1]
            if line:
                yield _line(line, cap, what)
        if len(pending) > cap.max_bytes:
            raise too_large(cap, what, len(pending))
    if pending.strip():
        yield _line(bytes(pending).strip(), cap, what)


def _line(line: bytes, cap: Cap, what: str) -> Any:
    if len(line) > cap.max_bytes:
        raise too_large(cap, what, len(line))
    check_values(line, cap, what)
    return parse(line, cap, what)


def fetch_answer(
    method: str,
    url: str,
    kind: str | Cap,
    *,
    deadline_s: float,
    timeout: tuple[float, float],
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
    data: bytes | str | None = None,
    what: str | None = None,
) -> Answer:
    """One request and its answer, read under the cap of `kind` (a name of ANSWER_CAPS, or a Cap)
    within an overall deadline of `deadline_s`; no redirect is followed (a key never travels
    to another host). Raises AnswerTooLarge past the cap, CallAbandoned past the deadline,
    requests' errors as they come. Parse the answer inside the caller's own overall deadline
    to have it cover the parse too."""
    cap = ANSWER_CAPS[kind] if isinstance(kind, str) else kind
    what = what or f"{method} {where(url)}"
    with capped_session(cap) as session, overall_deadline(deadline_s, what):
        response = session.request(
            method,
            url,
            headers=dict(headers or {}),
            params=dict(params or {}),
            data=data,
            timeout=timeout,
            allow_redirects=False,
        )
        return Answer(response.status_code, response.headers, response.content, cap, what)
