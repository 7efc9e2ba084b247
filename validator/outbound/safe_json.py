"""Decoding JSON that someone else wrote (a submission's config, a validation set line), within
limits of size and nesting, so that a hostile file fails with a reason instead of exhausting
memory or ending in a RecursionError from the decoder."""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from validator.errors import JsonRefused

MAX_DEPTH = 64  # real adapter configs nest 3 deep, validation lines about 6

# The bytes the counting looks at: quotes (where strings start and end) and structure.
_STRUCTURE = b'",[]{}'
_NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in _STRUCTURE)
# Quotes are paired a window at a time: what one split of a window makes is bounded by it.
_WINDOW = 64 * 1024
# A bracket's step in depth, by byte (the structure holds only brackets, commas and quotes).
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
# An escape that only a UTF-16 surrogate can be (`\ud800`): text that may not be Unicode.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def nesting_depth(text: str | bytes, stop_above: int | None = None) -> int:
    """How deep arrays and objects nest in `text` (brackets inside strings do not count).
    Counting stops past `stop_above`."""
    return _depth(_brackets(_outside_strings(_as_bytes(text))), stop_above)


def value_count(text: str | bytes) -> int:
    """At most how many values the JSON `text` holds (arrays, objects and what they hold: each
    but the first in a container follows a comma; a container after one counts twice),
    counted without decoding it: what decoding would cost in objects, whatever their shape
    (`[{},{},...]` is 24 bytes of Python per 3 bytes of text)."""
    return _values(_outside_strings(_as_bytes(text)))


def shape(text: str | bytes, max_depth: int = MAX_DEPTH) -> tuple[int, bool]:
    """(value_count of `text`, whether it nests deeper than `max_depth`), from one look at its
    structure, nothing decoded: what a library's own parse of an answer would meet, measured
    before it recurses (a 20,000-deep answer is a RecursionError in the decoder)."""
    outside = _outside_strings(_as_bytes(text))
    return _values(outside), _deeper_than(outside, max_depth)


def _deeper_than(outside: bytes, limit: int) -> bool:
    """Whether the brackets nest past `limit`. Depth cannot pass the openers' count, and a
    decoder stops at the first closer with no opener, so only the first 2 x openers + 1
    brackets matter: the cost follows the openers (bounded by a cap's values), not the text."""
    openers = outside.count(b"[") + outside.count(b"{")
    if openers <= limit:
        return False
    brackets = _brackets(outside)[: 2 * openers + 1]
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > limit


def _as_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")


def _outside_strings(data: bytes) -> bytes:
    """The structure of `data` (its commas and brackets) outside its string literals: escaped
    backslashes and quotes dropped first, then every byte but quotes and structure (UTF-8 puts
    no ASCII byte inside a character), then what lies between a quote and the next. All of it
    string operations in C on bytes: a regex per literal takes 0.17 s for a Hub listing at its
    cap, and splitting the whole text on its quotes makes an object per piece (89 MiB and 1.2 s
    holding the interpreter for a 4 MiB `ab"ab"...`)."""
    kept = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    outside, inside = [], False
    for start in range(0, len(kept), _WINDOW):
        pieces = kept[start : start + _WINDOW].split(b'"')
        outside.append(b"".join(pieces[1 if inside else 0 :: 2]))
        inside ^= len(pieces) % 2 == 0  # an odd number of quotes in the window
    return b"".join(outside)


def _brackets(outside: bytes) -> bytes:
    return outside.replace(b",", b"")


def _values(outside: bytes) -> int:
    return outside.count(b",") + outside.count(b"[") + outside.count(b"{") + 1


def _depth(brackets: bytes, stop_above: int | None) -> int:
    depth = deepest = 0
    for char in brackets:
        depth += 1 if char in b"[{" else -1
        if depth > deepest:
            deepest = depth
            if stop_above is not None and deepest > stop_above:
                break
    return deepest


def loads_bounded(
    data: bytes | str,
    what: str,
    *,
    max_bytes: int | None = None,
    max_depth: int = MAX_DEPTH,
    max_values: int | None = None,
    unicode_only: bool = False,
) -> Any:
    """`json.loads` for untrusted text; raises JsonRefused naming `what` and the limit.
    `max_bytes` None: the caller already bounded the size (a capped download, say).
    `max_values`: text holding more values (`value_count`) is refused before it is decoded,
    so that what decoding costs is bounded by the text's size and this, whatever its shape.
    `unicode_only`: text whose strings are not all Unicode (a lone surrogate, `"\\ud800"`:
    valid JSON that no UTF-8 can carry, so a journal, a log or a request cannot either) is
    refused."""
    if max_bytes is not None and len(data) > max_bytes:  # characters <= bytes: a cheap bound
        size = len(data.encode("utf-8") if isinstance(data, str) else data)
        if size > max_bytes:
            raise JsonRefused(f"{what}: {size} bytes, over the limit of {max_bytes}")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise JsonRefused(f"{what}: not UTF-8: {exc}") from exc
    raw = _as_bytes(data)
    outside = None
    if max_values is not None:
        outside = _outside_strings(raw)
        if _values(outside) > max_values:
            raise JsonRefused(f"{what}: holds more than {max_values} JSON values")
    value = _decoded(text, what, max_depth)
    # Measured on what decoded (brackets balanced: as many as its values, when capped); a text
    # the decoder cannot finish for depth raised already.
    brackets = _brackets(outside if outside is not None else _outside_strings(raw))
    if _depth(brackets, max_depth) > max_depth:
        raise JsonRefused(f"{what}: nests deeper than {max_depth} levels")
    if unicode_only and _SURROGATE_ESCAPE.search(raw) and not _is_unicode(value):
        raise JsonRefused(f"{what}: holds text that is not Unicode (a lone surrogate escape)")
    return value


def _decoded(text: str, what: str, max_depth: int) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        # Said first, deep or not: a caller may treat text that is not JSON as plain text, as
        # the network's code does (brackets in prose are not nesting).
        raise JsonRefused(f"{what}: not valid JSON: {exc}") from exc
    except RecursionError:  # deeper than the decoder goes
        raise JsonRefused(f"{what}: nests deeper than {max_depth} levels") from None
    except ValueError as exc:  # a number past Python's 4,300 digits: refused like the rest
        raise JsonRefused(f"{what}: cannot be decoded: {exc}") from exc


def _is_unicode(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
