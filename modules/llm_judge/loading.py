"""Loading the submitted model for generation: a LoRA adapter merged into its supported base as
the reference merges it, or a full model of an architecture transformers implements. Nothing
is ever loaded with remote code or from pickle weights."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from modules.llm_judge.submission import Submission
from modules.llm_judge.warm_base import WarmBase
from validator.kit import check_lora_against_base, fetch_base_model, ranks_of

log = logging.getLogger(__name__)


class ModelCannotLoad(Exception):
    """The submission's model does not load: upstream submits score -999 for it."""


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    parameter_count: int


def pick_device() -> tuple[str, torch.dtype]:
    if torch.cuda.is_available():
        return "cuda", torch.bfloat16
    return "cpu", torch.float32


def load(
    submission: Submission, warm: WarmBase | None = None, user: str = "the submission"
) -> LoadedModel:
    """The merged or full model, on the GPU when there is one, ready to generate.

    With `warm`, on a CPU, a LoRA is merged into the warm base (warm_base.py) instead of a fresh
    load: the same weights, bit for bit. The caller then calls `warm.release(user)` after
    generating; this function calls it itself when it raises. On a GPU the base is read for every
    assignment, as the network reads it, and merged on the CPU before it moves to the GPU."""
    device, dtype = pick_device()
    if submission.base_model is not None:
        # The base is the operator's (a supported, trusted repo): its download problems are
        # the operator's, not the submission's, and are raised as they are.
        source = fetch_base_model(submission.base_model)
    else:
        source = submission.path
    if warm is not None and (submission.base_model is None or device != "cpu"):
        warm.drop()  # a full model, or a GPU host: nothing is kept beside it
        warm = None
    try:
        if warm is not None:
            held = warm.get(source)
            model, tokenizer = held.model, held.tokenizer
        else:
            model, tokenizer = read_model(source, dtype)
        if submission.base_model is not None:
            # Before peft allocates a layer: a hostile rank would make it allocate gigabytes.
            config = json.loads((submission.path / "adapter_config.json").read_text())
            check_lora_against_base(
                ranks_of(config),
                model,
                submission.base_model,
                submission.path / "adapter_model.safetensors",
                ModelCannotLoad,
            )
            if warm is not None:
                model = warm.merge(submission.path)
            else:
                model = PeftModel.from_pretrained(model, str(submission.path)).merge_and_unload()
    except Exception as exc:
        if warm is not None:  # whatever peft left in the base must not reach the next one
            warm.release(user)
        if isinstance(exc, (torch.OutOfMemoryError, ModelCannotLoad)):
            raise  # out of memory: the host's limit, not the submission's fault
        # whatever else stops loading scores -999, as upstream
        raise ModelCannotLoad(f"{type(exc).__name__}: {str(exc)[:500]}") from exc
    model = model.to(device).eval()
    return LoadedModel(model, tokenizer, sum(p.numel() for p in model.parameters()))


def read_model(source: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """A model and its tokenizer from a folder of safetensors weights, in `dtype`."""
    model, info = AutoModelForCausalLM.from_pretrained(
        str(source),
        dtype=dtype,
        use_safetensors=True,
        trust_remote_code=False,
        output_loading_info=True,
    )
    # transformers fills weights a checkpoint lacks with random values; such a model would
    # score differently on every validator.
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise ModelCannotLoad(f"the weights lack {len(missing)} tensors, e.g. {missing[:3]}")
    tokenizer = AutoTokenizer.from_pretrained(str(source), trust_remote_code=False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer
