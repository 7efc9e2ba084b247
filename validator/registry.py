"""Finds modules: `modules.<name>` packages that expose `MODULE`.

`modules` is a namespace package (no `__init__.py`), so a second `modules/` folder on the
Python path, e.g. one of tests or of a third party, adds modules without touching this repo.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

from validator.errors import ConfigError, RecoverableException, UnknownModuleError
from validator.kit.base import BaseValidationModule
from validator.spec import REPO_ROOT, ModuleSpec, load_spec


def _ensure_repo_on_path() -> None:
    # `python -m validator` from another directory must still find the repo's modules/.
    if str(REPO_ROOT) not in sys.path and not any(
        Path(p or ".").resolve() == REPO_ROOT for p in sys.path
    ):
        sys.path.append(str(REPO_ROOT))


def available_modules() -> list[str]:
    _ensure_repo_on_path()
    try:
        package = importlib.import_module("modules")
    except ImportError:
        return []
    return sorted(info.name for info in pkgutil.iter_modules(package.__path__) if info.ispkg)


def _unknown(name: str, known: list[str]) -> UnknownModuleError:
    listing = ", ".join(known) if known else "none found"
    return UnknownModuleError(f"unknown module {name!r}; available modules: {listing}")


def module_folder(name: str) -> Path:
    """The folder of module `name`, found without importing it (its dependencies may be
    missing here); raises UnknownModuleError listing what exists."""
    known = available_modules()
    if not name.isidentifier() or name not in known:
        raise _unknown(name, known)
    package = importlib.import_module("modules")
    for root in package.__path__:
        if (Path(root) / name / "__init__.py").is_file():
            return Path(root) / name
    raise _unknown(name, known)


def load_module_spec(name: str) -> ModuleSpec:
    """The spec of module `name` (`module.yaml`, or the defaults for a bare folder)."""
    return load_spec(module_folder(name))


def load_module_class(name: str) -> type[BaseValidationModule]:
    """Import `modules.<name>` and return its `MODULE` class.

    Raises `UnknownModuleError` (listing what exists) when there is no such module, and
    `ConfigError` when the package exists but does not expose a proper `MODULE`.
    """
    known = available_modules()
    if not name.isidentifier() or name not in known:
        raise _unknown(name, known)
    try:
        package = importlib.import_module(f"modules.{name}")
    except ModuleNotFoundError as exc:
        # A dependency of the module is missing: wrong image or environment, not a bad name.
        raise RecoverableException(
            f"module {name!r} cannot be imported: {exc}; run it in its own image "
            f"(python run.py {name} ...) or install modules/{name}/environment.yml"
        ) from exc
    cls = getattr(package, "MODULE", None)
    if not (isinstance(cls, type) and issubclass(cls, BaseValidationModule)):
        raise ConfigError(
            f"modules/{name}/__init__.py must set MODULE to a BaseValidationModule subclass"
        )
    return cls
