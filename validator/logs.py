"""Logging to stderr that can never show a secret, even in --debug or in a traceback."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

REDACTED = "***"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RedactSecrets(logging.Filter):
    def __init__(self, secrets: Iterable[str | None]) -> None:
        super().__init__()
        # Very short values would blank out ordinary words; a real key is never that short.
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = self.redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True


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
