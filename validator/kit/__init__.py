"""The one import for module authors (docs/module-api.md): everything a module needs from the
validator, and nothing of the loop.

    from validator.kit import BaseValidationModule, SubmissionRejected, current_scope

The stub beside this file (`__init__.pyi`) is the kit's one table of names: type checkers read
its imports, and this module reads the same ones to load each name on first use, from the
module that defines it (so a module that needs no torch, rl, does not import it through
`check_lora_against_base`). What `__all__` does not list is the validator's own and may move.
"""

import ast
import importlib
import importlib.util
from pathlib import Path

from validator._moved import moved_name

# The stub ships with the package (pyproject.toml's package data; docker/Dockerfile copies
# validator/ whole): without it the kit does not import.
STUB = Path(__file__).with_suffix(".pyi")


def table(stub: Path = STUB) -> dict[str, tuple[str, str | None]]:
    """Each name of the stub -> (the module it is imported from, its attribute there; None for
    a module itself: `from . import hub`)."""
    names: dict[str, tuple[str, str | None]] = {}
    for node in ast.parse(stub.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.ImportFrom):
            continue
        where = importlib.util.resolve_name("." * node.level + (node.module or ""), __name__)
        for alias in node.names:
            name = alias.asname or alias.name
            names[name] = (where, alias.name) if node.module else (f"{where}.{name}", None)
    return names


_TABLE = table()
__all__ = sorted(_TABLE)


def __getattr__(name: str) -> object:
    if name not in _TABLE:
        return moved_name(__name__, name)  # an earlier name, with a warning; else AttributeError
    module, attribute = _TABLE[name]
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value  # read once: the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return list(__all__)
