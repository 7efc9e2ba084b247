"""Loading the submitted model for generation: a LoRA adapter merged into its supported base as
the reference merges it, or a full model of an architecture transformers implements. Nothing
is ever loaded with remote code or from pickle weights."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from modules.llm_judge.submission import Submission
from validator.kit import (
    ConfigError,
    OperatorError,
    WarmBase,
    check_adapter_patterns,
    check_lora_against_base,
    fetch_base_model,
    moved_name,
    ranks_of,
    reading_base,
)
from validator.kit import pick_device as kit_pick_device  # `pick_device` here is an alias

log = logging.getLogger(__name__)


class ModelCannotLoad(Exception):
    """The submission's model does not load: upstream submits score -999 for it."""


@dataclass
class LoadedModel:
    model: Any
    # The folder whose tokenizer and chat template apply: the submission's for a full model, the
    # base's for a LoRA. Never loaded in this process (templating.py runs them in a child).
    tokenizer_dir: Path
    parameter_count: int


# The operator's override of the linear-attention kernels (`auto`, the default, or `torch`).
LINEAR_ATTENTION_ENV = "LLM_JUDGE_LINEAR_ATTENTION"
# transformers' modeling files that bind flash-linear-attention's kernels when they are imported.
_FLA_MODELING = ("qwen3_5", "qwen3_5_moe", "qwen3_next")
# The names those modeling files read the kernels by, and what each reads as when there is none.
_FLA_NAMES_OFF = (
    ("chunk_gated_delta_rule", None),
    ("fused_recurrent_gated_delta_rule", None),
    ("FusedRMSNormGated", None),
    ("is_fast_path_available", False),
)


def device_and_dtype() -> tuple[str, torch.dtype]:
    """The device (the kit's `pick_device`) and dtype models run in; first decides the
    linear-attention kernels, so that a bad LLM_JUDGE_LINEAR_ATTENTION stops the module at
    start-up rather than fail a submission."""
    linear_attention_kernels()
    device = kit_pick_device()
    return device, torch.bfloat16 if device == "cuda" else torch.float32


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # pick_device: device_and_dtype


@cache
def linear_attention_kernels() -> str:
    """`fla` or `torch`: what Qwen3.5's linear-attention (gated delta net) layers run.

    transformers binds flash-linear-attention's Triton kernels by itself, when its modeling file
    is imported, if CUDA is available and `fla` (fla-core) is installed; otherwise its torch
    fallback, many times slower on a GPU. It never imports them on a CPU (Triton needs a GPU), so
    a CPU host runs the fallback whatever is installed. Decided here before transformers imports
    a model class: on a GPU, kernels that do not import (no Triton, a broken install) would make
    every Qwen3.5 model fail to load, and so score -999; they are switched off with a warning
    instead. `LLM_JUDGE_LINEAR_ATTENTION=torch` switches them off on a card they misbehave on."""
    choice = os.environ.get(LINEAR_ATTENTION_ENV, "").strip().lower() or "auto"
    if choice not in ("auto", "torch"):
        raise ConfigError(f"{LINEAR_ATTENTION_ENV}={choice!r}: expected 'auto' or 'torch'")
    if not torch.cuda.is_available():
        return "torch"
    if choice == "torch":
        log.info(
            "%s=torch: linear attention runs transformers' torch fallback", LINEAR_ATTENTION_ENV
        )
        _switch_off_fla()
        return "torch"
    try:
        import fla.modules  # noqa: F401  (what transformers' modeling files import)
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception as exc:  # ImportError, or whatever a broken Triton raises at import
        log.warning(
            "flash-linear-attention does not import (%s: %s): Qwen3.5's linear attention runs "
            "transformers' torch fallback, several times slower",
            type(exc).__name__,
            str(exc)[:200],
        )
        _switch_off_fla()
        return "torch"
    from transformers.utils import import_utils

    if not import_utils.is_flash_linear_attention_available():  # too old for transformers
        log.warning("the installed fla is older than transformers needs: torch fallback")
        return "torch"
    log.info("Qwen3.5's linear attention runs flash-linear-attention's kernels")
    return "fla"


