"""The submission's metadata files, read only in the bounded child (inspect_child.py, through
`validator.kit.inspect_in_child`), never in the validator's process: what comes back is plain
checked data (docs/llm-judge-scoring.md, "The submission").

- `inspect_model`: a full model's config.json (never remote code; the parameter count of the
  causal LM it describes, built on the meta device), the values of its
  generation_config.json the module bounds, and the shard names of its safetensors index,
  checked against the repo's listing (how many, each one listed) before any is downloaded;
- `inspect_adapter`: an adapter's base, `r` and `rank_pattern`, and its weights' header;
- `inspect_headers`: the safetensors headers of the downloaded weights (names, dtypes, shapes
  and offsets checked; parameters summed), before transformers or peft loads them here.

A file the child cannot read within the kit's limits (SUBMISSION_LIMITS) is the submission's
doing: SubmissionRejected, -999. transformers and peft read config.json, generation_config.json,
the index and adapter_config.json again in this process when they load the weights; the child
refuses those whose reading took more than MAX_REREAD_BYTES, so that the re-read is cheap.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from validator.kit import LoraTensor, SubmissionRejected, inspect_in_child

CHILD = Path(__file__).with_name("inspect_child.py")
# What reading config.json, generation_config.json and the index (or adapter_config.json) may
# take in Python allocations: a real model's take well under 1 MB (a 100k-tensor index: tens of
# MB of text would be far beyond any released model). transformers and peft build the same
# objects again in the validator's process: a 147-byte gpt_neo config that expands into a list
# of 5*10^7 layers took 5.2 GB there.
MAX_REREAD_BYTES = 64 * 1024**2
# The config may describe this many times the parameters the headers hold, no more: weights
# that the config needs and the files lack would be filled with random values (loading.py
# refuses that), so a config far beyond its weights cannot load.
MAX_CONFIG_TO_HEADERS = 2.0


class ModelFacts(BaseModel):
    parameter_count: int
    # Elements of the model's buffers, built with it in this process but counted by no one
    # else: a config can size them far beyond its parameters (submission.py bounds them).
    buffer_count: int = 0
    shards: list[str] | None  # the index's weight files; None: no index
    num_beams: int | None
    sequence_rules: int  # banned or biased token sequences


class FileHeader(BaseModel):
    tensors: int
    parameters: int
    dtypes: list[str]


class NamedHeader(FileHeader):
    file: str


class AdapterHeader(FileHeader):
    listing: list[LoraTensor]  # each tensor, for the kit's check against the base


class AdapterFacts(BaseModel):
    # As written (None: absent, peft's LORA); peft builds whatever type it names when it
    # re-reads the config in this process, and only a LoRA's sizes are checked (adapter_bounds).
    peft_type: str | None = None
    replicated_layers: int | None = 0  # peft's layer_replication, counted
    base_model: str | None
    base_text: str  # for the message when it is not a supported base
    has_r: bool
    r: Any  # JSON scalar as written; check_lora_against_base says whether it is a rank
    rank_pattern: dict[str, Any]
    weights: AdapterHeader

    def ranks(self) -> dict[str, Any]:
        """In the form `validator.kit.ranks_of` takes."""
        config: dict[str, Any] = {"rank_pattern": self.rank_pattern}
        if self.has_r:
            config["r"] = self.r
        return config


class Headers(BaseModel):
    files: list[NamedHeader]

    @property
    def parameters(self) -> int:
        return sum(f.parameters for f in self.files)


def inspect_model(
    folder: Path, work: Path, *, listed: Collection[str] = (), max_shards: int = 0
) -> ModelFacts:
    """`listed`: the repo's file names (the Hub's listing, checked: validator.kit.listing);
    the index may name at most `max_shards` shard files, each of them listed (the defaults:
    a model without an index)."""
    request = {"folder": str(folder), "listed": list(listed), "max_shards": max_shards}
    return inspect_in_child(
        CHILD,
        {"phase": "model", **request, "max_reread_bytes": MAX_REREAD_BYTES},
        work=work,
        what="config.json",
        answer=ModelFacts,
        preload=("torch", "transformers"),
    )


def inspect_adapter(folder: Path, weights: str, work: Path) -> AdapterFacts:
    request = {"folder": str(folder), "weights": weights, "max_reread_bytes": MAX_REREAD_BYTES}
    return inspect_in_child(
        CHILD,
        {"phase": "adapter", **request},
        work=work,
        what="adapter_config.json",
        answer=AdapterFacts,
    )


def inspect_headers(folder: Path, files: list[str], work: Path) -> Headers:
    return inspect_in_child(
        CHILD,
        {"phase": "headers", "folder": str(folder), "files": files},
        work=work,
        what="the safetensors headers",
        answer=Headers,
    )


def check_against_headers(config_count: int, header_count: int) -> None:
    """SubmissionRejected when the config describes far more parameters than the weights hold:
    the weights are missing, and the model cannot load (-999 as the network scores it)."""
    if config_count > MAX_CONFIG_TO_HEADERS * header_count:
        raise SubmissionRejected(
            f"config.json describes {config_count} parameters, the safetensors headers hold "
            f"{header_count}: the weights are missing"
        )
