"""Layered module config: schema defaults < `configs/<module>.json` < `configs/tasks/<id>.json`.

Errors name the file and the key (and the key meant, for a typo), because the operator has to
find and fix them. The same check runs in run.py and the doctor on the host, before any
container starts, with the schema the module's spec names (`config_schema`, imported without
the module's own dependencies), and in the validator at start with the module's class.
"""

from __future__ import annotations

import difflib
import importlib
import json
import logging
import os
import stat
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from validator._moved import alias
from validator.errors import ConfigError, ModuleCannotStart, OperatorError, describe
from validator.kit import BaseConfig, BaseValidationModule
from validator.outbound.safe_json import shape
from validator.spec import TASK_TYPE, ModuleSpec

log = logging.getLogger(__name__)

# A config file or a --check input is a few KB of flat settings: far more than either needs,
# and small enough that reading one costs nothing.
MAX_JSON_FILE_BYTES = 1024 * 1024
MAX_JSON_FILE_DEPTH = 32


def read_json_object(path: Path, holds: str, shown_as: str | None = None) -> dict[str, Any]:
    """A file holding one JSON object; ConfigError naming the file otherwise, in one line: a
    file that is not a regular one once its links are followed (a FIFO, /dev/zero), over
    MAX_JSON_FILE_BYTES, nested deeper than MAX_JSON_FILE_DEPTH, or not JSON (NaN and
    Infinity are not). `holds` says what the object should be, `shown_as` how messages name
    the file (its host path, where run.py mounted it; `path` unless given)."""
    where = shown_as or str(path)
    value = _decoded(where, _regular_file_bytes(path, MAX_JSON_FILE_BYTES, where))
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must hold a JSON object {holds}")
    return value


def _regular_file_bytes(path: Path, limit: int, where: str) -> bytes:
    """At most `limit` bytes of `path`, a regular file; looked at before it is opened (a device
    is never opened) and again once open, without blocking (a FIFO swapped in between)."""
    try:
        _refuse_special(path, path.stat().st_mode, where)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{where}{_link(path)}: cannot be read: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as file:
        _refuse_special(path, os.fstat(fd).st_mode, where)
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{where}: over {limit} bytes, more than any config or input needs")
    return data


def _refuse_special(path: Path, mode: int, where: str) -> None:
    if stat.S_ISREG(mode):
        return
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    kind = next((name for test, name in kinds if test(mode)), "not a file")
    raise ConfigError(f"{where}{_link(path)} is {kind}, not a regular file: give a JSON file")


def _link(path: Path) -> str:
    return f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""


