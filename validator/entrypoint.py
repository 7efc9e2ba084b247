"""`python -m validator <module> ...`: the command line of the inner orchestrator (docs/one-host.md,
"The validator inside the container")."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import click

from validator.check import run_check
from validator.config import (
    check_declared_schema,
    check_module_setup,
    resolved_configs,
    with_class_task_type,
)
from validator.disk import MIB
from validator.errors import (
    ConfigError,
    ExitCode,
    MalformedSecret,
    OperatorError,
    describe,
    outcome_of,
)
from validator.ledger.answers import Task
from validator.ledger.client import FedLedgerClient
from validator.ledger.task_types import check_task_types_at_start
from validator.observe import telemetry
from validator.observe.drift import start_drift_watch
from validator.observe.logs import adopt_library_loggers, setup_logging
from validator.observe.observer import Observer
from validator.observe.status_server import StatusServer
from validator.options import (
    gathered_secrets,
    given_unstripped,
    missing_for_module,
    secret_names,
)
from validator.outbound.deadline import set_stop_event
from validator.registry import load_module_class, load_module_spec, module_roots
from validator.run_context import RunContext, install_run
from validator.run_options import run_options
from validator.runner import Interrupted, LoopSettings, Runner
from validator.scoring import ModulePool
from validator.shard import describe_lookups, parse_shard, shard_task_ids
from validator.spec import ModuleSpec, readable_modules
from validator.state.journal import Journal
from validator.state.store import lock_timeout_from_env

log = logging.getLogger(__name__)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
# Both from the environment too, so that a module's image runs with no command at all (a pod):
# the image sets VALIDATOR_MODULE, the operator TASK_IDS (the name compose.yaml reads).
@click.argument("module", envvar="VALIDATOR_MODULE")
@run_options
def main(**params: Any) -> None:
    """Validate FLock assignments of MODULE's tasks (e.g. `lora`; default: $VALIDATOR_MODULE,
    which a module's image sets). --task_ids defaults to $TASK_IDS."""
    sys.exit(int(run(RunOptions(**params))))


@dataclass(frozen=True)
class RunOptions:
    """The command line, as click parsed it (its parameters' names)."""

    module: str
    task_ids: list[str] | None
    flock_api_key: str | None
    hf_token: str | None
    time_sleep: float
    assignment_lookup_interval: float
    debug: bool
    api_url: str
    max_assignments: int | None
    check_input: Path | None
    state_dir: Path
    config_dir: Path
    min_free_mb: int
    journal_keep_days: int
    http_port: int | None
    http_host: str
    health_stale_seconds: float
    records_keep: int
    hf_cache_max_gb: float | None
    shard_text: str | None
    protocol_watch: bool
    api_retries: int
    api_backoff: float


def run(options: RunOptions) -> ExitCode:
    """What `python -m validator MODULE` does with `options`: the door (click.UsageError, exit
    2, for what is missing or malformed), then --check or the loop; returns the exit code."""
    try:
        spec = load_module_spec(options.module)
        # Before anything can log: the stripped values are the ones used and redacted.
        secrets = gathered_secrets(secret_names(spec), options.flock_api_key, options.hf_token)
    except MalformedSecret as exc:
        raise click.UsageError(str(exc)) from None
    except ConfigError as exc:  # an unknown module, a spec that is not valid: one line
        setup_logging(options.debug, [])
        return _exit_code_for(exc)
    if options.check_input is None:
        missing = missing_for_module(options.task_ids, secrets, spec)
        if missing:
            raise click.UsageError(missing)
    redactor = setup_logging(options.debug, [value for value in secrets.values() if value])
    # The module and the kit read these from the run context (validator/run_context.py),
    # never from an os.environ this process wrote: the options win over their variables there.
    given = {k: v for k, v in secrets.items() if v}
    install_run(RunContext(options.state_dir, options.hf_cache_max_gb, given))
    for name in given_unstripped(secrets, os.environ):  # a module reading os.environ gets these
        log.warning(
            "%s has surrounding whitespace: used stripped, but a module reading os.environ gets "
            "it as given (current_run().secret(%r) is stripped)", name, name,
        )  # fmt: skip
    try:
        return _validate(options, spec, secrets["FLOCK_API_KEY"], redactor.redact)
    except (Interrupted, KeyboardInterrupt):  # KeyboardInterrupt: Ctrl-C during start-up
        return _fail(ExitCode.INTERRUPTED, "interrupted")
    except Exception as exc:
        return _exit_code_for(exc)


def _validate(
    options: RunOptions, spec: ModuleSpec, api_key: str | None, redact: Callable[[str], str]
) -> ExitCode:
    """The module loaded and checked, then --check's one input, or the loop."""
    # A bad or empty shard is exit 2 before the module loads; --check looks nothing up.
    shard = parse_shard(options.shard_text) if options.shard_text is not None else None
    task_ids = options.task_ids
    looked_up = shard_task_ids(task_ids, shard) if task_ids and options.check_input is None else []
    module_cls = load_module_class(options.module)
    check_declared_schema(spec, module_cls)
    spec = with_class_task_type(spec, module_cls)
    pool = ModulePool(module_cls, options.module, options.config_dir)
    adopt_library_loggers()  # the module's imports (transformers) print through ours
    if options.check_input is not None:
        return run_check(pool, options.check_input)
    assert task_ids is not None and api_key is not None
    _check_start(pool, task_ids, looked_up)
    lookups = describe_lookups(task_ids, looked_up, shard)
    log.info("validating %s: looking up %s", options.module, lookups)
    return build_loop(options, spec, pool, looked_up, lookups, api_key, redact).run()


