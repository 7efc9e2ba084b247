"""The demos' stand-in secrets are redacted in the log without touching the words around them
(metric names above all), and the demos' log check notices when a word was touched."""

from __future__ import annotations

import json
import sys

import pytest

from devkit.demo_secrets import API_KEY, HF_TOKEN, JUDGE_KEY, redacted_words, run_checking_log
from validator.observe.logs import RedactSecrets

# A line as the lora module logs its scores: metric names with words a short secret shares.
SCORED = "assignment 7: scored " + json.dumps(
    {"loss": 2.5, "nll_token_nats_total": 812.4, "nll_token_bits_total": 1172.1, "demo": 1}
)


@pytest.mark.parametrize("secret", [API_KEY, HF_TOKEN, JUDGE_KEY])
def test_a_demo_secret_is_redacted_and_nothing_else(secret):
    redact = RedactSecrets([API_KEY, HF_TOKEN, JUDGE_KEY]).redact
    assert redact(SCORED) == SCORED
    line = f"calling the API with key {secret}, then {secret[:12]}"
    assert redact(line) == "calling the API with key ***, then ***"
    assert redacted_words([redact(line), SCORED]) == []


def test_a_short_stand_in_rewrites_metric_names_and_the_check_finds_it():
    # What the demos used before: `token` is a fragment of `demo-token`.
    redacted = RedactSecrets(["demo-key", "demo-token"]).redact(SCORED)
    assert "nll_***_nats_total" in redacted
    assert redacted_words([redacted]) == [redacted]


@pytest.mark.integration  # it starts child processes, which its imports do not show
def test_a_demo_fails_when_its_log_has_a_redacted_word(tmp_path, capsys):
    write = "import sys; sys.stderr.write({!r})"
    clean = [sys.executable, "-c", write.format("scored nll_token_nats_total=1\n")]
    touched = [sys.executable, "-c", write.format("scored nll_***_nats_total=1\n")]
    assert run_checking_log(clean, tmp_path, {}) == 0
    assert run_checking_log(touched, tmp_path, {}) == 1
    assert "redaction rewrote part of a word in 1 log line(s)" in capsys.readouterr().err
