"""`--check INPUT.json`: score one assignment input locally; no API, nothing submitted."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from validator.config import read_json_object
from validator.errors import (
    MAX_SCORING_ATTEMPTS,
    ConfigError,
    ExitCode,
    JournalAction,
    describe,
    outcome_of,
)
from validator.scoring import InvalidInput, ModulePool, score

log = logging.getLogger(__name__)


def run_check(pool: ModulePool, input_path: Path) -> ExitCode:
    """Prints the metrics JSON as the last line of stdout; errors go to the log (stderr).

    Exit 1 (ExitCode.BUG) when validators would mark the submission failed: at once for a
    rejected submission, after MAX_SCORING_ATTEMPTS attempts for an unexpected error (whose
    traceback is printed: it may be the module's bug). Errors that would stop a validator or
    that it would retry later are raised on, for the entrypoint's exit code."""
    raw = read_json_object(input_path, "(the assignment's input fields)")
    module = pool.module_for(None)
    try:
        metrics = score(module, raw, local_paths=True)
    except InvalidInput as exc:
        raise ConfigError(f"{input_path}: {exc}") from exc
    except Exception as exc:
        outcome = outcome_of(exc)
        if outcome.exit_code is not None or outcome.journal is JournalAction.KEEP:
            raise  # the entrypoint gives the exit code that validators would exit with
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
    sys.stdout.write(json.dumps(metrics) + "\n")
    sys.stdout.flush()
    return ExitCode.OK
