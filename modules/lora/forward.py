"""The batched forward: each example's mean next-token cross-entropy over its targets.

Contract (docs/lora-scoring.md, "Loss"): the reference runs HF `Trainer.evaluate` at batch size
1, so each example contributes the mean next-token cross-entropy over its own target positions
(`metrics.eval_loss` then takes the plain mean). We batch for speed, so nothing here may depend
on how examples are grouped: each example's sum is accumulated on its own and only divided by
its own target count.

Speed: the reference materialises full-vocabulary logits for every position. We run the base
transformer once per batch, keep only the hidden states whose next token is a target, and apply
the lm_head to those rows, in chunks, so full-vocab logits exist only for scored rows.

Post-lm_head transforms: the HF `*ForCausalLM.forward` of some architectures changes the logits
after the lm_head (transformers 4.49). We replicate exactly those listed in
`_POST_HEAD_TRANSFORMS`, in the model's dtype (as the reference does, before the loss upcasts to
fp32), and refuse any other architecture rather than score it silently wrong.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from modules.lora.records import EncodedExample
from modules.lora.schemas import DEFAULT_TOKEN_BUDGET
from validator.kit import Progress

log = logging.getLogger(__name__)

# Upper bound on full-vocab logit elements alive at once (rows x vocab). On a GPU 2**27 fp32
# (512 MiB) is small next to a 16k-token batch's activations and keeps GEMMs efficient; on a CPU
# buffers that large cost page faults, and 2**22 measured faster (bench/RESULTS.md).
_LOGIT_ELEMENTS_PER_CHUNK = {"cuda": 1 << 27, "cpu": 1 << 22}

# Conversations per forward on a GPU when the config leaves max_batch_size unset.
GPU_MAX_BATCH_SIZE = 64

_Transform = Callable[[torch.Tensor, nn.Module], torch.Tensor]


def _identity(logits: torch.Tensor, lm: nn.Module) -> torch.Tensor:
    return logits


def _gemma2_softcap(logits: torch.Tensor, lm: nn.Module) -> torch.Tensor:
    cap = lm.config.final_logit_softcapping
    if cap is None:
        return logits
    # Same three ops in the same order as Gemma2ForCausalLM.forward, so rounding matches.
    return torch.tanh(logits / cap) * cap


def _cohere_scale(logits: torch.Tensor, lm: nn.Module) -> torch.Tensor:
    return logits * lm.logit_scale


def _granite_scale(logits: torch.Tensor, lm: nn.Module) -> torch.Tensor:
    return logits / lm.config.logits_scaling


# model_type -> what its ForCausalLM.forward applies after the lm_head (checked against
# transformers 4.49). MoE types are left out on purpose: the reference turns on
# output_router_logits, which adds the router aux loss to its eval loss.
_POST_HEAD_TRANSFORMS: dict[str, _Transform] = {
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


def default_max_batch_size(device_type: str) -> int:
    """Conversations per forward when the config leaves it unset. On a CPU one at a time is
    fastest: a padded batch needs an explicit attention mask, which takes attention off its
    fused causal kernel (measured 2x slower, bench/RESULTS.md)."""
    return 1 if device_type == "cpu" else GPU_MAX_BATCH_SIZE


class UnsupportedArchitecture(ValueError):
    """The model's logits cannot be reproduced by the target-rows-only path."""


def example_losses(
    model: nn.Module,
    examples: list[EncodedExample],
    *,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    max_batch_size: int = GPU_MAX_BATCH_SIZE,
    pad_token_id: int = 0,
    autocast: torch.dtype | None = None,
) -> list[float]:
    """Mean next-token cross-entropy of each example over its targets, in input order.

    An example with no target after the shift (only position 0, or none) gets NaN, as the
    reference's per-example mean does. `model` is an HF causal LM or a peft LoRA wrapper of one.
    `autocast`: the dtype the forward and the loss run autocast to, as the reference's Trainer
    runs them under fp16 mixed precision (modules/lora/precision.py); None for none.
    """
    if token_budget < 1 or max_batch_size < 1:
        raise ValueError("token_budget and max_batch_size must be at least 1")
    for example in examples:
        if len(example.input_ids) != len(example.target_mask):
            raise ValueError("input_ids and target_mask differ in length")
    lm = _causal_lm(model)
    transform = _post_head_transform(lm)
    # The reference Trainer evaluates in eval mode; LoRA dropout must be off.
    model.eval()
    losses = [math.nan] * len(examples)
    scored, repeats = distinct_scored(examples)
    # Longest first so a batch's first example fixes its padded length.
    order = sorted(scored, key=lambda i: (-len(examples[i].input_ids), i))
    device_type = lm.get_input_embeddings().weight.device.type
    mixed = torch.autocast(device_type, dtype=autocast) if autocast else contextlib.nullcontext()
    progress = Progress("scoring", total=len(order), unit="conversations")
    with torch.inference_mode(), mixed:
        for index, total in _scored_sums(
            lm, transform, examples, order, token_budget, max_batch_size, pad_token_id
        ):
            losses[index] = total / examples[index].predicted_count
            progress.advance()
    for index, first in repeats.items():
        losses[index] = losses[first]
    return losses


