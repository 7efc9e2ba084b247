"""The doctor's checks of what a validator needs that Docker does not give (these run in the
module's image as well as on the host): the settings, the configs, the module's own start-up
checks (the same code the validator runs at start), the Fed Ledger and the key, the clock, the
disks, the Hub (validator/doctor/hub_rows.py). Each call is read-only, has a short timeout
and follows no redirect, so a key never travels to another host; an answer of the wrong shape
is a failed row naming what was wrong. The HTTP calls are the few `_get_*` / `_head_*`
functions, here and in hub_rows.py."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from validator.config import (
    check_declared_schema,
    check_module_setup,
    declared_schema,
    resolved_configs,
)
from validator.disk import DEFAULT_MIN_FREE_MB, MIB, free_bytes
from validator.doctor.hub_rows import PROBE_DEADLINE_S, TIMEOUT, UNANSWERED, hub_names, hub_rows
from validator.doctor.options import DEFAULT_HF_MIN_FREE_GB
from validator.doctor.rows import Check, Row
from validator.errors import AnswerTooLarge, ConfigError, JsonRefused, OperatorError
from validator.kit import BaseConfig, BaseValidationModule
from validator.ledger.answers import Task
from validator.ledger.task_types import judge_task_types
from validator.options import DEFAULT_API_URL, missing_settings
from validator.outbound.bounded_reader import Answer, fetch_answer
from validator.spec import ModuleSpec

# The Date header has a one-second resolution and the request takes a while.
SKEW_OK_SECONDS = 10.0
TASK_LIST = TypeAdapter(list[Task])
SETUP = "module setup"
TYPES = "task types"


@dataclass(frozen=True)
class Settings:
    spec: ModuleSpec
    flock_api_key: str | None
    hf_token: str | None
    api_url: str = DEFAULT_API_URL
    task_ids: tuple[str, ...] = ()
    config_dir: Path | None = None
    state_dir: Path | None = None  # None: the journal lives in a Docker volume (the host)
    hf_cache_dir: Path | None = None
    min_free_mb: int = DEFAULT_MIN_FREE_MB
    hf_min_free_gb: float = DEFAULT_HF_MIN_FREE_GB
    judge_models: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    # Every secret of the module as given (None: not given), for the settings row.
    secrets: dict[str, str | None] = field(default_factory=dict)
    # The module's class where it imports (its image); None: the host, which checks the configs
    # with the schema the spec names and runs the module's own checks in the image.
    module_cls: type[BaseValidationModule] | None = None
    folder: Path | None = None  # the module's folder, for the spec's config_schema
    # Every module's spec, for the type each declares of its tasks (validator/ledger/task_types.py).
    modules: Mapping[str, ModuleSpec] = field(default_factory=dict)

    @classmethod
    def given(
        cls,
        spec: ModuleSpec,
        secrets: Mapping[str, str | None],
        api_url: str,
        task_ids: Iterable[str] | None,
        config_dir: Path,
        **rest: Any,
    ) -> Settings:
        """The settings from either doctor's command line: `secrets` as gathered_secrets gives
        them, by variable name (the settings row names only those the module needs),
        `task_ids` as parse_task_ids gives them (None: not given); `rest` is the command's own."""
        return cls(
            spec,
            secrets.get("FLOCK_API_KEY"),
            secrets.get("HF_TOKEN"),
            api_url,
            tuple(task_ids or ()),
            config_dir,
            secrets={name: value for name, value in secrets.items() if spec.needs(name)},
            **rest,
        )


def service_checks(settings: Settings) -> list[Check]:
    """The checks that do not need Docker, each run within the doctor's deadline."""
    checks = [
        Check(("settings",), lambda: [settings_row(settings)]),
        Check(("configs",), lambda: [configs_row(settings)]),
        Check(("Fed Ledger", "clock", TYPES), lambda: ledger_rows(settings)),
    ]
    if settings.state_dir is not None:
        state_dir = settings.state_dir
        checks.append(
            Check(
                ("disk: journal",),
                lambda: [disk_row("disk: journal", state_dir, settings.min_free_mb)],
            )
        )
    if settings.hf_cache_dir is not None and "hf-cache" in settings.spec.volumes:
        cache, floor = settings.hf_cache_dir, int(settings.hf_min_free_gb * 1024)
        checks.append(
            Check(("disk: HF cache",), lambda: [disk_row("disk: HF cache", cache, floor)])
        )
    names = hub_names(settings.spec, settings.config_dir)
    if names:
        hub = (settings.spec, settings.config_dir, settings.hf_token, settings.env)
        checks.append(Check(names, lambda: hub_rows(*hub)))
    checks.append(Check((SETUP,), lambda: [setup_row(settings)]))
    return checks


# -- the settings, the configs, the module's own checks --------------------------------------


