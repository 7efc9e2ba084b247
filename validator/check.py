"""`--check INPUT.json`: score one assignment input locally; no API, nothing submitted. Each
problem is one line that says whose it is: the submission's, the module's, this host's (a
service it cannot reach) or the operator's."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from validator.config import read_json_object
from validator.errors import (
    MAX_SCORING_ATTEMPTS,
    ConfigError,
    ExitCode,
    JournalAction,
    Verdict,
    describe,
    outcome_of,
)
from validator.scoring import InvalidInput, ModulePool, score
from validator.spec import CHECK_SOURCE_ENV

log = logging.getLogger(__name__)


def run_check(pool: ModulePool, input_path: Path) -> ExitCode:
    """Prints the metrics JSON as the last line of stdout; errors go to the log (stderr).

    Exit 1 (ExitCode.BUG) when validators would mark the submission failed: at once for a
    rejected submission, after MAX_SCORING_ATTEMPTS attempts for an unexpected error (whose
    traceback is printed: it may be the module's bug). Exit 3 when a service outside did not
    answer (the Hub, a judge): validators would keep the assignment and try again later.
    Errors that would stop a validator are raised on, for the entrypoint's exit code."""
    # Where run.py mounted the file, the operator knows it by its host path.
    shown = os.environ.get(CHECK_SOURCE_ENV) or str(input_path)
    raw = read_json_object(input_path, "(the assignment's input fields)", shown)
    try:
        metrics = score(pool.module_for(None), raw, local_paths=True)
    except InvalidInput as exc:
        raise ConfigError(f"{shown}: {exc}") from exc
    except Exception as exc:
        return _told(exc)
    sys.stdout.write(json.dumps(metrics) + "\n")
    sys.stdout.flush()
    return ExitCode.OK


def _told(exc: Exception) -> ExitCode:
    """The one line of what validators would do with `exc`, and --check's exit code for it."""
    outcome = outcome_of(exc)
    if outcome.exit_code is not None:
        raise exc  # the entrypoint gives the exit code that validators would exit with
    if outcome.verdict is Verdict.TRANSIENT:
        log.error(
            "%s, not the submission's: %s; validators keep such an assignment and score it "
            "again later. Check that this host reaches the service it names (the Hub: "
            "HF_ENDPOINT; a judge: OPENAI_BASE_URL; a proxy), then run --check again",
            outcome.headline,
            describe(exc),
        )
        return ExitCode.OPERATOR
    if outcome.journal is JournalAction.FAIL:
        log.error("the submission would be marked failed: %s", describe(exc))
    else:
        log.error(
            "%s: %s; validators score it again, up to %d attempts in all, then mark it "
            "failed. If the submission is not at fault, this is a bug in the module",
            outcome.headline,
            describe(exc),
            MAX_SCORING_ATTEMPTS,
            exc_info=exc,
        )
    return ExitCode.BUG