@dataclass(frozen=True)
class Loop:
    """The loop, ready to run: its runner (with the API client and the journal it closes), the
    status page it stops, and the check of the tasks' types its first lookup waits for."""

    runner: Runner
    server: StatusServer | None
    check_types: Callable[[], list[Task] | None] = lambda: None

    def run(self) -> ExitCode:
        _install_signal_handlers(self.runner.stop)
        try:
            # OperatorError (exit 3) for a task of another module's; the list it read is the
            # runner's too, so a start asks the API for it once.
            listed = self.check_types()
            return self.runner.run(listed)
        finally:
            self.runner.journal.close()
            self.runner.client.close()
            if self.server is not None:
                self.server.stop()


def build_loop(
    options: RunOptions,
    spec: ModuleSpec,
    pool: ModulePool,
    looked_up: list[str],
    lookups: str,
    api_key: str,
    redact: Callable[[str], str],
) -> Loop:
    """The loop's parts, in the order start-up needs them; the status page serves once they
    are all built. `looked_up`: the task ids this worker looks up (`lookups` says them)."""
    settings = LoopSettings(
        looked_up,
        options.time_sleep,
        options.assignment_lookup_interval,
        options.max_assignments,
        options.journal_keep_days,
    )
    # The signals' stop event, so that the first one also ends an outbound call in progress:
    # the API's, and a module's (Hub, judge) through the outbound deadline.
    stop = threading.Event()
    set_stop_event(stop)
    client = FedLedgerClient(
        api_key,
        options.api_url,
        retries=options.api_retries,
        backoff=options.api_backoff,
        stop=stop,
    )
    # Opened and checked before any API call: a broken or locked journal is exit 3.
    journal = Journal(
        options.state_dir, options.min_free_mb, lock_timeout_from_env(), redact=redact
    )
    observer = Observer(
        options.state_dir,
        options.module,
        options.records_keep,
        lookups,
        pool.config_for,
        spec.penalty_rules,
    )
    telemetry.start_series(looked_up)
    telemetry.watch_state_dir(options.state_dir, options.min_free_mb * MIB)
    # In the background: never fatal, never on the scoring thread (docs/operating.md).
    start_drift_watch(spec, options.state_dir, stop, options.protocol_watch)
    runner = Runner(settings, client, journal, pool, stop, observer)
    # Every task id, each worker of a shard alike: a task of another module stops them all.
    modules = readable_modules(*module_roots())
    task_ids = options.task_ids or looked_up
    wait = options.time_sleep

    def check_types() -> list[Task] | None:
        return check_task_types_at_start(client.list_tasks, task_ids, spec, modules, stop, wait)

    return Loop(runner, _status_page(options, observer), check_types)


def _status_page(options: RunOptions, observer: Observer) -> StatusServer | None:
    """The status page, /metrics and /healthz, serving (with --http-port)."""
    if options.http_port is None:
        return None
    server = StatusServer(
        options.http_host,
        options.http_port,
        observer.status,
        options.state_dir,
        options.health_stale_seconds,
    )
    server.start()
    return server


def _check_start(pool: ModulePool, task_ids: list[str], looked_up: list[str]) -> None:
    """Before the API is touched: every task's config (exit 2 naming the file and key), then
    the module's own start-up checks for each distinct config of the tasks looked up (exit 3
    naming what to fix, no assignment taken)."""
    schema = pool.module_cls.config_schema
    resolved_configs(schema, pool.config_dir, pool.module_name, task_ids)
    configs = resolved_configs(schema, pool.config_dir, pool.module_name, looked_up)
    for checked in check_module_setup(pool.module_cls, pool.module_name, configs):
        log.info("start-up checks of %s: %s", pool.module_name, checked)


def _install_signal_handlers(stop: threading.Event) -> None:
    def handle(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            raise Interrupted()
        log.info(
            "%s received: stopping after the current step; a download or judge call in flight "
            "ends within 2 s, its assignment kept for the next run (again to stop now)",
            signal.Signals(signum).name,
        )
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def _fail(code: ExitCode, message: str) -> ExitCode:
    log.error("%s", message)
    return code


def _exit_code_for(exc: Exception) -> ExitCode:
    """An error outside the loop's scoring (start-up, --check, the loop itself): the exit code
    its verdict has in validator.errors.OUTCOMES. Verdicts on which the loop would go on are
    bugs here."""
    outcome = outcome_of(exc)
    if outcome.exit_code is None:
        log.exception("validator crashed: %s", exc)
        return ExitCode.BUG
    # The validator's own errors say what to do; a library's needs its type to make sense.
    message = str(exc) if isinstance(exc, OperatorError) else describe(exc)
    return _fail(outcome.exit_code, f"{outcome.headline}: {message}")
