"""The bpc of the module's default regime against the reference's own Trainer path.

Same model, same examples: ours batches them and runs the forward in the regime
modules/lora/precision.py picks; the reference runs `Trainer.evaluate()` at batch size 1 with
the network's config (`fp16: true` on a GPU). bpc is eval_loss times a constant of the data,
so their relative difference is the eval losses'. In fp16 the bf16 option is scored too, to
show how far an operator who turns fp16 off lands from the network.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from bench.lora_baseline import trainer_eval_loss
from modules.lora.forward import example_losses
from modules.lora.metrics import eval_loss
from modules.lora.packing import use_packing
from modules.lora.precision import pick_precision
from modules.lora.records import EncodedExample
from modules.lora.schemas import PackingMode

# Our fp16 default against the reference's fp16 Trainer path, packed rows or not: within 1e-3
# relative.
TARGET_FP16_REL_DIFF = 1e-3


@dataclass(frozen=True)
class Agreement:
    examples: int
    mixed_precision: str  # the Trainer's: "fp16" or "no"
    ours: float  # the module's default path (packed rows on CUDA, padded batches on a CPU)
    reference: float
    bf16_option: float | None  # ours with fp16 turned off, when the weights were fp16
    ours_path: str = "padded"
    other: float | None = None  # ours in the other path, same regime
    other_path: str | None = None

    @staticmethod
    def rel(value: float, reference: float) -> float:
        return abs(value - reference) / abs(reference)


def autocast_for(model: PreTrainedModel) -> torch.dtype | None:
    """The module's forward autocast for a model loaded in this dtype on this device."""
    return pick_precision(model.device.type, fp16=model.dtype == torch.float16).autocast


def forward_regime(model: PreTrainedModel) -> contextlib.AbstractContextManager:
    autocast = autocast_for(model)
    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(model.device.type, dtype=autocast)


def measure_agreement(
    model: PreTrainedModel, examples: list[EncodedExample], max_batch_size: int
) -> Agreement:
    """Ours (default regime) and the reference's Trainer on `examples`; then, for fp16 weights,
    ours again in bf16 (the model is left in bf16: call this last)."""
    autocast = autocast_for(model)
    mixed = "fp16" if autocast == torch.float16 else "no"
    packed = use_packing("auto", model.device.type)
    other_mode: PackingMode = "off" if packed else "on"
    ours = _ours(model, examples, max_batch_size, autocast)
    other = _ours(model, examples, max_batch_size, autocast, other_mode)
    with tempfile.TemporaryDirectory(prefix="lora-trainer-") as work:
        reference = trainer_eval_loss(model, examples, 0, Path(work), mixed)
    bf16 = None
    if model.dtype == torch.float16:
        model.to(torch.bfloat16)
        bf16 = _ours(model, examples, max_batch_size, autocast_for(model))
    paths = ("packed", "padded") if packed else ("padded", "packed")
    return Agreement(len(examples), mixed, ours, reference, bf16, paths[0], other, paths[1])


def print_agreement(result: Agreement) -> None:
    diff = Agreement.rel(result.ours, result.reference)
    verdict = ""
    if result.mixed_precision == "fp16":
        ok = diff <= TARGET_FP16_REL_DIFF
        verdict = f" (target <= {TARGET_FP16_REL_DIFF:g}: {'PASS' if ok else 'FAIL'})"
    print(
        f"  bpc agreement on {result.examples} examples, ours (default regime, "
        f"{result.ours_path}) vs the "
        f"reference's Trainer.evaluate (mixed precision {result.mixed_precision}, batch 1): "
        f"eval_loss {result.ours:.6f} vs {result.reference:.6f}, rel diff {diff:.1e}{verdict}"
    )
    if result.other is not None:
        print(
            f"  ours {result.other_path} (same regime) vs the same: eval_loss "
            f"{result.other:.6f}, rel diff {Agreement.rel(result.other, result.reference):.1e}; "
            f"{result.ours_path} vs {result.other_path} "
            f"{Agreement.rel(result.ours, result.other):.1e}"
        )
    if result.bf16_option is not None:
        print(
            f"  bf16 option (fp16: false) vs the reference's fp16 path: eval_loss "
            f"{result.bf16_option:.6f}, rel diff "
            f"{Agreement.rel(result.bf16_option, result.reference):.1e}"
        )


def _ours(
    model: PreTrainedModel,
    examples: list[EncodedExample],
    max_batch_size: int,
    autocast: torch.dtype | None,
    packing: PackingMode = "auto",
) -> float:
    losses = example_losses(
        model,
        examples,
        max_batch_size=max_batch_size,
        pad_token_id=0,
        autocast=autocast,
        packing=packing,
    )
    return eval_loss(losses)
