"""Batched sampling of the submitted model's answers (docs/llm-judge-scoring.md, "Generation").

Generation is the expensive part of an assignment, so prompts are tokenized once, sorted by
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
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

from validator.kit import Progress, SubmissionRejected

if TYPE_CHECKING:
    from transformers import GenerationMixin, PreTrainedModel

    class CausalLM(PreTrainedModel, GenerationMixin):
        """What AutoModelForCausalLM builds: a model that generates."""


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
    ids: Sequence[int] | np.ndarray  # the prompt's token ids (or the int32 array the child sent)


def assignment_seed(*parts: str) -> int:
    """A 63-bit seed from the assignment's identity (task, assignment id, commit)."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def render(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict], tools: list[dict] | None
) -> list[int]:
    """A prompt's token ids, in this process, for a trusted tokenizer (the bench, the tests; the
    module renders and tokenizes in a bounded child, templating.py): the chat template with the
    tools, a generation prompt and thinking off, as text, then tokenized with
    `add_special_tokens=True`, as the network does. Never shortened."""
    text = tokenizer.apply_chat_template(
        messages,
        tools=[*tools] if tools else None,
        add_generation_prompt=True,
        enable_thinking=False,
        tokenize=False,
    )
    if not isinstance(text, str):  # tokenize=False: the template's text
        raise TypeError(f"the chat template rendered {type(text).__name__}, not text")
    return tokenize(tokenizer, [text])[0]


def tokenize(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """Rendered prompts as token ids, as the network tokenizes them (trusted tokenizers only)."""
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]


def decode(
    tokenizer: PreTrainedTokenizerBase, generated: dict[tuple[int, int], Sequence[int]]
) -> dict[tuple[int, int], str]:
    """`generate`'s ids as answers, in this process, for a trusted tokenizer (the module decodes
    in a bounded child, templating.py): special tokens skipped, as the network decodes them."""
    keys = list(generated)
    texts = tokenizer.batch_decode([list(generated[k]) for k in keys], skip_special_tokens=True)
    return dict(zip(keys, texts, strict=True))


@dataclass(frozen=True)
class EndTokens:
    """The tokenizer's end-of-text and padding ids (None where it has none)."""

    eos_token_id: int | None
    pad_token_id: int | None

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase) -> EndTokens:
        """A trusted in-process tokenizer's (the bench, the tests)."""
        return cls(tokenizer.eos_token_id, tokenizer.pad_token_id)

    @property
    def padding(self) -> int:
        """What fills the left of shorter prompts: masked, so any id the model embeds; the
        end of text first, as the network's pad id (a tokenizer's own pad token may lie past
        the embeddings, where the network, which never pads, still scores)."""
        for value in (self.eos_token_id, self.pad_token_id):
            if value is not None:
                return value
        return 0


