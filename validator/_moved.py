"""Every earlier spelling kept working with a warning, in one table (`ALIASES`), each with the
release that removes it: the house's rule is that a public interface changes with an alias,
never a break, and tests/test_aliases.py fails once the package reaches an alias's release.

Three kinds: an import path (`import validator.base` gives `validator.kit.base`, the same
module object), a name in a module (its `__getattr__` calls `moved_name`), and anything else a
person writes (a command, a config key, an argument: its code says `alias(old).line`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import re
import sys
import warnings
from contextlib import AbstractContextManager
from types import ModuleType
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from validator.scope import HostPhase

Kind = Literal["path", "name", "spelling"]


class MovedPathWarning(FutureWarning):
    """An earlier spelling (a path, a name, an argument); the message names the one to use."""


class Alias(NamedTuple):
    old: str  # the earlier spelling: a dotted path for a path or a name
    new: str  # what to write instead
    removed_in: str  # the release that removes `old`
    kind: Kind
    gives: str = ""  # the object an old name gives, by dotted path, where it is not `new`
    gone: bool = False  # an old name that gives nothing: reading it raises, naming `new`
    note: str = ""  # what else changed with it

    @property
    def line(self) -> str:
        """What the warning says: the old spelling, the new one, and when the old one goes."""
        note = f"; {self.note}" if self.note else ""
        return f"{self.old} has moved to {self.new}{note} (the old one goes in {self.removed_in})"

    def warn(self, stacklevel: int = 1) -> None:
        """A MovedPathWarning `stacklevel` frames above the caller."""
        warnings.warn(self.line, MovedPathWarning, stacklevel=stacklevel + 2)


def _path(old: str, new: str, removed_in: str, note: str = "") -> Alias:
    return Alias(
        old, new, removed_in, "path", note=note or "module authors import from validator.kit"
    )


def _name(
    old: str, new: str, removed_in: str, *, gives: str = "", gone: bool = False, note: str = ""
) -> Alias:
    return Alias(old, new, removed_in, "name", gives, gone, note)


def _said(old: str, new: str, removed_in: str, note: str = "") -> Alias:
    return Alias(old, new, removed_in, "spelling", note=note)


ALIASES: tuple[Alias, ...] = (
    # Paths a module author could have imported before the kit.
    _path("validator.exceptions", "validator.errors", "0.3"),
    _path("validator.base", "validator.kit.base", "0.3"),
    _path("validator.phases", "validator.scope", "0.3"),
    _path("validator.progress", "validator.kit.progress", "0.3"),
    _path("validator.downloads", "validator.kit.downloads", "0.3"),
    _path("validator.workdirs", "validator.kit.workdirs", "0.3"),
    _path("validator.safe_json", "validator.outbound.safe_json", "0.3"),
    _path("validator.hub", "validator.kit.hub", "0.3"),
    _path("validator.adapter_bounds", "validator.kit.adapter_bounds", "0.3"),
    _path("validator.child_process", "validator.sandbox.child_process", "0.3"),
    _path("validator.deadline", "validator.outbound.deadline", "0.3"),
    # The kit's former face files: each name now imported from validator.kit itself.
    _path("validator.kit.errors", "validator.errors", "0.3"),
    _path("validator.kit.outbound", "validator.kit", "0.3"),
    _path("validator.kit.run_context", "validator.run_context", "0.3"),
    _path("validator.kit.sandbox", "validator.kit", "0.3"),
    _path("validator.kit.scope", "validator.scope", "0.3"),
    _path("validator.kit.text", "validator.text", "0.3"),
    _path(
        "modules.llm_judge.warm_base",
        "validator.kit.warm_base",
        "0.3",
        note="import WarmBase from validator.kit: merge(adapter_dir) is apply(attach)",
    ),
    # Names, each given by its old module's `__getattr__`.
    _name("validator.errors.RecoverableException", "validator.errors.OperatorError", "0.3"),
    _name("validator.kit.RecoverableException", "validator.kit.OperatorError", "0.3"),
    _name(
        "validator.kit.hub.fetch_base_model",
        "validator.kit.fetch_base_model",
        "0.3",
        gives="validator.kit.base_models.fetch_base_model",
    ),
    _name(
        "validator.scope.host_work",
        "current_scope().host_work",
        "0.3",
        gives=f"{__name__}.host_work",
    ),
    _name("validator.scope.note", "current_scope().note", "0.3", gives=f"{__name__}.note"),
    _name(
        "validator.scope.heartbeat",
        "current_scope().heartbeat",
        "0.3",
        gives=f"{__name__}.heartbeat",
    ),
    _name(
        "validator.kit.progress.Progress",
        "validator.kit.Progress",
        "0.3",
        gives="validator.scope.Progress",
    ),
    _name("modules.lora.base_models.pick_device", "validator.kit.pick_device", "0.3"),
    _name(
        "modules.lora.base_models.BaseModelCache",
        "validator.kit.WarmBase",
        "0.3",
        gone=True,
        note="with read_base as its load",
    ),
    _name("modules.lora.base_models.LoadedBase", "validator.kit.HeldBase", "0.3", gone=True),
    _name(
        "modules.llm_judge.loading.pick_device",
        "modules.llm_judge.loading.device_and_dtype",
        "0.3",
        note="validator.kit.pick_device for the device alone",
    ),
    # What else a person writes: a command, a declaration, a config key, an argument.
    _said("python -m validator new-module", "python -m devkit.scaffold NAME", "0.3"),
    _said("python run.py MODULE report", "python run.py report MODULE", "0.3"),
    _said("python -m launcher.release_cli", "python run.py release", "0.3"),
    _said("python -m launcher.published", "python run.py release", "0.3"),
    _said("python -m launcher.compose", "python run.py compose", "0.3"),
    _said("python -m launcher.kubernetes", "python run.py kubernetes", "0.3"),
    _said("MODULE.task_type", "task_type in the module's module.yaml", "0.3"),
    _said(
        "llm_judge's prompt_files",
        "prompt_source",
        "0.3",
        note="prompt_files replaces rubrics with your files, in `$` syntax",
    ),
    _said(
        "check_lora_against_base(..., weights: Path)",
        "check_lora_against_base(..., tensors: list[LoraTensor])",
        "0.3",
        note="a Path parses the header in the validator's process, not in a bounded child",
    ),
)

_BY_OLD = {alias.old: alias for alias in ALIASES}


def alias(old: str) -> Alias:
    """The alias of `old` (KeyError for a spelling the table does not hold: a typo of ours)."""
    return _BY_OLD[old]


def release(version: str) -> tuple[int, int, int]:
    """`"0.3"` -> (0, 3, 0), `"0.3.1rc1"` -> (0, 3, 1): releases compare by their numbers."""
    numbers = re.match(r"\d+(?:\.\d+)*", version)
    parts = [int(part) for part in numbers.group().split(".")] if numbers else []
    major, minor, patch = (parts + [0, 0, 0])[:3]
    return major, minor, patch


def overdue(version: str) -> list[Alias]:
    """The aliases that a package of `version` must no longer hold."""
    return [alias for alias in ALIASES if release(alias.removed_in) <= release(version)]


def moved_name(module: str, name: str) -> object:
    """`module`'s old `name`: the object the table gives, after a MovedPathWarning at the line
    that read it. AttributeError for a name that never was there, or that is gone (the error
    names what replaced it). A module's `__getattr__` returns this."""
    found = _BY_OLD.get(f"{module}.{name}")
    if found is None or found.kind != "name":
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    if found.gone:
        raise AttributeError(found.line.replace("has moved to", "is replaced by"))
    found.warn(stacklevel=2)
    where, _, attribute = (found.gives or found.new).rpartition(".")
    return getattr(importlib.import_module(where), attribute)


# The functions `from validator.phases import host_work, note` gave: the current scope's.
def host_work(phase: HostPhase) -> AbstractContextManager[None]:
    from validator.scope import current_scope  # noqa: PLC0415 - scope imports this module

    return current_scope().host_work(phase)


def note(key: str, value: object) -> None:
    from validator.scope import current_scope  # noqa: PLC0415

    current_scope().note(key, value)


def heartbeat() -> None:
    from validator.scope import current_scope  # noqa: PLC0415

    current_scope().heartbeat()


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        # The import system writes the old name's spec over the module's own after
        # create_module; exec_module puts the module's own back.
        self._own_specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        found = _BY_OLD.get(fullname)
        if found is None or found.kind != "path":
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        found = _BY_OLD[spec.name]
        found.warn(stacklevel=1)
        # The module itself under its old name too: one object, one state, whichever path.
        module = importlib.import_module(found.new)
        self._own_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module was imported under its new name) but to give the module
        its own spec back, so that it still names the module's own file and name."""
        old = module.__spec__.name if module.__spec__ is not None else ""
        if old in self._own_specs:
            module.__spec__ = self._own_specs.pop(old)


def install() -> None:
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
