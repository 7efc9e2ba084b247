"""`--check INPUT.json`: score one assignment input locally; no API, nothing submitted."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from validator.config import read_json_object
from validator.exceptions import ConfigError
from validator.exit_codes import ExitCode
from validator.outcomes import Verdict, classify
from validator.scoring import InvalidInput, ModulePool, score

log = logging.getLogger(__name__)


def run_check(pool: ModulePool, input_path: Path) -> ExitCode:
    """Prints the metrics JSON as the last line of stdout; errors go to the log (stderr)."""
    raw = read_json_object(input_path, "(the assignment's input fields)")
    module = pool.module_for(None)
    try:
        metrics = score(module, raw)
    except InvalidInput as exc:
        raise ConfigError(f"{input_path}: {exc}") from exc
    except Exception as exc:
        if classify(exc) is not Verdict.FAILED:
            raise
        log.error("the submission would be marked failed: %s: %s", type(exc).__name__, exc)
        return ExitCode.BUG
    sys.stdout.write(json.dumps(metrics) + "\n")
    sys.stdout.flush()
    return ExitCode.OK
