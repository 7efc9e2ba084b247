"""The demos' stand-in secrets, shaped like real ones, and a check of the validator's log.

The log redacts every run of a secret's characters 8 long (half of a short one). Stand-ins as
short as `demo-token` made it rewrite ordinary words (`nll_token_nats_total` came out as
`nll_***_nats_total`), so the demos showed a log no operator would see. These are random-looking
and as long as real ones (a 40-hex-digit API key, `hf_` + 34 letters, `sk-` + 48), so redaction
hits the secret only; `run_checking_log` fails a demo whose log shows otherwise. None of them is
a real credential.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

API_KEY = "9f00c3ab91b3bb82ab6c0da15fc43021529543ab"
HF_TOKEN = "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"
JUDGE_KEY = "sk-mhP9UyI0nGSZSqw3nK5mNSxi3Hp5JEb5XtqYLkKcwZjdSKL1"

# The redaction mark glued to a name's character: it replaced part of a word, not a secret.
REDACTED_IN_A_WORD = re.compile(r"\w\*\*\*|\*\*\*\w")


def redacted_words(lines: Sequence[str]) -> list[str]:
    """The log lines where redaction rewrote part of a word (a metric name, say)."""
    return [line for line in lines if REDACTED_IN_A_WORD.search(line)]


def run_checking_log(command: Sequence[str], cwd: Path, env: Mapping[str, str]) -> int:
    """Run `command` with its log (stderr) shown as it comes, as subprocess.call would; its exit
    code, or 1 when it succeeded but redaction rewrote part of a word in its log."""
    process = subprocess.Popen(
        command, cwd=cwd, env=dict(env), stderr=subprocess.PIPE, text=True, errors="replace"
    )
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
        lines.append(line)
    code = process.wait()
    found = redacted_words(lines)
    if found and code == 0:
        print(
            f"demo: redaction rewrote part of a word in {len(found)} log line(s), first: "
            f"{found[0].strip()}",
            file=sys.stderr,
        )
        return 1
    return code
