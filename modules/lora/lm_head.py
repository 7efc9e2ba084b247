"""What follows the decoder: the lm_head on scored rows only, the architecture's post-head
transform, and the float64 per-example sums.

Post-lm_head transforms: the HF `*ForCausalLM.forward` of some architectures changes the logits
after the lm_head (transformers 4.49). We replicate exactly those listed in
`_POST_HEAD_TRANSFORMS`, in the model's dtype (as the reference does, before the loss upcasts to
fp32), and refuse any other architecture rather than score it silently wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Upper bound on full-vocab logit elements alive at once (rows x vocab). On a GPU 2**27 fp32
# (512 MiB) is small next to a 16k-token batch's activations and keeps GEMMs efficient; on a CPU
# buffers that large cost page faults, and 2**22 measured faster (bench/RESULTS.md).
LOGIT_ELEMENTS_PER_CHUNK = {"cuda": 1 << 27, "cpu": 1 << 22}

Transform = Callable[[torch.Tensor, "PreTrainedModel"], torch.Tensor]


def _identity(logits: torch.Tensor, lm: PreTrainedModel) -> torch.Tensor:
    return logits


def _gemma2_softcap(logits: torch.Tensor, lm: PreTrainedModel) -> torch.Tensor:
    cap = lm.config.final_logit_softcapping
    if cap is None:
        return logits
    # Same three ops in the same order as Gemma2ForCausalLM.forward, so rounding matches.
    return torch.tanh(logits / cap) * cap


def _cohere_scale(logits: torch.Tensor, lm: PreTrainedModel) -> torch.Tensor:
    return logits * lm.logit_scale


def _granite_scale(logits: torch.Tensor, lm: PreTrainedModel) -> torch.Tensor:
    return logits / lm.config.logits_scaling


# model_type -> what its ForCausalLM.forward applies after the lm_head (checked against
# transformers 4.49). MoE types are left out on purpose: the reference turns on
# output_router_logits, which adds the router aux loss to its eval loss.
_POST_HEAD_TRANSFORMS: dict[str, Transform] = {
    "llama": _identity,
    "mistral": _identity,
    "qwen2": _identity,
    "phi3": _identity,
    "gemma": _identity,
    "gemma2": _gemma2_softcap,
    "cohere": _cohere_scale,
    "cohere2": _cohere_scale,
    "granite": _granite_scale,
}


class UnsupportedArchitecture(ValueError):
    """The model's logits cannot be reproduced by the target-rows-only path."""


def post_head_transform(lm: PreTrainedModel) -> Transform:
    model_type = getattr(getattr(lm, "config", None), "model_type", None)
    transform = _POST_HEAD_TRANSFORMS.get(model_type) if isinstance(model_type, str) else None
    if transform is None:
        raise UnsupportedArchitecture(
            f"model_type {model_type!r}: what its forward applies after the lm_head is not "
            f"replicated; supported: {', '.join(sorted(_POST_HEAD_TRANSFORMS))}"
        )
    return transform


def head_sums(
    lm: PreTrainedModel,
    head: nn.Module,
    transform: Transform,
    rows: torch.Tensor,
    labels: torch.Tensor,
    owners: torch.Tensor,
    count: int,
) -> list[float]:
    """Summed CE per owner (0 .. count-1) over hidden `rows` and their `labels`, float64: the
    lm_head and the post-head transform run on these rows only, a chunk at a time."""
    device = rows.device
    sums = torch.zeros(count, dtype=torch.float64, device=device)
    per_device = LOGIT_ELEMENTS_PER_CHUNK
    elements = per_device[device.type] if device.type in per_device else per_device["cuda"]
    chunk = max(1, elements // _vocab_size(lm, head))
    for begin in range(0, rows.shape[0], chunk):
        end = begin + chunk
        logits = transform(head(rows[begin:end]), lm).float()
        losses = F.cross_entropy(logits, labels[begin:end], reduction="none")
        sums.index_add_(0, owners[begin:end], losses.double())
    return sums.cpu().tolist()


def _vocab_size(lm: PreTrainedModel, head: Any) -> int:
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    return int(lm.config.vocab_size)
