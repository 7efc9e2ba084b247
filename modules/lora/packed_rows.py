"""The packed path of the batched forward (modules/lora/forward.py): rows of conversations back to
back (modules/lora/packing.py), and the check that keeps that path's own trouble out of scores.

The check: the first row of each length (a compiled bucket; eagerly, the first row) that a kind
of model meets in this process, and any row with a loss that is not a number, is scored again
with its conversations unpacked (the padded path, which runs each conversation as the reference
does). A difference past the rounding of the dtype the forward runs in raises `PackedMismatch`:
the caller gives packing up for that kind of model, with one warning, and the padded path scores
that row and the rest. So a compiled kernel that returns NaN or applies a mask wrongly
(pytorch/pytorch#186775, #163588) costs speed, never a score. A NaN the unpacked path gives too
is the model's own, and stands.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from modules.lora import packing as packer
from modules.lora.lm_head import Transform, head_sums
from modules.lora.records import EncodedExample

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

# Per-conversation agreement a checked row must show with its conversations unpacked, by the
# dtype the forward runs in: |packed - unpacked| <= tolerance x max(1, |unpacked|). Packed and
# padded attention round differently, by far less in fp32 (the tests: 1e-6) and by a few
# units of the 16-bit mantissa (bf16: 4e-3 on the tests' models); a NaN, or a mask that lets a
# conversation see another, moves a loss far past these. Not yet measured on a GPU: the GPU
# bench prints the largest difference it meets (bench/lora_gpu.py).
CHECK_TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}

# Sums per conversation of the padded path, for conversations given by index.
Unpacked = Callable[[list[int]], Iterator[tuple[int, float]]]


@dataclass(frozen=True)
class Batching:
    token_budget: int
    max_batch_size: int  # padded batches only
    pad_token_id: int
    # Conversations longer than this run in a forward of their own (packer.isolation_length).
    alone_over: int | None


@dataclass(frozen=True)
class PackedPath:
    """What a packed pass runs with: the kind of model (packer.health_key), whether its
    FlexAttention is compiled, the dtype its forward runs in (for the check's tolerance), and
    the padded path it is checked against."""

    key: str
    compiled: bool
    dtype: torch.dtype
    unpacked: Unpacked


class PackedMismatch(RuntimeError):
    """A packed row's losses are not those of its conversations unpacked. `models_own`: the
    unpacked losses are not all numbers either: the model itself makes NaN or inf (a NaN
    conversation reaches its row-mates through the kernel's partial blocks), which says nothing
    against packing for the next submission."""

    def __init__(self, message: str, models_own: bool = False) -> None:
        super().__init__(message)
        self.models_own = models_own


def packed_sums(
    lm: PreTrainedModel,
    decoder: nn.Module,
    transform: Transform,
    examples: list[EncodedExample],
    order: list[int],
    batching: Batching,
    path: PackedPath,
) -> Iterator[tuple[int, float]]:
    """(index, summed CE) per conversation, in packed rows of at most the token budget; halves
    the budget on out-of-memory; raises PackedMismatch where the check fails."""
    head = lm.get_output_embeddings()
    device = lm.get_input_embeddings().weight.device
    lengths = {i: len(examples[i].input_ids) for i in order}
    token_budget = batching.token_budget
    rows = deque(packer.plan_rows(order, lengths, token_budget, batching.alone_over))
    while rows:
        tokens = packer.row_tokens(examples, rows[0])
        length = packer.row_length(tokens, token_budget, path.compiled)
        row = packer.build_row(examples, rows[0], batching.pad_token_id, length)
        try:
            hidden = packer.packed_hidden(lm, decoder, row, device, path.compiled)[0]
            predicts = row.predicts.to(device)
            sums = head_sums(
                lm,
                head,
                transform,
                hidden[predicts],
                row.labels.to(device)[predicts],
                row.documents.to(device)[predicts].long(),
                len(row.indices),
            )
        except RuntimeError as error:
            if not is_oom(error) or len(row.indices) == 1:
                raise
            # At most half this row's tokens next time; the smaller budget sticks for later rows.
            token_budget = max(1, min(token_budget, row.tokens) // 2)
            log.warning(
                "out of memory on a packed row of %d conversations, %d tokens; retrying with "
                "token budget %d",
                len(row.indices),
                row.tokens,
                token_budget,
            )
            release_cuda_cache()
            left = [index for pending in rows for index in pending]
            rows = deque(packer.plan_rows(left, lengths, token_budget, batching.alone_over))
            continue
        _check(row, sums, length if path.compiled else 0, path)
        packer.HEALTH.succeeded.add(path.key)
        yield from zip(row.indices, sums, strict=True)
        rows.popleft()


def _check(row: packer.PackedRow, sums: list[float], bucket: int, path: PackedPath) -> None:
    """The module's own check of a packed row (the module docstring): raises PackedMismatch.
    A row of one conversation proves nothing about document masks: rows of one and rows of
    several are checked apart, the first of each per bucket."""
    health = packer.HEALTH
    finite = all(math.isfinite(total) for total in sums)
    seen = (path.key, bucket, len(row.indices) > 1)
    if finite and seen in health.verified:
        return
    unpacked = dict(path.unpacked(row.indices))
    expected = [unpacked[index] for index in row.indices]
    tolerance = CHECK_TOLERANCE.get(path.dtype, CHECK_TOLERANCE[torch.float32])
    worst = _worst(sums, expected, tolerance)
    if worst is not None:
        place, got, want = worst
        raise PackedMismatch(
            f"a packed row of {len(row.indices)} conversations ({row.input_ids.shape[1]} tokens) "
            f"disagrees with them unpacked: conversation {place + 1} sums {got:.6g} packed, "
            f"{want:.6g} unpacked (tolerance {tolerance:g} in {str(path.dtype)[6:]})",
            models_own=not all(math.isfinite(total) for total in expected),
        )
    if finite:
        health.verified.add(seen)


def _worst(
    got: list[float], want: list[float], tolerance: float
) -> tuple[int, float, float] | None:
    """The first (place, got, want) that disagrees; NaN agrees with NaN only."""
    for place, (a, b) in enumerate(zip(got, want, strict=True)):
        if a == b or (math.isnan(a) and math.isnan(b)):
            continue
        if not (abs(a - b) <= tolerance * max(1.0, abs(b))):  # NaN or inf on one side only
            return place, a, b
    return None


def is_oom(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def release_cuda_cache() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
