"""Reading a submitted adapter's files across the trust boundary (docs/lora-scoring.md, "Reading
the adapter"): adapter_config.json and the safetensors header are parsed only in a bounded child
(modules/lora/adapter_reader.py, through the kit's `inspect_in_child`, one per submission); the
validator's process gets back plain values, checked here by their model, and reads the weights
later only through peft, after `check_lora_against_base` has checked every tensor's name, dtype
and shape and their total size against the base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from modules.lora.adapters import KNOWN_KEYS, AdapterRejected
from validator.kit import LoraTensor, SubmissionRejected, inspect_in_child

READER = Path(__file__).with_name("adapter_reader.py")


class AdapterFiles(BaseModel):
    """What the child read: the config's peft keys, the empty unknown keys it dropped (quoted,
    for the log), and the safetensors header's tensors and data size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: dict[str, Any]
    dropped_keys: tuple[str, ...]
    tensors: tuple[LoraTensor, ...]
    data_bytes: int = Field(ge=0)


def read_adapter(folder: Path, work: Path, what: str) -> AdapterFiles:
    """The adapter in `folder`, read in the bounded child; SubmissionRejected naming `what`
    when its files are at fault or their reading meets the child's limits."""
    try:
        return inspect_in_child(
            READER,
            {"folder": str(folder), "known_keys": sorted(KNOWN_KEYS)},
            work=work,
            what=what,
            answer=AdapterFiles,
        )
    except AdapterRejected:
        raise
    except SubmissionRejected as exc:  # the module's own refusal: failed at once, as before
        raise AdapterRejected(str(exc)) from exc
