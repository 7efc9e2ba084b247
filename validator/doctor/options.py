"""The options both doctors take (`python run.py doctor`, `python -m validator doctor`), declared
once and importable without the checks: run.py's --help reads them, its doctor imports the
checks only when it runs."""

from __future__ import annotations

from collections.abc import Callable

import click

from validator.options import (
    F,
    api_url_option,
    finite,
    flock_api_key_option,
    hf_token_option,
    task_ids_option,
)

# Seconds each check may take (all run at once): the table comes within about this long,
# whatever the servers do. --timeout changes it, up to MAX_DEADLINE.
DEFAULT_DEADLINE = 30.0
MAX_DEADLINE = 50.0
# A 7B base in bf16 is about 15 GB; two of them while the cache turns over.
DEFAULT_HF_MIN_FREE_GB = 40.0

DEADLINE_OPTION = click.option(
    "--timeout",
    "deadline",
    type=finite(1, max=MAX_DEADLINE),
    default=DEFAULT_DEADLINE,
    show_default=True,
    help="Seconds each check may take (they run at once); one that runs over is a failed row.",
)
# The Fed Ledger and the key, the Hub, the task ids' configs, as --help lists them.
SERVICE_OPTIONS = (
    flock_api_key_option(),
    hf_token_option(),
    api_url_option(),
    task_ids_option(
        "The task ids the validator will look up (their configs are checked too), e.g. 12,34."
    ),
)
JUDGE_MODEL_OPTION = click.option(
    "--judge-model",
    "judge_models",
    multiple=True,
    help="llm_judge: a judge model the endpoint must list, beside the config's judge_models.",
)


def service_options(command: F) -> F:
    """The options of the services' checks, first on both doctors' --help: run.py's doctor
    checks the same services."""
    for option in reversed(SERVICE_OPTIONS):  # the last decorator is applied first
        command = option(command)
    return command


def hf_free_gb_option(flag: str, help: str) -> Callable[[F], F]:
    """The free GB the HF cache's disk needs for the next base: the HF cache's folder here, the
    Docker volumes that hold it for run.py's doctor, which names it `--min-free-gb`."""
    return click.option(
        flag,
        type=finite(0),
        default=DEFAULT_HF_MIN_FREE_GB,
        show_default=True,
        help=help,
    )
