"""Earlier import paths of the validator, kept as aliases that warn (the house's rule: a public
interface changes with an alias, not a break). `import validator.base` gives the module now at
`validator.kit.base`, the same object, after a FutureWarning (shown by default: module authors
see it in the validator's log, not only under pytest).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# Paths a module author could have imported before the kit: old path -> (where the module is
# now, the release that removes the alias). Module authors: validator.kit has all of these under
# one import. The loop's own earlier paths (the journal, the Fed Ledger client, the observer...)
# were never an author's, and are gone.
MOVED: dict[str, tuple[str, str]] = {
    "validator.exceptions": ("validator.errors", "0.3"),
    "validator.base": ("validator.kit.base", "0.3"),
    "validator.phases": ("validator.scope", "0.3"),
    "validator.progress": ("validator.kit.progress", "0.3"),
    "validator.downloads": ("validator.kit.downloads", "0.3"),
    "validator.workdirs": ("validator.kit.workdirs", "0.3"),
    "validator.safe_json": ("validator.outbound.safe_json", "0.3"),
    "validator.hub": ("validator.kit.hub", "0.3"),
    "validator.adapter_bounds": ("validator.kit.adapter_bounds", "0.3"),
    "validator.child_process": ("validator.sandbox.child_process", "0.3"),
    "validator.deadline": ("validator.outbound.deadline", "0.3"),
}


# Names that a module author could have imported, renamed: module -> {old name: (the name now,
# the release that removes the old one)}. One class, one name: the old name is the same object.
RENAMED: dict[str, dict[str, tuple[str, str]]] = {
    "validator.errors": {"RecoverableException": ("OperatorError", "0.3")},
    "validator.kit": {"RecoverableException": ("OperatorError", "0.3")},
}


# Names a module author could have imported from a module that no longer defines them: module ->
# {name: (the module that defines it now, the release that removes the old place)}.
MOVED_NAMES: dict[str, dict[str, tuple[str, str]]] = {
    "validator.kit.hub": {"fetch_base_model": ("validator.kit.base_models", "0.3")},
}


class MovedPathWarning(FutureWarning):
    """An import of a validator path that has moved; the message names the new one."""


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None, target: object = None):  # noqa: ANN201
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new, removed_in = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} has moved to {new} (the old path goes in {removed_in}); module "
            "authors import from validator.kit (docs/module-api.md)",
            MovedPathWarning,
            stacklevel=2,
        )
        # The module itself under its old name too: one object, one state, whichever path.
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was imported under its new name."""


def renamed(module: str, name: str) -> str | None:
    """The name now of `module`'s old `name`, after a MovedPathWarning at the caller's caller
    (the author's import line); None if `name` was never renamed there."""
    if name not in RENAMED.get(module, {}):
        return None
    new, removed_in = RENAMED[module][name]
    warnings.warn(
        f"{module}.{name} is now {module}.{new} (the old name goes in {removed_in})",
        MovedPathWarning,
        stacklevel=3,
    )
    return new


def moved_name(module: str, name: str) -> object:
    """`module`'s old `name`, from the module that defines it now (by name: the old place does
    not import the new one), after a MovedPathWarning at the caller's caller; AttributeError
    for a name that never was there."""
    if name not in MOVED_NAMES.get(module, {}):
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new, removed_in = MOVED_NAMES[module][name]
    warnings.warn(
        f"{module}.{name} is now {new}.{name}; module authors import it from validator.kit "
        f"(the old place goes in {removed_in})",
        MovedPathWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(new), name)


def install() -> None:
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
