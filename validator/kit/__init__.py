"""The one import for module authors (docs/module-api.md): everything a module needs from the
validator, and nothing of the loop.

    from validator.kit import BaseValidationModule, SubmissionRejected, current_scope

The names are listed once, in the stub beside this file (`__init__.pyi`, grouped by what they
are for): type checkers read it, and `lazy_loader.attach_stub` makes this module's
`__getattr__`, `__dir__` and `__all__` from the same imports. Names are loaded on first use, so
a module that needs no torch (rl) does not import it through `check_lora_against_base` or the
warm-base helpers. What is not listed in `__all__` is the validator's own and may move.
"""

import lazy_loader

from validator._moved import renamed

# Raises at import when the stub is missing: it ships with the package (pyproject.toml's
# package data; docker/Dockerfile copies validator/ whole). lazy_loader's debugging switch,
# EAGER_IMPORT=1 in the environment, imports every name here at once, torch included.
_stub_getattr, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)


def __getattr__(name: str) -> object:
    # An earlier name (validator/_moved.py) gives the name now's object, with a warning.
    return _stub_getattr(renamed(__name__, name) or name)
