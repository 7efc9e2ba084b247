"""Batched sampling of the submitted model's answers (docs/llm-judge-scoring.md, "Generation").

Generation is the expensive part of an assignment, so prompts are rendered once, sorted by
length, and run in left-padded batches under a token budget (prompt plus new tokens); each
sequence stops at its own end of text. An out-of-memory error halves the batch. The sampling
seed is derived from the assignment, so a rescore after a crash samples the same answers: the
batches are the same, and each one's generator is seeded from the assignment and its position.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from validator.progress import Progress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    token_budget: int
    max_batch: int


@dataclass(frozen=True)
class Request:
    index: int  # the prompt's position in the set
    repeat: int  # 0 .. gen_require - 1
    ids: list[int]


def assignment_seed(*parts: str) -> int:
    """A 63-bit seed from the assignment's identity (task, assignment id, commit)."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def render(
    tokenizer, messages: list[dict], tools: list[dict] | None, context_length: int
) -> list[int]:
    """The prompt's token ids: the base's chat template with the tools, a generation prompt,
    thinking off. A prompt longer than `context_length` keeps its last tokens."""
    ids = tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        add_generation_prompt=True,
        enable_thinking=False,
        tokenize=True,
        return_dict=False,
    )
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    return ids[-context_length:]


def generate(
    model, tokenizer, requests: Sequence[Request], sampling: Sampling, seed: int
) -> dict[tuple[int, int], str]:
    """Every request's answer, by (index, repeat): only the new tokens, special tokens skipped."""
    order = sorted(requests, key=lambda r: (len(r.ids), r.index, r.repeat))
    answers: dict[tuple[int, int], str] = {}
    start = 0
    batch_number = 0
    limit = sampling.max_batch
    progress = Progress("generating", total=len(order), unit="answers")
    while start < len(order):
        size = _fitting(order, start, sampling, limit)
        batch = order[start : start + size]
        try:
            texts = _generate_batch(model, tokenizer, batch, sampling, seed + batch_number)
        except RuntimeError as error:
            if not _is_oom(error) or size == 1:
                raise
            limit = max(1, size // 2)
            log.warning("out of memory at %d sequences; trying %d", size, limit)
            _release_cuda_cache()
            continue
        answers.update({(r.index, r.repeat): text for r, text in zip(batch, texts, strict=True)})
        progress.advance(size)
        start += size
        batch_number += 1
    return answers


def _fitting(order: Sequence[Request], start: int, sampling: Sampling, limit: int) -> int:
    """How many requests from `start` fit the budget: sorted by length, the last is longest."""
    size = 0
    while start + size < len(order) and size < limit:
        longest = len(order[start + size].ids)
        if (size + 1) * (longest + sampling.max_new_tokens) > sampling.token_budget and size:
            break
        size += 1
    return size


def _generate_batch(model, tokenizer, batch, sampling: Sampling, seed: int) -> list[str]:
    device = next(model.parameters()).device
    width = max(len(r.ids) for r in batch)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, request in enumerate(batch):  # left padding: every prompt ends at the same column
        input_ids[row, width - len(request.ids) :] = torch.tensor(request.ids)
        attention[row, width - len(request.ids) :] = 1
    torch.manual_seed(seed)
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            do_sample=sampling.temperature > 0,
            temperature=sampling.temperature or None,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=pad,
        )
    return tokenizer.batch_decode(output[:, width:], skip_special_tokens=True)


def _is_oom(error: RuntimeError) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def _release_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
