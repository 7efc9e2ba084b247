"""The options of `python -m validator run`, declared once where both programs read them without
the loop: the validator's command (validator/entrypoint.py) takes them, and run.py takes each as
an option of its own (launcher/commands/forwarded.py), so that a mistake is refused on the host
before any image is built. The defaults that the loop's parts also read live here with them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from validator.options import (
    CONFIG_DIR_ENV,
    HF_CACHE_BUDGET_ENV,
    JOURNAL_KEEP_DAYS_OPTION,
    MIN_FREE_MB_OPTION,
    POSITIVE_SECONDS,
    F,
    api_url_option,
    config_dir_option,
    finite,
    flock_api_key_option,
    hf_token_option,
    state_dir_option,
    task_ids_option,
)
from validator.shard import SHARD_ENV

# The status page's address (validator/observe/status_server.py): this host only, unless given.
DEFAULT_HOST = "127.0.0.1"
# /healthz answers 503 after this long without the loop's progress.
DEFAULT_STALE_SECONDS = 1800.0
# Per-assignment records kept in the state dir (validator/state/records.py).
DEFAULT_KEEP = 2000

RUN_OPTIONS: tuple[Callable[[F], F], ...] = (
    task_ids_option("Comma-separated task ids to validate (positive whole numbers), e.g. 12,34."),
    flock_api_key_option(),
    hf_token_option("HuggingFace token; required by modules that declare it (lora)."),
    click.option(
        "--time-sleep",
        envvar="TIME_SLEEP",
        type=POSITIVE_SECONDS,
        default=180.0,
        show_default=True,
        help="Seconds to wait after an unexpected API answer.",
    ),
    click.option(
        "--assignment-lookup-interval",
        envvar="ASSIGNMENT_LOOKUP_INTERVAL",
        type=POSITIVE_SECONDS,
        default=180.0,
        show_default=True,
        help="Minimum seconds between two lookups of one task.",
    ),
    click.option("--debug", is_flag=True, help="Verbose logs (secrets are still never shown)."),
    api_url_option(),
    click.option(
        "--max-assignments",
        type=click.IntRange(min=1),
        help="Exit 0 after this many assignments were finished.",
    ),
    click.option(
        "--check",
        "check_input",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Score one input JSON locally and print the metrics; nothing is submitted.",
    ),
    state_dir_option("Where the journal lives."),
    config_dir_option("Module and task configs [default: ./configs].", CONFIG_DIR_ENV),
    MIN_FREE_MB_OPTION,
    JOURNAL_KEEP_DAYS_OPTION,
    click.option(
        "--http-port",
        envvar="VALIDATOR_HTTP_PORT",
        type=click.IntRange(min=0, max=65535),
        default=None,
        help="Serve the status page, /metrics and /healthz on this port (0: any free port).",
    ),
    click.option(
        "--http-host",
        envvar="VALIDATOR_HTTP_HOST",
        default=DEFAULT_HOST,
        show_default=True,
        help="Address the status page listens on; the page shows what the validator does.",
    ),
    click.option(
        "--health-stale-seconds",
        envvar="VALIDATOR_HEALTH_STALE_SECONDS",
        type=finite(1),
        default=DEFAULT_STALE_SECONDS,
        show_default=True,
        help="/healthz answers 503 when the loop made no progress for this long.",
    ),
    click.option(
        "--records-keep",
        envvar="VALIDATOR_RECORDS_KEEP",
        type=click.IntRange(min=1),
        default=DEFAULT_KEEP,
        show_default=True,
        help="Per-assignment records kept in STATE_DIR/records (oldest dropped first).",
    ),
    click.option(
        "--hf-cache-max-gb",
        envvar=HF_CACHE_BUDGET_ENV,
        type=finite(0, min_open=True),
        default=None,
        help="Keep the (shared) HF cache under this many GB: the least recently used base "
        "models no worker is using are deleted before and after a base is fetched [default: "
        "no limit].",
    ),
    click.option(
        "--shard",
        "shard_text",
        envvar=SHARD_ENV,
        metavar="K/N",
        help="Worker K of N sharing --task_ids: look up only the ids at positions K, K+N, ... "
        "(0-based); work already in the journal is finished whatever its task.",
    ),
    click.option(
        "--protocol-watch/--no-protocol-watch",
        envvar="VALIDATOR_PROTOCOL_WATCH",
        default=True,
        show_default=True,
        help="Warn when the network's code of the module's rules has commits after the one it "
        "follows (asks GitHub at start-up and every 6 h; docs/operating.md).",
    ),
    click.option(
        "--api-retries",
        envvar="VALIDATOR_API_RETRIES",
        type=click.IntRange(min=0),
        default=4,
        hidden=True,
    ),
    click.option(
        "--api-backoff",
        envvar="VALIDATOR_API_BACKOFF",
        type=finite(0),
        default=1.0,
        hidden=True,
    ),
)


def run_options(command: F) -> F:
    """Adds the validator's options to `command`, in --help's order."""
    for option in reversed(RUN_OPTIONS):  # the last decorator is applied first
        command = option(command)
    return command


def declared() -> list[click.Parameter]:
    """The options as click parameters of their own, for a command that takes them too."""
    return click.command()(run_options(lambda **_: None)).params
