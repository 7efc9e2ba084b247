"""Logging to stderr that can never show a secret, even in --debug or in a traceback, and whose
every line is one record's: control characters escaped, a traceback only under a WARNING or an
ERROR (or in a DEBUG record of its own), each of its lines indented."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
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
# Libraries that log a line per HTTP request (httpx: `HTTP Request: POST ... "HTTP/1.1 200 OK"`
# for every judge call) or per file: WARNING and above only, unless --debug.
# openai 3 sends through httpx2/httpcore2, its own fork of httpx, with loggers of those names.
CHATTY_LOGGERS = (
    "httpx",
    "httpcore",
    "httpx2",
    "httpcore2",
    "openai",
    "urllib3",
    "huggingface_hub",
    "filelock",
)
# Libraries that print through a handler of their own (transformers: its own format, and past
# the redactor): their records go through ours instead.
OWN_HANDLER_LOGGERS = ("transformers",)
# Known-harmless library warnings, said once per process in our words, as INFO.
KNOWN_NOISE = (
    (
        re.compile(r"^The fast path is not available because one of the required librar"),
        "linear attention runs transformers' torch implementation (the fla / causal-conv1d "
        "kernels are not installed here): the same scores, slower; expected on a CPU host",
    ),
    (
        # transformers, loading a Qwen2 base without flash-attention 2 (every CPU host).
        re.compile(r"^Sliding Window Attention is enabled but not implemented for `"),
        "transformers' sdpa attention leaves the base config's sliding window to the causal "
        "mask, which applies it; a window longer than the context (Qwen2.5's) changes nothing",
    ),
    (
        # bitsandbytes, imported by peft on a CPU with AVX512-BF16.
        re.compile(r"^Failed to load CPU gemm_4bit_forward from kernels-community"),
        "bitsandbytes' optional CPU 4-bit kernels are not installed: nothing is slower, 4-bit "
        "quantization is only used on a GPU",
    ),
)


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


class OneLineFormatter(logging.Formatter):
    """FORMAT, one line per record, whatever its message holds (escaped: text.one_line). A
    traceback or stack follows a WARNING or an ERROR line, each of its lines escaped and
    indented, so that none can pass for a record of its own (an exception's text may be a
    submission's); a lower record's goes in a DEBUG record of its own under --debug, and is
    left out otherwise: an INFO line is never followed by one."""

    def __init__(self, debug: bool) -> None:
        super().__init__(FORMAT)
        self.debug = debug

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        extra = "\n".join(text for text in (record.exc_text, record.stack_info) if text)
        if not extra:
            return one_line(super().format(record))
        line = one_line(self._line(record, record.levelno, record.levelname, record.msg))
        block = "\n".join(f"    {one_line(part)}" for part in extra.split("\n"))
        if record.levelno >= logging.WARNING:
            return f"{line}\n{block}"
        if not self.debug:
            return f"{line} (its traceback with --debug)"
        head = self._line(record, logging.DEBUG, "DEBUG", "the traceback of the line above:")
        return f"{line}\n{one_line(head)}\n{block}"

    def _line(self, record: logging.LogRecord, level: int, name: str, msg: object) -> str:
        """`record` as FORMAT writes it without its traceback, at `level` with `msg`."""
        plain = logging.makeLogRecord(record.__dict__)
        plain.levelno, plain.levelname = level, name
        if msg is not record.msg:
            plain.msg, plain.args = msg, None
        plain.exc_info = plain.exc_text = plain.stack_info = None
        return super().format(plain)


class KnownNoise(logging.Filter):
    """Rewrites a known-harmless library warning (KNOWN_NOISE) into our words, as INFO, the
    first time; drops it after that."""

    def __init__(self) -> None:
        super().__init__()
        self._said: set[int] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        for index, (pattern, words) in enumerate(KNOWN_NOISE):
            if pattern.search(message):
                with self._lock:
                    if index in self._said:
                        return False
                    self._said.add(index)
                record.msg, record.args = words, None
                record.levelno, record.levelname = logging.INFO, "INFO"
                return True
        return True


_progress_bars = {"on": False}  # --debug turns the libraries' bars back on (setup_logging)


def adopt_library_loggers() -> None:
    """Sends the records of libraries with a handler of their own (OWN_HANDLER_LOGGERS)
    through the root's handler (format, redaction, KnownNoise), and turns their progress bars
    off unless --debug. Run at start-up and again once the module is imported: transformers
    installs its handler when first imported."""
    for name in OWN_HANDLER_LOGGERS:
        if name not in sys.modules:
            continue
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    _set_progress_bars(_progress_bars["on"])


def _set_progress_bars(on: bool) -> None:
    """huggingface_hub's and transformers' bars ("Loading weights: 100%|...") are redrawn with
    carriage returns that a log keeps as noise; the validator logs its own progress
    (validator/kit/progress.py). Only libraries already imported are touched."""
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

        (enable_progress_bars if on else disable_progress_bars)()
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        if on:
            transformers_logging.enable_progress_bar()
        else:
            transformers_logging.disable_progress_bar()


def setup_logging(debug: bool, secrets: Iterable[str | None]) -> RedactSecrets:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(debug))
    redactor = RedactSecrets(secrets)
    handler.addFilter(KnownNoise())  # before the redactor: it may replace the message
    handler.addFilter(redactor)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    _progress_bars["on"] = debug
    for name in CHATTY_LOGGERS:
        # NOTSET under --debug: the root's DEBUG then applies (a library may have set its own).
        logging.getLogger(name).setLevel(logging.NOTSET if debug else logging.WARNING)
    adopt_library_loggers()
    logging.captureWarnings(True)
    return redactor