def distinct_scored(examples: list[EncodedExample]) -> tuple[list[int], dict[int, int]]:
    """Indices of the examples to run (distinct, with a predicted target), and each repeat's
    index mapped to the index of its first occurrence.

    Real validation sets repeat conversations (chat_sample.jsonl holds 5 distinct of 10 lines,
    function_calling_sample.jsonl 264 of 299). The reference scores each repeat on its own at
    batch size 1, which gives the same loss, and the mean still counts every repeat; so a
    repeat is copied rather than run again.
    """
    first_of: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    scored: list[int] = []
    repeats: dict[int, int] = {}
    for index, example in enumerate(examples):
        if example.predicted_count == 0:
            continue
        key = (tuple(example.input_ids), tuple(example.target_mask))
        first = first_of.setdefault(key, index)
        if first == index:
            scored.append(index)
        else:
            repeats[index] = first
    if repeats:
        log.info(
            "%d of %d examples repeat an earlier one; each is scored once",
            len(repeats),
            len(examples),
        )
    return scored, repeats


def _causal_lm(model: nn.Module) -> nn.Module:
    """The HF causal LM inside a peft wrapper (LoRA layers stay injected and active)."""
    peft_config = getattr(model, "active_peft_config", None)
    if peft_config is None:
        return model
    if getattr(peft_config, "is_prompt_learning", False):
        # Prompt learning changes the inputs inside PeftModel.forward, which we bypass.
        raise UnsupportedArchitecture("prompt-learning peft adapters are not supported")
    return model.get_base_model()


def _post_head_transform(lm: nn.Module) -> _Transform:
    model_type = getattr(getattr(lm, "config", None), "model_type", None)
    transform = _POST_HEAD_TRANSFORMS.get(model_type)
    if transform is None:
        raise UnsupportedArchitecture(
            f"model_type {model_type!r}: what its forward applies after the lm_head is not "
            f"replicated; supported: {', '.join(sorted(_POST_HEAD_TRANSFORMS))}"
        )
    return transform


def _decoder(lm: nn.Module) -> nn.Module:
    get_decoder = getattr(lm, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else getattr(lm, "model", None)
    if decoder is None:
        raise UnsupportedArchitecture(f"{type(lm).__name__} exposes no base transformer")
    return decoder


def _scored_sums(
    lm: nn.Module,
    transform: _Transform,
    examples: list[EncodedExample],
    order: list[int],
    token_budget: int,
    max_batch_size: int,
    pad_token_id: int,
) -> Iterator[tuple[int, float]]:
    """(index, summed CE) per example in `order`; halves the budget on out-of-memory."""
    decoder, head = _decoder(lm), lm.get_output_embeddings()
    device = lm.get_input_embeddings().weight.device
    start = 0
    while start < len(order):
        batch = _next_batch(examples, order, start, token_budget, max_batch_size)
        try:
            sums = _batch_sums(
                lm, decoder, head, transform, [examples[i] for i in batch], device, pad_token_id
            )
        except RuntimeError as error:
            if not _is_oom(error) or len(batch) == 1:
                raise
            max_len = len(examples[batch[0]].input_ids)
            # At most half the examples next time; the smaller budget sticks for later batches.
            token_budget = (len(batch) // 2) * max_len
            log.warning(
                "out of memory on %d x %d tokens; retrying with token budget %d",
                len(batch),
                max_len,
                token_budget,
            )
            _release_cuda_cache()
            continue
        yield from zip(batch, sums, strict=True)
        start += len(batch)


def _next_batch(
    examples: list[EncodedExample],
    order: list[int],
    start: int,
    token_budget: int,
    max_batch_size: int,
) -> list[int]:
    """Greedy batch from `start`; an example over budget on its own still forms a batch."""
    max_len = len(examples[order[start]].input_ids)
    size = max(1, min(max_batch_size, token_budget // max_len, len(order) - start))
    return order[start : start + size]


def _is_oom(error: RuntimeError) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def _release_cuda_cache() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _batch_sums(
    lm: nn.Module,
    decoder: nn.Module,
    head: nn.Module,
    transform: _Transform,
    batch: list[EncodedExample],
    device: torch.device,
    pad_token_id: int,
) -> list[float]:
    """Summed next-token CE over each example's targets, float64, in batch order."""
    input_ids, attention_mask, predicts = _padded(batch, pad_token_id)
    # Row-major order of nonzero() matches boolean indexing below, so owners line up with rows.
    owners = predicts.nonzero()[:, 0].to(device)
    input_ids = input_ids.to(device)
    predicts = predicts.to(device)
    outputs = decoder(
        input_ids=input_ids, attention_mask=attention_mask.to(device), use_cache=False
    )
    hidden = outputs[0]
    rows = hidden[:, :-1][predicts]
    labels = input_ids[:, 1:][predicts]
    sums = torch.zeros(len(batch), dtype=torch.float64, device=device)
    per_device = _LOGIT_ELEMENTS_PER_CHUNK
    elements = per_device[device.type] if device.type in per_device else per_device["cuda"]
    chunk = max(1, elements // _vocab_size(lm, head))
    for begin in range(0, rows.shape[0], chunk):
        end = begin + chunk
        logits = transform(head(rows[begin:end]), lm).float()
        losses = F.cross_entropy(logits, labels[begin:end], reduction="none")
        sums.index_add_(0, owners[begin:end], losses.double())
    return sums.cpu().tolist()


def _padded(
    batch: list[EncodedExample], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask, and where position t predicts a target at t+1."""
    width = max(len(e.input_ids) for e in batch)
    input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    targets = torch.zeros((len(batch), width), dtype=torch.bool)
    for row, example in enumerate(batch):
        length = len(example.input_ids)
        input_ids[row, :length] = torch.tensor(example.input_ids, dtype=torch.long)
        attention_mask[row, :length] = 1
        targets[row, :length] = torch.tensor(example.target_mask, dtype=torch.long) == 1
    return input_ids, attention_mask, targets[:, 1:]


def _vocab_size(lm: nn.Module, head: Any) -> int:
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    return int(lm.config.vocab_size)
