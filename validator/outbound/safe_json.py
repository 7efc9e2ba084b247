"""Decoding JSON that someone else wrote (a submission's config, a validation set line), within
limits of size and nesting, so that a hostile file fails with a reason instead of exhausting
memory or ending in a RecursionError from the decoder."""

from __future__ import annotations

import json
import re
from typing import Any

from validator.errors import JsonRefused

MAX_DEPTH = 64  # real adapter configs nest 3 deep, validation lines about 6

_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def nesting_depth(text: str, stop_above: int | None = None) -> int:
    """How deep arrays and objects nest in `text` (brackets inside strings do not count).
    Counting stops past `stop_above`."""
    return _depth(_NOT_BRACKET.sub("", _outside_strings(text)), stop_above)


def value_count(text: str) -> int:
    """At most how many values the JSON `text` holds (arrays, objects and what they hold: each
    but the first in a container follows a comma; a container after one counts twice),
    counted without decoding it: what decoding would cost in objects, whatever their shape
    (`[{},{},...]` is 24 bytes of Python per 3 bytes of text)."""
    return _values(_outside_strings(text))


def _outside_strings(text: str) -> str:
    """`text` without what its string literals hold: escaped backslashes and quotes dropped
    first, every other quote then opens or closes one (string operations in C: a regex per
    literal took 0.17 s for a Hub listing at its cap, holding the interpreter)."""
    plain = text.replace("\\\\", "").replace('\\"', "")
    return "".join(plain.split('"')[0::2])


def _values(outside: str) -> int:
    return outside.count(",") + outside.count("[") + outside.count("{") + 1


def _depth(brackets: str, stop_above: int | None) -> int:
    depth = deepest = 0
    for char in brackets:
        depth += 1 if char in "[{" else -1
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
) -> Any:
    """`json.loads` for untrusted text; raises JsonRefused naming `what` and the limit.
    `max_bytes` None: the caller already bounded the size (a capped download, say).
    `max_values`: text holding more values (`value_count`) is refused before it is decoded,
    so that what decoding costs is bounded by the text's size and this, whatever its shape."""
    if max_bytes is not None and len(data) > max_bytes:  # characters <= bytes: a cheap bound
        size = len(data.encode("utf-8") if isinstance(data, str) else data)
        if size > max_bytes:
            raise JsonRefused(f"{what}: {size} bytes, over the limit of {max_bytes}")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise JsonRefused(f"{what}: not UTF-8: {exc}") from exc
    if max_values is None:
        too_deep = nesting_depth(text, stop_above=max_depth) > max_depth
    else:  # the strings taken out once for both
        outside = _outside_strings(text)
        if _values(outside) > max_values:
            raise JsonRefused(f"{what}: holds more than {max_values} JSON values")
        too_deep = _depth(_NOT_BRACKET.sub("", outside), max_depth) > max_depth
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # Said first, deep or not: a caller may treat text that is not JSON as plain text, as
        # the network's code does (brackets in prose are not nesting).
        raise JsonRefused(f"{what}: not valid JSON: {exc}") from exc
    except RecursionError:  # deeper than the decoder goes: refused for depth below
        too_deep = True
    if too_deep:
        raise JsonRefused(f"{what}: nests deeper than {max_depth} levels")
    return data
