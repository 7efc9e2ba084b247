import logging

from validator.logs import RedactSecrets

SECRET = "sk-flock-abcdef123456"


def make_record(msg, args=None, exc_info=None):
    return logging.LogRecord("t", logging.INFO, __file__, 1, msg, args, exc_info)


def test_secret_in_message_and_args_is_redacted():
    redactor = RedactSecrets([SECRET, None, ""])
    record = make_record("key=%s url=%s", (SECRET, "http://x"))
    redactor.filter(record)
    assert record.getMessage() == "key=*** url=http://x"


def test_secret_in_traceback_is_redacted():
    redactor = RedactSecrets([SECRET])
    try:
        raise ValueError(f"bad header {SECRET}")
    except ValueError:
        import sys

        record = make_record("failed", exc_info=sys.exc_info())
    redactor.filter(record)
    formatted = logging.Formatter().format(record)
    assert SECRET not in formatted
    assert "bad header ***" in formatted


def test_short_values_are_not_treated_as_secrets():
    redactor = RedactSecrets(["ab"])
    record = make_record("absolutely")
    redactor.filter(record)
    assert record.getMessage() == "absolutely"
