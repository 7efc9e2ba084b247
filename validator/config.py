"""Layered module config: schema defaults < `configs/<module>.json` < `configs/tasks/<id>.json`.

Errors name the file and the key, because the operator has to find and fix them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from validator.errors import ConfigError
from validator.kit.base import BaseConfig


def read_json_object(path: Path, holds: str) -> dict[str, Any]:
    """A file holding one JSON object; ConfigError naming the file otherwise. `holds` says
    what the object should be, for the message."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: must hold a JSON object {holds}")
    return value


def _read_layer(path: Path) -> dict[str, Any]:
    return read_json_object(path, "of settings") if path.exists() else {}


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
        raise ConfigError(_describe(exc, origin, config_dir / f"{module}.json")) from exc


def _describe(exc: ValidationError, origin: dict[str, Path], module_file: Path) -> str:
    problems = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(root)"
        top = str(error["loc"][0]) if error["loc"] else ""
        where = origin.get(top, module_file)
        if error["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown key {key!r}")
        elif error["type"] == "missing":
            problems.append(f"{where}: required key {key!r} is missing")
        else:
            problems.append(f"{where}: key {key!r}: {error['msg']}")
    return "invalid config: " + "; ".join(problems)
