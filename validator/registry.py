"""Imports modules: `modules.<name>` packages that expose `MODULE`.

What a module is (a folder with `__init__.py` and `module.yaml`) is decided by
`validator.spec.find_module_folders`, here as everywhere. `modules` is a namespace package (no
`__init__.py`), so a second `modules/` folder on the Python path, e.g. the dev tools' fixture
module or a third party's, adds modules without touching this repo: the roots searched are the
folders that hold the namespace package's parts, in import order.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from validator.errors import ConfigError, OperatorError
from validator.kit import BaseValidationModule
from validator.spec import REPO_ROOT, ModuleSpec, find_module_folders, load_spec, module_folder


def _ensure_repo_on_path() -> None:
    # `python -m validator` from another directory must still find the repo's modules/.
    if str(REPO_ROOT) not in sys.path and not any(
        Path(p or ".").resolve() == REPO_ROOT for p in sys.path
    ):
        sys.path.append(str(REPO_ROOT))


def module_roots() -> list[Path]:
    """The folders whose `modules/` make up the `modules` namespace package, in the order an
    import searches them."""
    _ensure_repo_on_path()
    try:
        package = importlib.import_module("modules")
    except ImportError:
        return [REPO_ROOT]
    return [Path(part).parent for part in package.__path__]


def available_modules() -> list[str]:
    return list(find_module_folders(*module_roots()))


def load_module_spec(name: str) -> ModuleSpec:
    """The spec of module `name` (its `module.yaml`)."""
    return load_spec(module_folder(name, *module_roots()))


def load_module_class(name: str) -> type[BaseValidationModule]:
    """Import `modules.<name>` and return its `MODULE` class.

    Raises `UnknownModuleError` (listing what exists) when there is no such module, and
    `ConfigError` when the package exists but does not expose a proper `MODULE`.
    """
    module_folder(name, *module_roots())  # UnknownModuleError, listing what exists
    try:
        package = importlib.import_module(f"modules.{name}")
    except ModuleNotFoundError as exc:
        # A dependency of the module is missing: wrong image or environment, not a bad name.
        raise OperatorError(
            f"module {name!r} cannot be imported: {exc}; run it in its own image "
            f"(python run.py {name} ...) or install modules/{name}/environment.yml"
        ) from exc
    cls = getattr(package, "MODULE", None)
    if not (isinstance(cls, type) and issubclass(cls, BaseValidationModule)):
        raise ConfigError(
            f"modules/{name}/__init__.py must set MODULE to a BaseValidationModule subclass"
        )
    return cls
