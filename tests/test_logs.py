import json
import logging
import sys
import time

from validator.observe.logs import KnownNoise, RedactSecrets
from validator.text import MAX_LOG_MESSAGE, MAX_TRACEBACK

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


# --- fragments of a secret: what an exception or a truncated print may show ---------------

KEY = "fk-Zq7Wx2Rv9Ty4Pm6Kd3Hn8Jc"  # 26 characters: fragments of 8 and more are redacted


def fragments(secret: str, length: int = 8) -> list[str]:
    return [secret[i : i + length] for i in range(len(secret) - length + 1)]


def leaked(text: str, secret: str = KEY) -> list[str]:
    return [fragment for fragment in fragments(secret) if fragment in text]


def redacted(text: str, secrets: list[str] | None = None) -> str:
    record = make_record("%s", (text,))
    RedactSecrets(secrets or [KEY]).filter(record)
    return record.getMessage()


def test_a_truncated_key_is_redacted_but_not_seven_of_its_characters():
    # Eight characters of a random key identify it; seven of its characters next to ordinary
    # text are as likely to be a word or an id, and blanking them would garble the logs.
    out = redacted(f"key={KEY[:13]}... ids {KEY[:7]}, {KEY[-7:]}")
    assert out == f"key=***... ids {KEY[:7]}, {KEY[-7:]}"


def test_the_core_of_a_key_in_a_repr_with_escapes_is_redacted():
    # The leak guarded: a redactor that knows the value as given, with its carriage return,
    # misses it when the exception prints it through repr(), the carriage return as the two
    # characters \r.
    message = f"Invalid return character(s) in header value: {KEY + chr(13)!r}"
    out = redacted(message, [KEY + "\r"])
    assert leaked(out) == [] and out.endswith("header value: '***'"), out


def test_a_secret_that_repr_escapes_is_redacted_in_its_escaped_form():
    # repr() doubles the backslashes; JSON doubles them too and escapes the double quotes.
    secret = 'Ab3\\Cd4"Ef5\\Gh6"Ij7'
    out = redacted(f"value {secret!r} and {json.dumps(secret)}", [secret])
    assert out == "value '***' and \"***\"", out


def test_a_key_split_across_quoting_is_redacted_piece_by_piece():
    pieces = (KEY[:9], KEY[9:18], KEY[18:])  # 9 + 9 + 8 characters
    out = redacted("key = '{}' '{}' \"{}\"".format(*pieces))
    assert out == "key = '***' '***' \"***\""


def test_a_short_secret_is_redacted_from_half_its_length():
    secret = "Pq8Rs5Tu2V"  # 10 characters: fragments of 5 and more
    assert redacted("a Pq8Rs5 b s5Tu2V c Pq8R", [secret]) == "a *** b *** c Pq8R"


def test_the_core_of_a_key_in_a_traceback_is_redacted():
    redactor = RedactSecrets([KEY])
    try:
        value = "  " + KEY[2:] + "\r"
        raise ValueError(f"Invalid leading whitespace in header value: {value!r}")
    except ValueError:
        record = make_record("request failed", exc_info=sys.exc_info())
    redactor.filter(record)
    formatted = logging.Formatter().format(record)
    assert leaked(formatted) == [] and "header value: '  ***\\r'" in formatted, formatted


def test_redaction_time_grows_with_the_text_not_with_its_square():
    filler = "x" * 2_000_000
    started = time.perf_counter()
    out = RedactSecrets([KEY, "hf_" + KEY[::-1]]).redact(f"{filler}{KEY[3:]}{filler}")
    assert out == f"{filler}***{filler}"
    # A generous bound for a shared machine: linear takes about a second, quadratic hours.
    assert time.perf_counter() - started < 20


def test_a_long_message_is_cut_and_a_key_across_the_cut_is_redacted_whole():
    # The key starts 5 characters before the cut: cut first, 5 characters of it would show.
    text = "x" * (MAX_LOG_MESSAGE - 5) + KEY + "y" * 10**6
    out = redacted(text)
    assert out == "x" * (MAX_LOG_MESSAGE - 5) + "***" + "y" * 2 + (
        f"... [cut at {MAX_LOG_MESSAGE} of {len(text)} characters]"
    )
    assert KEY[:4] not in out


def test_line_breaks_and_control_characters_cannot_forge_a_log_line():
    revision = "main\n2026-11-23 06:00:00,000 INFO validator.runner: submitted\r\x1b[2J\u2028x"
    out = redacted(f"scoring alice/adapter at revision {revision}")
    assert out == (
        "scoring alice/adapter at revision main\\n2026-11-23 06:00:00,000 INFO "
        "validator.runner: submitted\\r\\x1b[2J\\u2028x"
    )


def test_a_traceback_is_bounded_but_keeps_its_lines():
    try:
        raise ValueError("v" * 10**6)
    except ValueError:
        record = make_record("failed", exc_info=sys.exc_info())
    RedactSecrets([KEY]).filter(record)
    assert len(record.exc_text) < MAX_TRACEBACK + 100
    assert record.exc_text.startswith("Traceback (most recent call last):\n")


def test_the_known_harmless_cpu_warnings_are_said_once_in_our_words():
    """transformers' sliding-window warning (a Qwen2 base without flash-attention) and
    bitsandbytes' "pip install kernels" (peft imports it on a CPU) are harmless there: each is
    one INFO line of ours, the first time only, not the libraries' warning."""
    noise = KnownNoise()
    said = []
    for name, text in [
        (
            "transformers.models.qwen2.modeling_qwen2",
            "Sliding Window Attention is enabled but not implemented for `sdpa`; unexpected "
            "results may be encountered.",
        ),
        (
            "bitsandbytes.backends.cpu.ops",
            "Failed to load CPU gemm_4bit_forward from kernels-community: No module named "
            "'kernels'. Please make sure you already `pip install kernels` and the kernels >= "
            "0.11.1",
        ),
    ]:
        for _ in range(2):
            record = logging.LogRecord(name, logging.WARNING, __file__, 1, text, None, None)
            if noise.filter(record):
                said.append((record.levelname, record.getMessage()))
    assert [level for level, _ in said] == ["INFO", "INFO"]
    assert "sliding window" in said[0][1] and "sdpa" in said[0][1]
    assert "4-bit" in said[1][1] and "pip install" not in said[1][1]
