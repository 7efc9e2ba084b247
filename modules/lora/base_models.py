"""How lora reads a base model: the causal LM (in the scoring dtype, quantized where the operator
asks) and its tokenizer. It is kept warm across assignments by the kit's `WarmBase`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from modules.lora.dataset import load_tokenizer
from validator.kit import moved_name, reading_base

log = logging.getLogger(__name__)


def quantization_config(quantization: str, dtype: torch.dtype) -> BitsAndBytesConfig | None:
    """bitsandbytes loading for small GPUs; scores then differ from other validators'."""
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    if quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
        )
    return None


def gpu_type(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"


def read_base(
    repo_id: str,
    *,
    fetch: Callable[[str], Path],
    device: str,
    dtype: torch.dtype,
    quantization: str = "none",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base `repo_id` from disk (`fetch` gives its folder): its model and its tokenizer.
    The base is the operator's: what stops reading it is a host fault (the kit's
    `reading_base`: OperatorError), never the submission's."""
    path = fetch(repo_id)
    with reading_base(repo_id):
        return _read(path, repo_id, device, dtype, quantization)


def _read(
    path: Path, repo_id: str, device: str, dtype: torch.dtype, quantization: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    log.info("loading base model %s (%s on %s)", repo_id, dtype, device)
    quantized = quantization_config(quantization, dtype)
    placement = {"quantization_config": quantized, "device_map": {"": device}}
    model = AutoModelForCausalLM.from_pretrained(
        path,
        torch_dtype=dtype,
        trust_remote_code=False,
        use_safetensors=True,
        use_cache=False,
        **(placement if quantized else {}),
    )
    if not quantized:  # a bitsandbytes model is placed by device_map and cannot be moved
        model.to(device)
    model.eval()
    return model, load_tokenizer(path, repo_id)


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # pick_device, the kit's; the names WarmBase replaced
