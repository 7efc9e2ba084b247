"""Logging to stderr that can never show a secret, even in --debug or in a traceback."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable

from validator.text import MAX_LOG_MESSAGE, MAX_TRACEBACK, one_line

REDACTED = "***"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Very short values would blank out ordinary words; a real key is never that short. For the same
# reason no fragment shorter than this is redacted.
MIN_SECRET_LENGTH = 4
# A fragment this long of a random key identifies it (and gives away 8 of its characters).
FRAGMENT_LENGTH = 8
# Text redacted past the point where a long message is cut: longer than any key.
REDACT_MARGIN = 256


def fragment_length(secret: str) -> int:
    """The shortest run of a secret's characters that is redacted: 8, or half of a secret
    shorter than 16, but never under MIN_SECRET_LENGTH nor over the secret's length."""
    return min(len(secret), max(MIN_SECRET_LENGTH, min(FRAGMENT_LENGTH, len(secret) // 2)))


def written_forms(secret: str) -> set[str]:
    """The secret as a message or an exception may print it: as is, and escaped as repr()
    and JSON write it (a carriage return as the two characters `\\r`, a backslash doubled)."""
    return {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1]}


class RedactSecrets(logging.Filter):
    """Replaces every run of a secret's characters at least `fragment_length` long, in any of
    its `written_forms`, with "***": a whole secret, a truncated one, its core inside a quoted
    or escaped value, or each of the pieces it was split into.

    Each text position is looked up once per fragment length in a set of fragments, so the
    cost grows with the text, not with the number or length of the secrets.
    """

    def __init__(self, secrets: Iterable[str | None]) -> None:
        super().__init__()
        self._fragments: dict[int, set[str]] = {}
        for secret in {s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH}:
            k = fragment_length(secret)
            grams = self._fragments.setdefault(k, set())
            for form in written_forms(secret):
                grams.update(form[i : i + k] for i in range(len(form) - k + 1))

    def redact(self, text: str) -> str:
        hits: list[tuple[int, int]] = []
        for k, grams in self._fragments.items():
            hits.extend((i, i + k) for i in range(len(text) - k + 1) if text[i : i + k] in grams)
        if not hits:
            return text
        hits.sort()
        # Overlapping or touching fragments are one run, replaced by a single "***".
        runs = [list(hits[0])]
        for begin, end in hits[1:]:
            if begin <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], end)
            else:
                runs.append([begin, end])
        parts: list[str] = []
        done = 0
        for begin, end in runs:
            parts += [text[done:begin], REDACTED]
            done = end
        parts.append(text[done:])
        return "".join(parts)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = one_line(self._redact_bounded(message, MAX_LOG_MESSAGE))
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._redact_bounded(record.exc_text, MAX_TRACEBACK)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True

    def _redact_bounded(self, text: str, limit: int) -> str:
        """Redacted, then cut to `limit`. A margin is redacted beyond the cut, so that a secret
        crossing it is replaced whole rather than leave its first characters showing."""
        if len(text) <= limit:
            return self.redact(text)
        kept = self.redact(text[: limit + REDACT_MARGIN])
        return f"{kept[:limit]}... [cut at {limit} of {len(text)} characters]"


def setup_logging(debug: bool, secrets: Iterable[str | None]) -> RedactSecrets:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    redactor = RedactSecrets(secrets)
    handler.addFilter(redactor)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    if not debug:
        logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.captureWarnings(True)
    return redactor