def generate(
    model: CausalLM,
    requests: Sequence[Request],
    sampling: Sampling,
    seed: int,
    ends: EndTokens,
) -> dict[tuple[int, int], list[int]]:
    """Every request's generated ids, by (index, repeat): only the new tokens, up to and
    including the first end of text (what follows it in a batch is padding)."""
    order = sorted(requests, key=lambda r: (len(r.ids), r.index, r.repeat))
    answers: dict[tuple[int, int], list[int]] = {}
    start = 0
    batch_number = 0
    limit = sampling.max_batch
    settings = getattr(model, "generation_config", None)
    beams = _beams(settings)
    exact = padding_matters(settings)
    if exact:
        log.info("the generation config reads the padding: prompts batched by equal length")
    progress = Progress("generating", total=len(order), unit="answers")
    while start < len(order):
        size = _fitting(order, start, sampling, limit, beams, exact)
        batch = order[start : start + size]
        try:
            rows = _generate_batch(model, batch, sampling, seed + batch_number, ends)
        except RuntimeError as error:
            if isinstance(error, NotNumbers) or _NOT_NUMBERS in str(error):
                # Sampling met NaN or infinite probabilities: the model's weights (or its
                # generation config's penalties) made them; the network raises there too.
                raise SubmissionRejected(NOT_NUMBERS_REASON) from error
            if not _is_oom(error):
                raise
            rows = None
        except IndexError as error:
            # A token id of the model's own generation config past its vocabulary
            # (`forced_eos_token_id`): the network raises there too.
            raise SubmissionRejected(
                f"generation fails on the model's generation config: IndexError: {error}"
            ) from error
        if rows is None:
            _release_cuda_cache()
            if size == 1:
                # Prompts are never shortened (the network does not shorten them), so one that
                # does not fit alone cannot be scored on this card: the assignment fails with
                # that reason rather than crash-looping through restarts. Raised outside the
                # handler, so that the out-of-memory error does not make it a device fault.
                raise PromptTooLong(
                    f"validation set prompt {batch[0].index + 1} ({len(batch[0].ids)} tokens, "
                    f"plus up to {sampling.max_new_tokens} new) does not fit in the device's "
                    "memory even alone"
                )
            limit = max(1, size // 2)
            log.warning("out of memory at %d sequences; trying %d", size, limit)
            continue
        answers.update({(r.index, r.repeat): row for r, row in zip(batch, rows, strict=True)})
        progress.advance(size)
        start += size
        batch_number += 1
    return answers


def _beams(settings: Any) -> int:
    """A submitted generation config may ask for beams (file_checks.py bounds them): each is a
    sequence of its own in the batch's memory."""
    beams = getattr(settings, "num_beams", None)
    return beams if isinstance(beams, int) and beams > 1 else 1


def padding_matters(settings: Any) -> bool:
    """Whether a (submitted) generation config asks for a logits processor that reads the
    whole row, padding included, or its length: the network generates one prompt at a time,
    unpadded, so with these a padded row would sample from other distributions."""

    def given(name: str, default: Any) -> bool:
        value = getattr(settings, name, None)
        return value is not None and value != default

    return any(
        given(name, default)
        for name, default in (
            ("repetition_penalty", 1.0),
            ("no_repeat_ngram_size", 0),
            ("min_length", 0),
            ("exponential_decay_length_penalty", None),
            ("bad_words_ids", None),
            ("sequence_bias", None),
            ("watermarking_config", None),
            ("num_beams", 1),
        )
    )


def _fitting(
    order: Sequence[Request],
    start: int,
    sampling: Sampling,
    limit: int,
    beams: int = 1,
    exact: bool = False,
) -> int:
    """How many requests from `start` fit the budget (each `beams` sequences; `exact`: of the
    first one's length only, so that nothing is padded): sorted by length, the last is
    longest."""
    size = 0
    while start + size < len(order) and size < limit:
        longest = len(order[start + size].ids)
        if exact and longest != len(order[start].ids):
            break
        cost = (size + 1) * beams * (longest + sampling.max_new_tokens)
        if cost > sampling.token_budget and size:
            break
        size += 1
    return size


def _generate_batch(
    model: CausalLM, batch: Sequence[Request], sampling: Sampling, seed: int, ends: EndTokens
) -> list[list[int]]:
    device = next(model.parameters()).device
    width = max(len(r.ids) for r in batch)
    input_ids = torch.full((len(batch), width), ends.padding, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, request in enumerate(batch):  # left padding: every prompt ends at the same column
        input_ids[row, width - len(request.ids) :] = torch.as_tensor(request.ids)
        attention[row, width - len(request.ids) :] = 1
    torch.manual_seed(seed)
    guard = NotNumbersGuard(device)
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            do_sample=sampling.temperature > 0,
            temperature=sampling.temperature or None,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_new_tokens=sampling.max_new_tokens,
            # The network stops at the tokenizer's end-of-text token only (not the generation
            # config's list) and pads with it; one sequence per prompt, whatever a submitted
            # generation config asks (num_return_sequences > 1 would misalign the answers).
            pad_token_id=ends.eos_token_id,
            eos_token_id=ends.eos_token_id,
            num_return_sequences=1,
            # The ids as a tensor, whatever a submitted generation config asks: these change
            # what generate() returns, never which tokens it samples.
            return_dict_in_generate=False,
            output_scores=False,
            output_logits=False,
            output_attentions=False,
            output_hidden_states=False,
            logits_processor=LogitsProcessorList([guard]),
            stopping_criteria=StoppingCriteriaList([guard.stop]),
        )
    if bool(guard.seen):  # one read of the device's flag per batch
        raise NotNumbers(NOT_NUMBERS_REASON)
    return [_until_end(row, ends.eos_token_id) for row in output[:, width:].tolist()]


class NotNumbers(RuntimeError):
    """Next-token scores with a NaN or +inf (or none finite) in a row: the model's weights, or
    its generation config's penalties, made them."""


NOT_NUMBERS_REASON = (
    "the model's next-token probabilities are not numbers (NaN or infinite weights or penalties)"
)


class NotNumbersGuard(LogitsProcessor):
    """Keeps sampling from ever meeting scores that are not numbers. On a CPU
    `torch.multinomial` raises for them, but on a CUDA card it asserts on the device, which
    poisons the process's CUDA context: the error would read as a device fault (exit 100, a
    restart, the assignment rescored until its attempts run out), not as the submission's.
    The guard runs after the generation config's own processors (transformers appends a
    caller's processors to them) and before the sampling warpers, which keep finite scores
    finite: a row with a NaN, a +inf or no finite score is recorded on the device (no sync per
    token) and replaced by zeros, and `stop` ends the generation at that step. Rows that are
    numbers pass unchanged, bit for bit, so an honest model's answers are what they were."""

    def __init__(self, device: torch.device) -> None:
        self.seen = torch.zeros((), dtype=torch.bool, device=device)
        self.stop = _StopOnNotNumbers(self)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.Tensor:
        bad = scores.isnan().any(-1) | scores.isposinf().any(-1) | scores.isneginf().all(-1)
        self.seen |= bad.any()
        return torch.where(bad[:, None], torch.zeros_like(scores), scores)


class _StopOnNotNumbers(StoppingCriteria):
    def __init__(self, guard: NotNumbersGuard) -> None:
        self.guard = guard

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor, **_: Any) -> Any:
        return self.guard.seen.expand(input_ids.shape[0])


def _until_end(row: list[int], eos: int | None) -> list[int]:
    """A sequence's new ids through its first end of text; after it, the batch's padding."""
    if eos is not None and eos in row:
        return row[: row.index(eos) + 1]
    return row


class PromptTooLong(ValueError):
    """A prompt that does not fit the device even alone: the assignment fails with this reason."""


# torch.multinomial's message for probabilities that are not a distribution (on a CPU; a GPU
# asserts on the device instead).
_NOT_NUMBERS = "probability tensor contains either `inf`, `nan` or element < 0"


def _is_oom(error: RuntimeError) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def _release_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
