"""Packed scoring rows: several conversations concatenated in one row, none seeing another, each
computing exactly what it computes alone (a document + causal mask run by FlexAttention), so
that a GPU's work is not spent on padding. How the mask reaches transformers' models, and which
of the reference's masks it repeats: docs/internals.md, "lora's packed rows".
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypedDict

import torch
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from modules.lora.records import EncodedExample
from modules.lora.schemas import PackingMode

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

WindowRule = Literal["none", "config", "layer"]

# model_type -> where its reference masks take a sliding window from (see the module docstring).
_WINDOW_RULES: dict[str, WindowRule] = {
    "llama": "none",
    "gemma": "none",
    "cohere": "none",
    "granite": "none",
    "mistral": "config",
    "qwen2": "config",
    "phi3": "config",
    "gemma2": "layer",
    "cohere2": "layer",
}

# The attention implementations whose masks and soft-cap handling are the ones repeated here.
_REPEATED_IMPLEMENTATIONS = ("sdpa", "eager")

# FlexAttention's block size, and the shortest bucket (below).
BLOCK_SIZE = 128
MIN_BUCKET = 2 * BLOCK_SIZE


# How FlexAttention and its block masks are compiled, wherever they are (CUDA by default; a CPU
# under inductor in tests/lora/test_lora_compiled.py, which rehearses exactly this). Static
# shapes: with `dynamic=True` and masks that change from row to row, compiled FlexAttention has
# given NaN or silently wrong outputs (pytorch/pytorch#186775, #163588), so every row is padded
# to one of a few bucket lengths instead (`bucket_length`), each compiled once. `fullgraph`: a
# graph break would run the unfused kernel unseen; it raises instead, and packing falls back.
class _CompileOptions(TypedDict):
    dynamic: bool
    fullgraph: bool


COMPILE_OPTIONS = _CompileOptions(dynamic=False, fullgraph=True)
# Compiles one kind of model may need: a bucket per power of two up to the token budget, times
# its masks (window or none) and soft-caps. Past dynamo's default (8) a fullgraph compile raises.
RECOMPILE_LIMIT = 64
_ATTENTION_KEY = "flock_lora_packed"


def compiles(device_type: str) -> bool:
    """Whether packed rows run compiled FlexAttention by default: on CUDA. On a CPU the eager
    kernel serves the tests (`packing: on`); the compiled CPU path is the GPU's rehearsal."""
    return device_type == "cuda"


