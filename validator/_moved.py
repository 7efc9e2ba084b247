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

# old path -> new path. Module authors: validator.kit has all of these under one import.
MOVED = {
    "validator.exceptions": "validator.errors",
    "validator.base": "validator.kit.base",
    "validator.phases": "validator.kit.scope",
    "validator.progress": "validator.kit.progress",
    "validator.downloads": "validator.kit.downloads",
    "validator.workdirs": "validator.kit.workdirs",
    "validator.safe_json": "validator.kit.safe_json",
    "validator.hub": "validator.kit.hub",
    "validator.adapter_bounds": "validator.kit.adapter_bounds",
    "validator.child_process": "validator.kit.child_process",
    "validator.deadline": "validator.kit.deadline",
    "validator.fedledger": "validator.ledger.client",
    "validator.fedledger_http": "validator.ledger.transport",
    "validator.submitting": "validator.ledger.submitting",
    "validator.journal": "validator.state.journal",
    "validator.journal_store": "validator.state.store",
    "validator.journal_entry": "validator.state.entry",
    "validator.records": "validator.state.records",
    "validator.observer": "validator.observe.observer",
    "validator.telemetry": "validator.observe.telemetry",
    "validator.status_server": "validator.observe.status_server",
    "validator.bounded_http": "validator.observe.bounded_http",
    "validator.logs": "validator.observe.logs",
    "validator.report_html": "validator.report.html",
}


class MovedPathWarning(FutureWarning):
    """An import of a validator path that has moved; the message names the new one."""


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None, target: object = None):  # noqa: ANN201
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} has moved to {new}; module authors import from validator.kit "
            "(docs/module-api.md)",
            MovedPathWarning,
            stacklevel=2,
        )
        # The module itself under its old name too: one object, one state, whichever path.
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was imported under its new name."""


def install() -> None:
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
