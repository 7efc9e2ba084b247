"""Submitter-controlled text made safe to log and to journal: bounded, one line.

Anything a submission names (a revision, a key of its adapter_config.json, a reason an error
quotes) can reach a log line or the journal. Unbounded, a 30 MB string made a 30 MB log line and
a 90 MB journal; with a newline in it, a revision forged a log line.
"""

from __future__ import annotations

import re
from typing import Any

# A reason in the journal, or an error in a log line, is at most this long.
MAX_REASON = 2000
# A log message; a traceback gets more room, since its frames are the validator's own.
MAX_LOG_MESSAGE = 8000
MAX_TRACEBACK = 32000
# A value quoted inside a message.
MAX_QUOTED = 120
# A string of an assignment's input (a repo id, a revision, a signed URL): far more than any
# real one needs; the input is journaled, and a longer string fails the assignment.
MAX_INPUT_STRING = 8192

# A commit id in a reason or a line: 12 hex digits name one commit in any repo a validator meets,
# and leave the room of a line to what happened and what to do.
SHORT_COMMIT = 12
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")

# The C0 controls, DEL and the C1 controls (U+0080 to U+009F: U+009B is a terminal's CSI, as
# ESC [ is), each as an escape: none is ever written raw.
_ESCAPES = {code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\t"})
# Unicode's own line breaks end a line in many log viewers too, and its direction overrides
# show a line in another order than it is written.
_ESCAPES.update({code: f"\\u{code:04x}" for code in (0x85, 0x2028, 0x2029, *range(0x202A, 0x202F))})
_ESCAPES.update({code: f"\\u{code:04x}" for code in range(0x2066, 0x206A)})


def bounded(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


def shortened(text: str, limit: int) -> str:
    """`text` in `limit` characters, cut in its middle: a reason says first what failed and
    last what to do, so both ends are kept; its last clause (after the last "; ") whole when
    it takes at most two thirds of the room."""
    if len(text) <= limit:
        return text
    room = limit - 3  # the "..." that marks the cut
    if room <= 0:
        return text[:limit]
    last = text.rsplit("; ", 1)[-1]
    end = len(last) if last != text and len(last) <= room * 2 // 3 else room // 2
    return f"{text[: room - end]}...{text[len(text) - end :]}"


def short_commit(revision: str) -> str:
    """A revision as a reason or a line names it: a commit id (40 or 64 hex digits) as its
    first SHORT_COMMIT, a branch or a tag as it is."""
    return revision[:SHORT_COMMIT] if _COMMIT.fullmatch(revision) else revision


def one_line(text: str) -> str:
    """Control characters (C0, DEL, C1) and line breaks written as escapes, so that text is one
    line and shows as it is written."""
    return text.translate(_ESCAPES)


def quoted(value: object, limit: int = MAX_QUOTED) -> str:
    """A value as repr() writes it, bounded: for quoting what a submission wrote."""
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]  # before repr: a huge string is not copied again
    return bounded(repr(value), limit)


def oversized_strings(value: Any, limit: int, path: str = "") -> list[str]:
    """Where `value` (JSON-like) holds a string over `limit` characters, as dotted paths."""
    if isinstance(value, str):
        return [path or "(the value)"] if len(value) > limit else []
    if isinstance(value, dict):
        items = [(f"{path}.{key}" if path else str(key), item) for key, item in value.items()]
    elif isinstance(value, list):
        items = [(f"{path}[{index}]", item) for index, item in enumerate(value)]
    else:
        return []
    found = []
    for where, item in items:
        if len(where) > limit:
            found.append(bounded(where, MAX_QUOTED))
        found.extend(oversized_strings(item, limit, where))
    return found


def cut_strings(value: Any, limit: int) -> Any:
    """`value` with every string (keys too) bounded to about `limit` characters."""
    if isinstance(value, str):
        return bounded(value, limit)
    if isinstance(value, dict):
        return {bounded(str(k), limit): cut_strings(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [cut_strings(item, limit) for item in value]
    return value