def bucket_length(tokens: int, token_budget: int) -> int:
    """The padded length of a compiled row of `tokens`: the smallest power of two from
    MIN_BUCKET up that holds it, capped at the token budget rounded up to a block (full rows,
    the most, then carry little padding). A conversation over the budget, alone in its row, gets
    the power of two above it. So a process compiles a few lengths, not one per row."""
    cap = max(MIN_BUCKET, -(-token_budget // BLOCK_SIZE) * BLOCK_SIZE)
    length = MIN_BUCKET
    while length < tokens:
        length *= 2
    return min(length, cap) if tokens <= cap else length


def row_length(tokens: int, token_budget: int, compiled: bool) -> int:
    """A packed row's length: its bucket when compiled; eagerly, its tokens (padding would only
    add work)."""
    return bucket_length(tokens, token_budget) if compiled else tokens


def use_packing(mode: PackingMode, device_type: str) -> bool:
    """auto: packed on CUDA; on a CPU one conversation per forward stays fastest (no mask at
    all, torch's fused causal kernel), and eager FlexAttention materialises its scores."""
    if mode == "auto":
        return device_type == "cuda"
    return mode == "on"


def unsupported_reason(lm: PreTrainedModel) -> str | None:
    """Why this model cannot be scored packed (it is then scored in padded batches), or None."""
    config = lm.config
    if config.model_type not in _WINDOW_RULES:
        return f"model_type {config.model_type!r} has no known attention masks"
    if config._attn_implementation not in _REPEATED_IMPLEMENTATIONS:
        return f"attention implementation {config._attn_implementation!r} is not repeated"
    return None


def isolation_length(lm: PreTrainedModel) -> int | None:
    """Length above which a conversation must run in a forward of its own, or None.

    Some RoPE variants pick their frequencies from the largest position id of the whole forward
    (4.49: `longrope`, used by Phi-3.5 and Phi-4-mini, switches to its long factors above
    `original_max_position_embeddings`; `dynamic` rescales above `max_position_embeddings`). A
    conversation over that length would change its neighbours' frequencies, so it runs alone,
    as the reference runs it. (`dynamic` also keeps state across forwards in the reference,
    which no batching reproduces; none of the supported bases uses it.)
    """
    config = lm.config
    scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "longrope":
        original = getattr(config, "original_max_position_embeddings", None)
        return int(original or config.max_position_embeddings)
    if rope_type and "dynamic" in rope_type:
        return int(config.max_position_embeddings)
    return None


def plan_rows(
    order: list[int], lengths: dict[int, int], token_budget: int, alone_over: int | None
) -> list[list[int]]:
    """First-fit decreasing: conversations (indices into `lengths`) into rows of at most
    `token_budget` tokens. A conversation at or over the budget, or over `alone_over`, gets a
    row of its own. Rows come longest conversation first, so an out-of-memory shows early."""
    rows: list[list[int]] = []
    free: list[int] = []  # tokens left per row; -1 for a row that takes no more
    for index in sorted(order, key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        if length >= token_budget or (alone_over is not None and length > alone_over):
            rows.append([index])
            free.append(-1)
            continue
        for row, left in enumerate(free):
            if left >= length:
                rows[row].append(index)
                free[row] -= length
                break
        else:
            rows.append([index])
            free.append(token_budget - length)
    return rows


@dataclass(frozen=True)
class PackedRow:
    """One packed forward's inputs (batch dimension 1), built on the host."""

    indices: list[int]  # the conversations, in row order
    input_ids: torch.Tensor  # (1, L)
    position_ids: torch.Tensor  # (1, L): 0, 1, ... per conversation; 0 for the padding
    documents: torch.Tensor  # (L,) int32: the conversation's place in `indices`; padding last
    predicts: torch.Tensor  # (L,) bool: position t predicts a target at t+1 of its conversation
    labels: torch.Tensor  # (L,) long: the token at t+1
    tokens: int  # conversation tokens, padding excluded


def row_tokens(examples: list[EncodedExample], indices: list[int]) -> int:
    return sum(len(examples[index].input_ids) for index in indices)


def build_row(
    examples: list[EncodedExample],
    indices: list[int],
    pad_token_id: int,
    length: int | None = None,
) -> PackedRow:
    """Concatenates `indices`' conversations and pads the row to `length` (its tokens when
    None) with pad tokens that form a document of their own (they attend only among
    themselves, so no attention row is empty, and no conversation sees them)."""
    ids: list[int] = []
    predicts: list[bool] = []
    documents: list[int] = []
    lengths: list[int] = []
    for place, index in enumerate(indices):
        example = examples[index]
        ids += example.input_ids
        # The last token of a conversation predicts nothing: its next token is another's.
        predicts += [m == 1 for m in example.target_mask[1:]] + [False]
        documents += [place] * len(example.input_ids)
        lengths.append(len(example.input_ids))
    tokens = len(ids)
    pad = 0 if length is None else length - tokens
    if pad < 0:
        raise ValueError(f"a row of {tokens} tokens does not fit a length of {length}")
    ids += [pad_token_id] * pad
    predicts += [False] * pad
    documents += [len(indices)] * pad
    # Position 0 throughout the padding: a RoPE that looks at the forward's largest position
    # (isolation_length) must see the conversations' own, whatever the padding's length.
    positions = torch.cat([_document_positions(lengths), torch.zeros(pad, dtype=torch.long)])
    input_ids = torch.tensor(ids, dtype=torch.long)
    return PackedRow(
        indices=list(indices),
        input_ids=input_ids[None],
        position_ids=positions[None],
        documents=torch.tensor(documents, dtype=torch.int32),
        predicts=torch.tensor(predicts, dtype=torch.bool),
        labels=torch.cat([input_ids[1:], input_ids[:1]]),  # the wrapped last one is never read
        tokens=tokens,
    )


def _document_positions(lengths: list[int]) -> torch.Tensor:
    """0 .. n-1 for each document: what each conversation's RoPE sees when it runs alone."""
    return torch.cat([torch.arange(n, dtype=torch.long) for n in lengths])


def _mask_mod(documents: torch.Tensor, window: int | None) -> Callable[..., torch.Tensor]:
    """Attend to earlier tokens (and itself) of the same document, within `window` if set: the
    reference masks kv <= q - window, so q - kv < window is kept. One function for every window
    (none: the row's length, which keeps every earlier token), the window a tensor beside the
    documents: compiled, it is an input like them, so windowed and plain layers, and rows with
    other documents, share one kernel per bucket instead of one each."""
    reach = documents.shape[0] if window is None else window
    limit = torch.tensor(reach, dtype=torch.int64, device=documents.device)

    def document_causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        same = documents[q_idx] == documents[kv_idx]
        return same & (q_idx >= kv_idx) & (q_idx - kv_idx < limit)

    return document_causal


@functools.cache
def _softcap_mod(cap: float) -> Callable[..., torch.Tensor]:
    """gemma2's eager order on the scaled scores: / cap, tanh, * cap. Cached per cap so the
    compiled kernel sees the same function every time (no recompile per layer)."""

    def softcap(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return torch.tanh(score / cap) * cap

    return softcap


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    """Compiled once per process (COMPILE_OPTIONS), for every bucket: eager FlexAttention on
    CUDA would materialise every score. A compile happens in the first packed row of a bucket,
    where a failure still falls back to padded batches."""
    import torch._dynamo  # loaded by torch.compile anyway; only when a compile is asked for

    dynamo_config = torch._dynamo.config
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(flex_attention, **COMPILE_OPTIONS)


@functools.cache
def _compiled_block_mask() -> Callable[..., BlockMask]:
    """Compiled as `_compiled_flex` is: eager, a row's L x L boolean mask would be built."""
    return torch.compile(create_block_mask, **COMPILE_OPTIONS)


@dataclass
class _RowAttention:
    """What the attention function needs during one packed forward."""

    documents: torch.Tensor  # on the model's device
    rule: WindowRule
    config_window: int | None
    softcap: bool  # whether the model's own implementation applies a `softcap` kwarg
    compiled: bool
    masks: dict[int | None, BlockMask] = field(default_factory=dict)

    def block_mask(self, layer_window: int | None) -> BlockMask:
        if self.rule == "config":
            window = self.config_window
        elif self.rule == "layer":
            window = layer_window
        else:
            window = None
        # One BlockMask per distinct window, built the first time a layer asks for it.
        if window not in self.masks:
            length = self.documents.shape[0]
            build = _compiled_block_mask() if self.compiled else create_block_mask
            self.masks[window] = build(
                _mask_mod(self.documents, window),
                1,
                None,
                length,
                length,
                device=self.documents.device,
                BLOCK_SIZE=BLOCK_SIZE,
            )
        return self.masks[window]


_CURRENT: contextvars.ContextVar[_RowAttention | None] = contextvars.ContextVar(
    "flock_lora_packed_row", default=None
)


def _packed_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    sliding_window: int | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """An HF attention interface: (batch, heads, L, head_dim) in, (batch, L, heads, head_dim)
    out. `attention_mask` is the empty pass-through one and is not read."""
    row = _CURRENT.get()
    if row is None:
        raise RuntimeError("packed attention called outside a packed forward")
    score_mod = _softcap_mod(float(softcap)) if softcap is not None and row.softcap else None
    flex: Callable[..., Tensor] = flex_attention
    if row.compiled:
        flex = _compiled_flex()
    with contextlib.ExitStack() as stack:
        # Under autocast the projections already gave q, k and v in the autocast dtype; flex
        # takes them as they are (it accumulates in fp32), as sdpa would under autocast.
        stack.enter_context(torch.autocast(query.device.type, enabled=False))
        if not row.compiled:
            # Eager flex is what the CPU tests run; its "use torch.compile" advice is for CUDA.
            stack.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        # Contiguous: the compiled kernel is specialised to its inputs' strides, which differ
        # between architectures (a fused qkv projection's views); one layout, fewer compiles.
        output = flex(
            query.contiguous(),
            key.to(query.dtype).contiguous(),
            value.to(query.dtype).contiguous(),
            score_mod=score_mod,
            block_mask=row.block_mask(sliding_window),
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )
    return output.transpose(1, 2).contiguous(), None


ALL_ATTENTION_FUNCTIONS[_ATTENTION_KEY] = _packed_attention


@contextlib.contextmanager
def _packed_attention_for(lm: PreTrainedModel, row: _RowAttention) -> Iterator[None]:
    """Points the model at the packed attention for one forward; restored even on error, so a
    failed packed forward leaves the model as loaded for the padded path and later scoring."""
    config = lm.config
    previous = config._attn_implementation
    token = _CURRENT.set(row)
    config._attn_implementation = _ATTENTION_KEY
    try:
        yield
    finally:
        config._attn_implementation = previous
        _CURRENT.reset(token)


def packed_hidden(
    lm: PreTrainedModel, decoder: nn.Module, row: PackedRow, device: torch.device, compiled: bool
) -> torch.Tensor:
    """The decoder's last hidden states for a packed row: (1, L, hidden); FlexAttention
    compiled (COMPILE_OPTIONS) or eager."""
    config = lm.config
    attention = _RowAttention(
        documents=row.documents.to(device),
        rule=_WINDOW_RULES[config.model_type],
        config_window=getattr(config, "sliding_window", None),
        softcap=config._attn_implementation != "sdpa",
        compiled=compiled,
    )
    # Empty and 4D: 4.49's mask builders return a 4D mask as given (see the module docstring).
    passthrough = torch.ones((1, 1, 0, 0), device=device)
    with _packed_attention_for(lm, attention):
        outputs = decoder(
            input_ids=row.input_ids.to(device),
            position_ids=row.position_ids.to(device),
            attention_mask=passthrough,
            use_cache=False,
        )
    return outputs[0]


def health_key(
    lm: PreTrainedModel, device: torch.device, autocast: torch.dtype | None, compiled: bool = False
) -> str:
    """What a packed forward's compiled kernels depend on: a model of another kind (head size,
    heads, dtype, soft-cap, windows) compiles afresh, and may fail where the first did not."""
    config = lm.config
    weights = lm.get_input_embeddings().weight.dtype
    heads = (config.num_attention_heads, getattr(config, "num_key_value_heads", None))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads[0]
    return (
        f"{config.model_type} heads {heads[0]}/{heads[1]} x {head_dim} "
        f"{autocast or weights} {config._attn_implementation} on {device.type}"
        f"{', compiled' if compiled else ''}"
    )


class PackingHealth:
    """Whether packing works, per kind of model (`health_key`), in this process. A packed
    forward compiles FlexAttention's kernels and can fail where padded batches would not (a
    card or head size the kernels do not take, a recompile for a new row length), or give
    what the same conversations unpacked do not (NaN, a mask a kernel gets wrong): that kind of
    model is then scored in padded batches for the rest of the process, after one warning
    (`succeeded` says whether it had worked before, for the warning and the bench). `verified`:
    the (kind, bucket, several conversations) whose first row agreed with its conversations
    scored unpacked (modules/lora/packed_rows.py)."""

    def __init__(self) -> None:
        self.succeeded: set[str] = set()
        self.failures: dict[str, str] = {}
        self.verified: set[tuple[str, int, bool]] = set()

    def usable(self, key: str) -> bool:
        return key not in self.failures

    def give_up(self, key: str, error: BaseException) -> None:
        self.failures[key] = f"{type(error).__name__}: {error}"
        log.warning(
            "packed scoring failed %s (%s); scoring %s in padded batches for the rest of this "
            "process",
            "after earlier packed batches had succeeded" if key in self.succeeded else "at once",
            self.failures[key],
            key,
        )


HEALTH = PackingHealth()