def _decoded(where: str, data: bytes) -> Any:
    """The JSON value of `data`; its depth measured before the decoder recurses into it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: cannot be read: {exc}") from exc
    if shape(text, MAX_JSON_FILE_DEPTH)[1]:
        raise ConfigError(f"{where}: JSON nested deeper than {MAX_JSON_FILE_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=_not_a_number)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except ValueError as exc:  # NaN or Infinity, or a number past Python's digits
        raise ConfigError(f"{where}: {exc}") from exc


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON has: give a finite number")


def _read_layer(path: Path) -> dict[str, Any]:
    # A link to nowhere is read (and refused): an operator's settings are never skipped.
    exists = path.exists() or path.is_symlink()
    return read_json_object(path, "of settings") if exists else {}


def layer_paths(config_dir: Path, module: str, task_id: str | None) -> list[Path]:
    paths = [config_dir / f"{module}.json"]
    if task_id is not None:
        paths.append(config_dir / "tasks" / f"{task_id}.json")
    return paths


def resolve_config(
    schema: type[BaseConfig], config_dir: Path, module: str, task_id: str | None = None
) -> BaseConfig:
    """The config a task runs with; raises `ConfigError` naming file and key when invalid."""
    merged: dict[str, Any] = {}
    origin: dict[str, Path] = {}
    for path in layer_paths(config_dir, module, task_id):
        layer = _read_layer(path)
        merged.update(layer)
        origin.update({key: path for key in layer})
    try:
        return schema(**merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, origin, config_dir / f"{module}.json", schema)) from exc


def resolved_configs(
    schema: type[BaseConfig], config_dir: Path, module: str, task_ids: Iterable[str] = ()
) -> list[BaseConfig]:
    """The distinct configs these tasks run with (the module's own when none is given), in
    order; raises ConfigError naming the first file and key that is wrong."""
    configs: dict[str, BaseConfig] = {}
    named: list[str | None] = [*task_ids]
    for task_id in named or [None]:
        config = resolve_config(schema, config_dir, module, task_id)
        configs.setdefault(config.model_dump_json(), config)
    return list(configs.values())


def _close_key(key: str, schema: type[BaseConfig]) -> str:
    close = difflib.get_close_matches(key, list(schema.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _describe(
    exc: ValidationError, origin: dict[str, Path], module_file: Path, schema: type[BaseConfig]
) -> str:
    problems = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(root)"
        top = str(error["loc"][0]) if error["loc"] else ""
        where = origin.get(top, module_file)
        if error["type"] == "extra_forbidden":
            close = _close_key(key, schema) if len(error["loc"]) == 1 else ""
            problems.append(f"{where}: unknown key {key!r}{close}")
        elif error["type"] == "missing":
            problems.append(f"{where}: required key {key!r} is missing")
        else:
            problems.append(f"{where}: key {key!r}: {error['msg']}")
    return "invalid config: " + "; ".join(problems)


# -- the schema on the host ------------------------------------------------------------------


def declared_schema(spec: ModuleSpec, folder: Path) -> type[BaseConfig] | None:
    """The config schema the spec's `config_schema` names, or None when it names none.

    `schemas.LoraConfig` is the file `schemas.py` of the module folder, imported under its own
    name but without the package's `__init__.py` (which imports torch, absent on the host): the
    package is a bare stand-in for the import, and whatever was imported of it before is put
    back after. A bare `FixtureConfig` is in `__init__.py`, which is then imported as it is.
    Raises ConfigError naming the spec when the name does not lead to a config class."""
    if spec.config_schema is None:
        return None
    file_name, _, class_name = spec.config_schema.rpartition(".")
    package = f"modules.{spec.name}"
    where = f"modules/{spec.name}/module.yaml: config_schema {spec.config_schema!r}"
    ours = [name for name in sys.modules if name == package or name.startswith(package + ".")]
    saved = {name: sys.modules.pop(name) for name in ours} if file_name else {}
    try:
        if file_name:
            stand_in = types.ModuleType(package)
            stand_in.__path__ = [str(folder)]
            sys.modules[package] = stand_in
            found = importlib.import_module(f"{package}.{file_name}")
        else:
            found = importlib.import_module(package)
    except ImportError as exc:
        raise ConfigError(
            f"{where} cannot be imported here: {exc}; put the config in a file that imports "
            "without the module's own dependencies (docs/module-api.md)"
        ) from exc
    finally:
        if file_name:
            for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
                del sys.modules[name]
            sys.modules.update(saved)
    schema = getattr(found, class_name, None)
    if not (isinstance(schema, type) and issubclass(schema, BaseConfig)):
        raise ConfigError(f"{where} is not a BaseConfig subclass")
    return schema


def check_declared_schema(spec: ModuleSpec, module_cls: type[BaseValidationModule]) -> None:
    """The spec's `config_schema` is the class's own, so that the host checks configs with the
    schema the validator uses; ConfigError otherwise (a module author's mistake)."""
    if spec.config_schema is None:
        return
    schema = module_cls.config_schema
    file_name, _, class_name = spec.config_schema.rpartition(".")
    expected = ".".join(part for part in (f"modules.{spec.name}", file_name) if part)
    if (schema.__module__, schema.__qualname__) != (expected, class_name):
        raise ConfigError(
            f"modules/{spec.name}/module.yaml: config_schema {spec.config_schema!r}, but "
            f"MODULE.config_schema is {schema.__module__}.{schema.__qualname__}"
        )


def with_class_task_type(spec: ModuleSpec, module_cls: type[BaseValidationModule]) -> ModuleSpec:
    """The spec, its `task_type` taken from the module's class where only the class sets one
    (how a module declared it before the spec did): with a warning, as an alias. The spec's
    own wins; the host, which cannot import the class, reads the spec alone."""
    declared = getattr(module_cls, "task_type", "")
    if not declared or not isinstance(declared, str):
        return spec
    log.warning("modules/%s: %s: %r", spec.name, alias("MODULE.task_type").line, declared)
    if spec.task_type is not None or not TASK_TYPE.fullmatch(declared):
        return spec
    return spec.model_copy(update={"task_type": declared})


# -- the module's own start-up checks ---------------------------------------------------------


def check_module_setup(
    module_cls: type[BaseValidationModule], module: str, configs: Iterable[BaseConfig]
) -> list[str]:
    """`check_setup` of each config (docs/module-api.md), then the children's bounds against
    this process's hard limits: what each checked, in a few words. Raises ModuleCannotStart or
    ChildBoundUnfit (exit 3) naming what failed: the validator and the doctor run this same
    code."""
    configs = list(configs)
    checked = []
    for config in configs:
        try:
            said = module_cls.check_setup(config)
        except Exception as exc:
            if not isinstance(exc, OperatorError):  # a bug, or a library's error: its trace
                log.error("start-up checks of module %s failed", module, exc_info=exc)
            why = str(exc) if isinstance(exc, OperatorError) else describe(exc)
            raise ModuleCannotStart(f"module {module}'s start-up checks: {why}") from exc
        if said:
            checked.append(said)
    checked.append(check_child_bounds(module_cls, module, configs))
    return checked


def check_child_bounds(
    module_cls: type[BaseValidationModule], module: str, configs: Iterable[BaseConfig]
) -> str:
    """The bounds of the module's children (its `child_limits`, and the kit's own) under each
    config against this process's hard limits; ChildBoundUnfit (exit 3) with the line of the
    first that no child could take. What was checked, in a few words."""
    # Here: run.py imports this file on the host, without the sandbox's needs.
    from validator.kit import SUBMISSION_LIMITS  # noqa: PLC0415

    SUBMISSION_LIMITS.check_fits("the kit's submission readers (SUBMISSION_LIMITS)")
    for config in configs:
        for keys, limits in module_cls.child_limits(config).items():
            lower = f"{keys} in configs/{module}.json (or the task's config)"
            limits.check_fits(f"module {module}'s {keys}", lower)
    return "children's bounds fit this process's hard limits"
