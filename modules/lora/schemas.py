"""The lora module's config, input and metrics schemas.

`LoraConfig` is where every operator setting's default lives: `configs/lora.json` holds only
what an operator chooses (at least `supported_base_models`), so a default is written once.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from validator.kit import BaseConfig, BaseInputData, BaseMetrics

GIB = 1024**3
# Conversations packed back to back in one row (modules/lora/packing.py): see `packing` below.
PackingMode = Literal["auto", "on", "off"]
DEFAULT_TOKEN_BUDGET = 16384  # also the batched forward's default when called directly


class LoraConfig(BaseConfig):
    # Required, so that the list an operator validates against is the one in configs/lora.json.
    supported_base_models: list[str] = Field(min_length=1)
    lora_only: bool = True
    # On GPU: the network's fp16 weights and fp16 autocast when true, bf16 (not matching the
    # network) when false; always fp32 on CPU (modules/lora/precision.py).
    fp16: bool = True
    # bitsandbytes loading for small GPUs: the scores then differ from other validators'.
    quantization: Literal["none", "8bit", "4bit"] = "none"
    merge_adapter: bool = True  # the reference merges; false (forced when quantized) does not
    # Tokens per forward: a packed row's conversation tokens, or a padded batch's rows x longest.
    token_budget: int = Field(DEFAULT_TOKEN_BUDGET, gt=0)
    # Conversations packed back to back in one row, each attending only to itself
    # (modules/lora/packing.py); auto: on with CUDA, off on a CPU, where one conversation per
    # forward stays fastest. off: length-sorted padded batches.
    packing: PackingMode = "auto"
    # Conversations per padded batch; unset: 64 on GPU, 1 on CPU, where padded batches need an
    # explicit attention mask that takes CPU attention off its fast causal kernel. Packed rows
    # are bounded by token_budget alone.
    max_batch_size: int | None = Field(None, gt=0)
    max_adapter_file_bytes: int = Field(2 * GIB, gt=0)
    max_adapter_total_bytes: int = Field(4 * GIB, gt=0)
    max_validation_set_bytes: int = Field(1 * GIB, gt=0)
    cached_base_models: int = Field(1, gt=0)
    work_dir: str | None = None  # where submissions are downloaded; the system temp dir if unset


class LoraInput(BaseInputData):
    submitter_fields = frozenset({"hg_repo_id", "revision"})
    url_fields = frozenset({"validation_set_url"})

    hg_repo_id: str
    revision: str = "main"
    base_model: str  # a chat-template key, e.g. qwen1.5
    validation_set_url: str
    context_length: int = Field(gt=0)
    max_params: int = Field(gt=0)


class LoraMetrics(BaseMetrics):
    loss: float
    bpc: float
    bppl: float
    nll_token_nats_total: float
    nll_token_bits_total: float
    eval_loss: float
    gpu_type: str
