"""Module instances per resolved config, and scoring one input with a module."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from validator.config import resolve_config
from validator.errors import (
    ModuleCannotStart,
    OperatorError,
    SubmissionRejected,
    Verdict,
    classify,
    describe,
)
from validator.kit import BaseConfig, BaseInputData, BaseMetrics, BaseValidationModule
from validator.observe.lines import MAX_LINE, MAX_VALUE
from validator.scope import current_scope
from validator.text import bounded, quoted

log = logging.getLogger(__name__)


class InvalidInput(SubmissionRejected):
    """The assignment's input does not fit the module's input schema: the submission's fault."""


class ModulePool:
    """One module instance per distinct resolved config, shared by the tasks that have it, so
    that expensive state (a base model kept in GPU memory) is loaded once."""

    def __init__(
        self, module_cls: type[BaseValidationModule], module_name: str, config_dir: Path
    ) -> None:
        self.module_cls = module_cls
        self.module_name = module_name
        self.config_dir = config_dir
        self._instances: dict[str, BaseValidationModule] = {}

    def config_for(self, task_id: str | None) -> BaseConfig:
        return resolve_config(
            self.module_cls.config_schema, self.config_dir, self.module_name, task_id
        )

    def module_for(self, task_id: str | None) -> BaseValidationModule:
        config = self.config_for(task_id)
        key = config.model_dump_json()
        if key not in self._instances:
            # The digest and what differs from the defaults; the whole config at --debug (and
            # in each assignment's record).
            log.info("%s", config_line(self.module_name, config))
            log.debug("module %s config: %s", self.module_name, key)
            self._instances[key] = self._start(config)
        return self._instances[key]

    def _start(self, config: BaseConfig) -> BaseValidationModule:
        try:
            # The host's work (a base model loads): a death in here is not counted against the
            # submission being scored, and its time is that assignment's "load".
            with current_scope().host_work("load"):
                return self.module_cls(config)
        except Exception as exc:
            # __init__ sees the operator's config and no submission: what would fail or count
            # against a submission in validate() is the module's or the operator's problem here.
            if classify(exc) not in (Verdict.REJECTED, Verdict.UNEXPECTED):
                raise  # transient, device, operator: as in validate()
            log.error("module %s cannot start", self.module_name, exc_info=exc)
            raise ModuleCannotStart(
                f"module {self.module_name} cannot start: {describe(exc)} (traceback above)"
            ) from exc


def score(
    module: BaseValidationModule, raw_input: dict[str, Any], *, local_paths: bool = False
) -> dict[str, Any]:
    """Validate one submission; returns the metrics to submit. `cleanup()` always runs.
    `local_paths`: the input's URL fields may name files of this host (`--check` only)."""
    try:
        data = module.input_data_schema.model_validate(raw_input)
    except ValidationError as exc:
        raise InvalidInput(
            f"assignment input does not fit {type(module).__name__}: {input_problems(exc)}"
        ) from exc
    if not local_paths:
        _check_urls(data)
    try:
        metrics = module.validate(data)
    finally:
        module.cleanup()
    return _metrics_dict(module, metrics)


def input_problems(exc: ValidationError, shown: int = 5) -> str:
    """What is wrong with an input, by field, in one line (pydantic's own text is lines, with
    a URL of its docs): `missing field 'max_params'; field 'context_length': Input should be
    greater than 0`, the first `shown` of them."""
    problems = []
    for error in exc.errors(include_url=False)[:shown]:
        field = quoted(".".join(str(part) for part in error["loc"]) or "(the input)")
        if error["type"] == "missing":
            problems.append(f"missing field {field}")
        else:
            problems.append(f"field {field}: {error['msg']}")
    more = exc.error_count() - shown
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


def _check_urls(data: BaseInputData) -> None:
    for name in sorted(data.url_fields):
        value = getattr(data, name, None)
        if isinstance(value, str) and urlsplit(value).scheme.lower() not in ("http", "https"):
            raise InvalidInput(
                f"{name} {quoted(value)} is not an http(s) URL; a validator fetches nothing "
                "else (a local path is only for --check)"
            )


def _metrics_dict(module: BaseValidationModule, metrics: Any) -> dict[str, Any]:
    schema = module.metrics_schema
    if isinstance(metrics, dict):
        try:
            metrics = schema.model_validate(metrics)
        except ValidationError as exc:
            raise OperatorError(
                f"{type(module).__name__}.validate() returned metrics that do not fit "
                f"{schema.__name__}: {exc}"
            ) from exc
    if not isinstance(metrics, BaseMetrics):
        raise OperatorError(
            f"{type(module).__name__}.validate() returned {type(metrics).__name__}, "
            f"expected {schema.__name__}"
        )
    # Python mode keeps inf/NaN as floats; json.dumps then writes Infinity like the reference.
    return metrics.model_dump()


def config_line(module: str, config: BaseModel) -> str:
    """The log line of a module's start: its config's digest and the keys that differ from the
    defaults (the full config in the record and at --debug), as short as observe/lines.py's."""
    full = config.model_dump_json()
    digest = hashlib.sha256(full.encode()).hexdigest()[:12]
    defaults = _defaults(config)
    changed = [
        f"{name}={bounded(json.dumps(value, default=str), MAX_VALUE)}"
        for name, value in config.model_dump(mode="json").items()
        if name not in defaults or defaults[name] != value
    ]
    head = f"starting module {module} with config {digest}"
    set_ = f" (set: {', '.join(changed)})" if changed else " (the defaults)"
    return bounded(head + set_, MAX_LINE)


def _defaults(config: BaseModel) -> dict[str, Any]:
    """The config's fields that have a default, at their default (JSON values)."""
    found = {}
    for name, field in type(config).model_fields.items():
        if field.is_required():
            continue
        value = field.get_default(call_default_factory=True)
        try:
            found[name] = json.loads(json.dumps(value, default=str))
        except (TypeError, ValueError):
            continue
    return found
