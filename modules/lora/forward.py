"""The batched forward: each example's mean next-token cross-entropy over its targets.

Contract (docs/lora-scoring.md, "Loss"): the reference runs HF `Trainer.evaluate` at batch size
1, so each example contributes the mean next-token cross-entropy over its own target positions
(`metrics.eval_loss` then takes the plain mean). We batch for speed, so nothing here may depend
on how examples are grouped: each example's sum is accumulated on its own and only divided by
its own target count.

Speed: the reference materialises full-vocabulary logits for every position. We run the base
transformer once per batch, keep only the hidden states whose next token is a target, and apply
the lm_head to those rows, in chunks, so full-vocab logits exist only for scored rows. Batches
are either packed rows (modules/lora/packing.py: conversations back to back, each attending only
to itself; the default on CUDA) or length-sorted right-padded batches (the default on a CPU).

Post-lm_head transforms and the chunked head: modules/lora/lm_head.py.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, get_args

import torch
from torch import nn

from modules.lora import packing as packer
from modules.lora.lm_head import (
    Transform,
    UnsupportedArchitecture,
    head_sums,
    post_head_transform,
)
from modules.lora.packed_rows import (
    Batching,
    PackedMismatch,
    PackedPath,
    is_oom,
    packed_sums,
    release_cuda_cache,
)
from modules.lora.records import EncodedExample
from modules.lora.schemas import DEFAULT_TOKEN_BUDGET, PackingMode
from validator.kit import Progress

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

# Conversations per forward on a GPU when the config leaves max_batch_size unset.
GPU_MAX_BATCH_SIZE = 64


def default_max_batch_size(device_type: str) -> int:
    """Conversations per forward when the config leaves it unset. On a CPU one at a time is
    fastest: a padded batch needs an explicit attention mask, which takes attention off its
    fused causal kernel (measured 2x slower, bench/RESULTS.md)."""
    return 1 if device_type == "cpu" else GPU_MAX_BATCH_SIZE


def example_losses(
    model: PreTrainedModel | PeftModel,
    examples: list[EncodedExample],
    *,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
    max_batch_size: int = GPU_MAX_BATCH_SIZE,
    pad_token_id: int = 0,
    autocast: torch.dtype | None = None,
    packing: PackingMode = "auto",
    compiled: bool | None = None,
) -> list[float]:
    """Mean next-token cross-entropy of each example over its targets, in input order.

    An example with no target after the shift (only position 0, or none) gets NaN, as the
    reference's per-example mean does. `model` is an HF causal LM or a peft LoRA wrapper of one.
    `autocast`: the dtype the forward and the loss run autocast to, as the reference's Trainer
    runs them under fp16 mixed precision (modules/lora/precision.py); None for none.
    `packing`: packed rows under `token_budget` ("on"), padded batches ("off"), or packed on
    CUDA only ("auto"); `max_batch_size` bounds padded batches only. `compiled`: packed rows
    through compiled FlexAttention, padded to its buckets (packing.COMPILE_OPTIONS); None: on
    CUDA only, as the module runs (True on a CPU rehearses the GPU's path under inductor).
    """
    if packing not in get_args(PackingMode):
        raise ValueError(f"packing must be auto, on or off, not {packing!r}")
    if token_budget < 1 or max_batch_size < 1:
        raise ValueError("token_budget and max_batch_size must be at least 1")
    for example in examples:
        if len(example.input_ids) != len(example.target_mask):
            raise ValueError("input_ids and target_mask differ in length")
    lm = _causal_lm(model)
    transform = post_head_transform(lm)
    # The reference Trainer evaluates in eval mode; LoRA dropout must be off.
    model.eval()
    losses = [math.nan] * len(examples)
    scored, repeats = distinct_scored(examples)
    # Longest first so a batch's first example fixes its padded length.
    order = sorted(scored, key=lambda i: (-len(examples[i].input_ids), i))
    device = lm.get_input_embeddings().weight.device
    batching = Batching(token_budget, max_batch_size, pad_token_id, packer.isolation_length(lm))
    path = None
    if packer.use_packing(packing, device.type) and _packable(lm):
        path = _packed_path(lm, transform, examples, batching, autocast, compiled)
    mixed = torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext()
    progress = Progress("scoring", total=len(order), unit="conversations")
    with torch.inference_mode(), mixed:
        for index, total in _scored_sums(lm, transform, examples, order, batching, path):
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
        log.debug(
            "%d of %d examples repeat an earlier one; each is scored once",
            len(repeats),
            len(examples),
        )
    return scored, repeats


def _packed_path(
    lm: PreTrainedModel,
    transform: Transform,
    examples: list[EncodedExample],
    batching: Batching,
    autocast: torch.dtype | None,
    compiled: bool | None,
) -> PackedPath:
    device = lm.get_input_embeddings().weight.device
    compiled = packer.compiles(device.type) if compiled is None else compiled

    def unpacked(indices: list[int]) -> Iterator[tuple[int, float]]:
        return _padded_sums(lm, transform, examples, indices, batching)

    dtype = autocast or lm.get_input_embeddings().weight.dtype
    return PackedPath(packer.health_key(lm, device, autocast, compiled), compiled, dtype, unpacked)


def _packable(lm: PreTrainedModel) -> bool:
    reason = packer.unsupported_reason(lm)
    if reason is not None:
        log.debug("scoring in padded batches: %s", reason)
    return reason is None


def _causal_lm(model: PreTrainedModel | PeftModel) -> PreTrainedModel:
    """The HF causal LM inside a peft wrapper (LoRA layers stay injected and active)."""
    peft_config = getattr(model, "active_peft_config", None)
    if peft_config is None:
        return model
    if getattr(peft_config, "is_prompt_learning", False):
        # Prompt learning changes the inputs inside PeftModel.forward, which we bypass.
        raise UnsupportedArchitecture("prompt-learning peft adapters are not supported")
    return model.get_base_model()


def _decoder(lm: PreTrainedModel) -> nn.Module:
    get_decoder = getattr(lm, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else getattr(lm, "model", None)
    if decoder is None:
        raise UnsupportedArchitecture(f"{type(lm).__name__} exposes no base transformer")
    return decoder


def _scored_sums(
    lm: PreTrainedModel,
    transform: Transform,
    examples: list[EncodedExample],
    order: list[int],
    batching: Batching,
    path: PackedPath | None,
) -> Iterator[tuple[int, float]]:
    """(index, summed CE) per example in `order`: packed when `path` is set and packing has not
    failed for its kind of model (packer.health_key), else padded. A packed row that fails for
    another reason than memory (a kernel that does not compile on this card, a recompile that
    fails later, losses the module's check finds wrong: modules/lora/packed_rows.py) gives
    packing up for that kind of model, and the padded path, which computes the same losses,
    scores what the packed rows had not: a submission is never failed, nor scored, by the
    packed path's own trouble."""
    if path is not None and packer.HEALTH.usable(path.key):
        done: set[int] = set()
        try:
            packed = packed_sums(lm, _decoder(lm), transform, examples, order, batching, path)
            for index, total in packed:
                done.add(index)
                yield index, total
            return
        except Exception as error:
            if is_oom(error):
                raise
            if isinstance(error, PackedMismatch) and error.models_own:
                log.info("this model's own losses are not numbers: scored in padded batches")
            else:
                packer.HEALTH.give_up(path.key, error)
            release_cuda_cache()
        order = [index for index in order if index not in done]
    yield from _padded_sums(lm, transform, examples, order, batching)


def _padded_sums(
    lm: PreTrainedModel,
    transform: Transform,
    examples: list[EncodedExample],
    order: list[int],
    batching: Batching,
) -> Iterator[tuple[int, float]]:
    """Length-sorted right-padded batches; halves the budget on out-of-memory."""
    decoder, head = _decoder(lm), lm.get_output_embeddings()
    device = lm.get_input_embeddings().weight.device
    token_budget = batching.token_budget
    start = 0
    while start < len(order):
        batch = _next_batch(examples, order, start, token_budget, batching)
        try:
            sums = _batch_sums(
                lm,
                decoder,
                head,
                transform,
                [examples[i] for i in batch],
                device,
                batching.pad_token_id,
            )
        except RuntimeError as error:
            if not is_oom(error) or len(batch) == 1:
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
            release_cuda_cache()
            continue
        yield from zip(batch, sums, strict=True)
        start += len(batch)


def _next_batch(
    examples: list[EncodedExample],
    order: list[int],
    start: int,
    token_budget: int,
    batching: Batching,
) -> list[int]:
    """Greedy batch from `start`; an example over budget on its own still forms a batch."""
    max_len = len(examples[order[start]].input_ids)
    if batching.alone_over is not None and max_len > batching.alone_over:
        return order[start : start + 1]  # its length would change its batch-mates' RoPE
    size = max(1, min(batching.max_batch_size, token_budget // max_len, len(order) - start))
    return order[start : start + size]


def _batch_sums(
    lm: PreTrainedModel,
    decoder: nn.Module,
    head: nn.Module,
    transform: Transform,
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
    return head_sums(lm, head, transform, rows, labels, owners, len(batch))


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
