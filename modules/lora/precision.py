"""The arithmetic an assignment is scored in: the weights' dtype and the forward's autocast.

Validators are paid for agreeing, so on a GPU the default is the network's: the reference
(FLock-io/llm-loss-validator, transformers 4.49, accelerate 1.4) runs with `fp16: true`, which
means two things:
- `load_model` loads the base (and merges the adapter) in float16;
- `Trainer.evaluate` hands the model to `Accelerator.prepare_model(model, evaluation_mode=True)`,
  which, with `mixed_precision="fp16"`, wraps `model.forward` in
  `torch.autocast(device_type="cuda", dtype=torch.float16)` and converts its outputs to fp32
  (`accelerate.utils.get_mixed_precision_context_manager`, `convert_outputs_to_fp32`).
Under autocast the ops on torch's fp32 list (softmax, log_softmax, pow, rsqrt, sum, exp, ...)
run in fp32 even on fp16 inputs, so weights in fp16 alone do not reproduce the reference.

With `fp16: false` the reference loads bfloat16 and evaluates without mixed precision; we do the
same, but the network does not run that way, so those scores do not match other validators'.
On a CPU the reference loads fp32 (its CPU config sets `use_cpu`) and no autocast applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    weights: torch.dtype
    # The dtype the forward is autocast to, None for none.
    autocast: torch.dtype | None
    matches_network: bool

    def describe(self) -> str:
        mixed = f", forward autocast to {_short(self.autocast)}" if self.autocast else ""
        agreement = "" if self.matches_network else " (does NOT match the network's fp16 scores)"
        return f"{_short(self.weights)} weights{mixed}{agreement}"


def pick_precision(device: str, fp16: bool) -> Precision:
    """The reference's regime for `device` and the config's `fp16` (docs/lora-scoring.md,
    "Model and precision")."""
    if device == "cpu":
        return Precision(torch.float32, None, matches_network=True)
    if fp16:
        return Precision(torch.float16, torch.float16, matches_network=True)
    return Precision(torch.bfloat16, None, matches_network=False)


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
