"""Moved: the warm base is the kit's, shared with lora (`validator.kit.WarmBase`,
validator/kit/warm_base.py). This name keeps importing, with a warning."""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("WarmBase", "HeldBase"):
        import validator.kit

        warnings.warn(
            f"modules.llm_judge.warm_base.{name} has moved to validator.kit.{name} (its "
            "merge(adapter_dir) is apply(attach), its held base's source is key)",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(validator.kit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