def _switch_off_fla() -> None:
    """transformers' check answers False from now on; a modeling file imported already has its
    kernel names cleared, which its layers read when they are built."""
    from transformers.utils import import_utils

    # A library's function replaced, its cache and all: its annotation is of the cached one.
    import_utils.is_flash_linear_attention_available = lambda: False  # type: ignore[assignment]
    for name in _FLA_MODELING:
        modeling = sys.modules.get(f"transformers.models.{name}.modeling_{name}")
        if modeling is None:
            continue
        for kernel, off in _FLA_NAMES_OFF:
            setattr(modeling, kernel, off)


def load(
    submission: Submission,
    warm: WarmBase | None = None,
    user: str = "the submission",
    device: str | None = None,
) -> LoadedModel:
    """The merged or full model, on `device` (the GPU when there is one), ready to generate.

    With `warm`, a LoRA is merged into the warm base (the kit's `WarmBase`, whose read puts it on
    `device`) instead of a fresh load; the caller then calls `warm.release(user)` after
    generating, and this function calls it itself when it raises. A full model is never kept.
    `device` is a parameter so that a GPU host's path runs on a CPU in the tests."""
    default_device, dtype = device_and_dtype()
    device = device or default_device
    if submission.base_model is not None:
        # The base is the operator's (a supported, trusted repo): its download problems are
        # the operator's, not the submission's, and are raised as they are.
        source = fetch_base_model(submission.base_model)
    else:
        source = submission.path
    if warm is not None and submission.base_model is None:
        warm.drop()  # a full model: nothing is kept beside it
        warm = None
    try:
        # A LoRA's base is the operator's: what stops reading it (its files in the HF cache
        # unreadable, say) is a host fault (OperatorError: the assignment is kept), never -999.
        reading = reading_base(submission.base_model) if submission.base_model else nullcontext()
        with reading:
            model = warm.get(source).model if warm is not None else read_model(source, dtype)
        if submission.base_model is not None:
            # Before peft allocates a layer: a hostile rank would make it allocate gigabytes.
            # The ranks and tensors are the child's reading of the adapter's files (inspection.py).
            if submission.adapter_tensors is None:
                raise RuntimeError("an adapter submission without the child's reading of it")
            check_lora_against_base(
                ranks_of(submission.adapter_ranks or {}),
                model,
                submission.base_model,
                submission.adapter_tensors,
                ModelCannotLoad,
            )
            # peft runs the config's module patterns against the base's names in this process.
            check_adapter_patterns(
                submission.path / "adapter_config.json", model, submission.path.parent / "patterns"
            )
            if warm is not None:  # peft's plain load of the adapter, merged, as the network's
                model = warm.apply(
                    partial(PeftModel.from_pretrained, model_id=str(submission.path))
                )
            else:
                model = PeftModel.from_pretrained(model, str(submission.path)).merge_and_unload()
    except Exception as exc:
        if warm is not None:  # whatever peft left in the base must not reach the next one
            warm.release(user)
        if isinstance(exc, (torch.OutOfMemoryError, ModelCannotLoad, OperatorError)):
            raise  # out of memory, or the base unreadable: the host's, not the submission's
        # whatever else stops loading scores -999, as upstream
        raise ModelCannotLoad(f"{type(exc).__name__}: {str(exc)[:500]}") from exc
    model = model.to(device).eval()
    return LoadedModel(model, source, sum(p.numel() for p in model.parameters()))


def read_model(source: Path, dtype: torch.dtype, device: str = "cpu") -> Any:
    """The model of a folder of safetensors weights, in `dtype`, on `device`; its tokenizer is
    not loaded here (a full model's is the submission's code-like input: templating.py)."""
    # output_loading_info: (model, info), which the library's annotation of the result omits.
    loaded: tuple[Any, dict[str, Any]] = AutoModelForCausalLM.from_pretrained(  # type: ignore[assignment]
        str(source),
        dtype=dtype,
        use_safetensors=True,
        trust_remote_code=False,
        output_loading_info=True,
    )
    model, info = loaded
    # transformers fills weights a checkpoint lacks with random values; such a model would
    # score differently on every validator.
    if info.get("missing_keys"):
        missing = sorted(info["missing_keys"])
        raise ModelCannotLoad(f"the weights lack {len(missing)} tensors, e.g. {missing[:3]}")
    return model.to(device).eval()