def settings_row(settings: Settings) -> Row:
    """Every setting the validator needs and was not given, at once."""
    missing = missing_settings(settings.task_ids, settings.secrets, settings.spec, settings.env)
    if missing:
        return Row.failed(
            "settings",
            f"missing {'; missing '.join(missing)}",
            "set them in the environment (or .env) or give their options",
        )
    given = [name for name, value in settings.secrets.items() if value]
    given += list(settings.spec.required_env)
    return Row.ok("settings", f"task ids {', '.join(settings.task_ids)}; {', '.join(given)} set")


def config_schema(settings: Settings) -> type[BaseConfig] | None:
    """The schema the validator reads the configs with: the module's class's, or on the host
    the one the spec names (ConfigError when the two differ or it cannot be imported)."""
    if settings.module_cls is not None:
        check_declared_schema(settings.spec, settings.module_cls)
        return settings.module_cls.config_schema
    if settings.folder is None:
        return None
    return declared_schema(settings.spec, settings.folder)


def checked_configs(settings: Settings) -> list[BaseConfig]:
    """The distinct configs of the tasks (the module's own without tasks); ConfigError naming
    the file and key of the first that is wrong."""
    schema = config_schema(settings)
    if schema is None or settings.config_dir is None:
        return []
    return resolved_configs(schema, settings.config_dir, settings.spec.name, settings.task_ids)


def configs_row(settings: Settings) -> Row:
    name = "configs"
    if settings.config_dir is None:
        return Row.skipped(name, "a config dir")
    try:
        if config_schema(settings) is None:
            return Row.skipped(
                name,
                "the module's config schema",
                f"name it in modules/{settings.spec.name}/module.yaml (config_schema), or run "
                "`python -m validator doctor` where the module imports",
            )
        configs = checked_configs(settings)
    except ConfigError as exc:
        return Row.failed(name, str(exc), "fix that key in that file")
    tasks = f" and tasks {', '.join(settings.task_ids)}" if settings.task_ids else ""
    return Row.ok(
        name,
        f"{settings.config_dir}/{settings.spec.name}.json{tasks}: valid "
        f"({len(configs)} distinct config{'s' if len(configs) != 1 else ''})",
    )


def setup_row(settings: Settings) -> Row:
    """The module's own start-up checks (BaseValidationModule.check_setup) for each distinct
    config, as the validator runs them at start; the host runs them in the module's image."""
    module_cls = settings.module_cls
    if module_cls is None:
        return Row.skipped(SETUP, "the module's code", "run the doctor in the module's image")
    try:
        configs = checked_configs(settings)
    except ConfigError:
        return Row.skipped(SETUP, "valid configs (see configs)")
    if settings.judge_models and "judge_models" in module_cls.config_schema.model_fields:
        # the doctor's --judge-model: more judge models to expect (llm_judge)
        configs = [_with_judges(config, settings.judge_models) for config in configs]
    try:
        checked = check_module_setup(module_cls, settings.spec.name, configs)
    except OperatorError as exc:
        return Row.failed(SETUP, str(exc), "fix what it names; the validator stops there too")
    return Row.ok(SETUP, "; ".join(dict.fromkeys(checked)) or f"{settings.spec.name}: none needed")


def _with_judges(config: BaseConfig, more: Sequence[str]) -> BaseConfig:
    """`config` expecting `more` judge models too (its schema has `judge_models`: read by name,
    as the doctor knows no module's schema)."""
    listed = getattr(config, "judge_models", None)
    if not isinstance(listed, list):
        return config
    return config.model_copy(update={"judge_models": [*listed, *more]})


# -- the Fed Ledger -------------------------------------------------------------------------


def ledger_rows(settings: Settings) -> list[Row]:
    """GET /tasks/list with the key: the one read-only call of the API (a lookup would take an
    assignment). Its Date header gives the clock's skew; its tasks' types, the task ids'."""
    name = "Fed Ledger"
    api_key, task_ids = settings.flock_api_key, settings.task_ids
    after = [
        Row.skipped("clock", "an answer from the Fed Ledger"),
        Row.skipped(TYPES, "a task list"),
    ]
    if not api_key:
        return [Row.failed(name, "no key", "set FLOCK_API_KEY (or --flock-api-key)"), *after]
    url = settings.api_url.rstrip("/") + "/tasks/list"
    try:
        response = _get_task_list(url, api_key)
    except AnswerTooLarge as exc:
        return [Row.failed(name, str(exc), "check --api-url / FLOCK_API_URL"), *after]
    except UNANSWERED as exc:
        return [
            Row.failed(
                name,
                f"{url} unreachable ({type(exc).__name__})",
                "check the network, a proxy, or --api-url / FLOCK_API_URL",
            ),
            *after,
        ]
    row, tasks = _ledger_answer(name, url, response, task_ids)
    clock = clock_row(response.headers.get("Date"), time.time())
    return [row, clock, after[1] if tasks is None else task_types_row(settings, tasks)]


def task_types_row(settings: Settings, tasks: list[Task]) -> Row:
    """Each task id's type in the list against the modules' (the check the validator makes
    before its first lookup, validator/ledger/task_types.py)."""
    if not settings.task_ids:
        return Row.skipped(TYPES, "task ids", "give --task_ids or TASK_IDS")
    verdicts = judge_task_types(tasks, settings.task_ids, settings.spec, settings.modules)
    refusal = verdicts.refusal()
    if refusal is not None:
        return Row.failed(TYPES, refusal, "the validator stops there too, before any lookup")
    if verdicts.warnings:
        return Row.warning(TYPES, "; ".join(verdicts.warnings), "check TASK_IDS")
    if not verdicts.fit:
        return Row.skipped(TYPES, "task ids the Fed Ledger lists (see its row)")
    unlisted = f"; {', '.join(verdicts.unlisted)} not listed" if verdicts.unlisted else ""
    return Row.ok(TYPES, f"{', '.join(verdicts.fit)}: {settings.spec.name} tasks{unlisted}")


def _get_task_list(url: str, api_key: str) -> Answer:
    """The task list read within the ledger.tasks cap: uncapped, a 300 MB answer takes the
    doctor to 2.5 GB."""
    return fetch_answer(
        "GET", url, "ledger.tasks", deadline_s=PROBE_DEADLINE_S, timeout=TIMEOUT,
        headers={"flock-api-key": api_key},
    )  # fmt: skip


def _ledger_answer(
    name: str, url: str, response: Answer, task_ids: tuple[str, ...]
) -> tuple[Row, list[Task] | None]:
    """The Fed Ledger's row, and the tasks listed (None: no task list)."""
    status = response.status_code
    if status in (401, 403):
        return Row.failed(
            name,
            f"HTTP {status}: the API refused the key",
            "check FLOCK_API_KEY (or --flock-api-key): the key of your validator account",
        ), None
    fix = "check --api-url / FLOCK_API_URL; retry later if the API is down"
    if status != 200:
        return Row.failed(name, f"GET {url}: HTTP {status}, not a task list", fix), None
    try:
        tasks = TASK_LIST.validate_python(response.json())  # decoded within the cap's values
    except JsonRefused as exc:
        return Row.failed(name, f"GET {url}: HTTP 200, not a task list: {exc}", fix), None
    except ValidationError as exc:
        why = _first(exc)
        return Row.failed(name, f"GET {url}: HTTP 200, not a task list: {why}", fix), None
    listed = {task.id for task in tasks}
    missing = [task_id for task_id in task_ids if task_id not in listed]
    if missing:
        return Row.warning(
            name,
            f"key accepted; task {', '.join(missing[:5])} not in the API's {len(listed)} tasks",
            "check TASK_IDS",
        ), tasks
    return Row.ok(name, f"key accepted; {len(listed)} tasks listed"), tasks


def _first(exc: ValidationError) -> str:
    """The first thing wrong in an answer, where it is: `[3].id: Field required`."""
    error = exc.errors()[0]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where or 'the answer'}: {error['msg']}{more}"


def clock_row(date_header: str | None, now: float) -> Row:
    name = "clock"
    if not date_header:
        return Row.warning(name, "the API sent no Date header", "check the clock by hand (NTP)")
    try:
        server = parsedate_to_datetime(date_header).timestamp()
    except (TypeError, ValueError):
        return Row.warning(name, "the API's Date header is unreadable", "check the clock (NTP)")
    skew = now - server
    if abs(skew) <= SKEW_OK_SECONDS:
        return Row.ok(name, f"{skew:+.0f} s from the API's clock")
    return Row.warning(
        name,
        f"{skew:+.0f} s from the API's clock: timestamps in records and logs are off",
        "turn on time sync (timedatectl set-ntp true, or chrony)",
    )


# -- disks ----------------------------------------------------------------------------------


def disk_row(name: str, path: Path, floor_mb: int) -> Row:
    """Free space as the disk guard counts it (validator/disk.py), against `floor_mb`."""
    try:
        free_mb = free_bytes(path) // MIB  # a path not created yet: its file system
    except OSError as exc:
        return Row.failed(name, f"{path}: {exc.strerror or exc}", "check the path and its mount")
    if free_mb < floor_mb:
        return Row.failed(
            name,
            f"{path}: {free_mb} MiB free, under the {floor_mb} MiB floor",
            "free space there or give it a larger volume",
        )
    return Row.ok(name, f"{path}: {free_mb} MiB free (floor {floor_mb} MiB)")
