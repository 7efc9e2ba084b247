"""Validation-set reading and encoding of the LoRA scoring protocol (docs/lora-scoring.md,
"Tokenizer", "Chat templates" and "Encoding and masking").

The encoding must match the network's reference token for token: each piece (system text, tool
prompt, each prompt buffer, each assistant reply) is tokenized on its own, never the whole
conversation at once, because BPE merges across piece boundaries would change the ids.

Each JSONL line is decoded and validated once, into a `ChatLine`, when the set is read; the
encoding takes those models as they are. Plain mappings (tests, the benchmark's baseline) are
also accepted and are validated on the way in.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from modules.lora.records import EncodedExample
from modules.lora.templates import Template, get_template
from validator.kit import loads_bounded

log = logging.getLogger(__name__)

GEMMA_TURN_TOKENS = ["<start_of_turn>", "<end_of_turn>"]


class Turn(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["user", "assistant", "function_call", "observation"]
    content: str


class ChatLine(BaseModel):
    """One JSONL line. Unknown keys are ignored, as the reference ignores them."""

    model_config = ConfigDict(strict=True, extra="ignore")

    system: str | None = None
    tools: str | None = None
    conversations: list[Turn]

    def system_text(self, template: Template) -> str | None:
        """The line's system text, stripped; the template default when the key is absent."""
        if "system" not in self.model_fields_set:
            return template.system
        # An explicit null means "no system text" (the reference would crash on it).
        return self.system.strip() if self.system is not None else None


@dataclass(frozen=True)
class EncodedSet:
    examples: list[EncodedExample]
    total_target_tokens: int
    total_bytes: int


# --- reading ----------------------------------------------------------------------------------


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "line"
    return f"{where}: {first['msg']}"


def _decode_line(text: str, number: int) -> dict[str, Any]:
    # loads_bounded caps size and nesting: the set comes from the network, not from us.
    data = loads_bounded(text, f"line {number}")
    if not isinstance(data, dict):
        raise ValueError(f"line {number}: must be a JSON object")
    return data


def _validate_line(data: dict[str, Any], number: int) -> ChatLine:
    try:
        return ChatLine.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"line {number}: {_describe(exc)}") from exc


def parse_line(text: str, number: int) -> ChatLine:
    """Decode and validate one JSONL line; `number` (1-based) names it in the error."""
    return _validate_line(_decode_line(text, number), number)


def _raw_lines(path: Path | str) -> list[str]:
    """The set's lines, split with `readlines()` like the reference: `splitlines()` would also
    split at U+2028 and similar characters, which JSON allows raw inside strings. A blank line
    is malformed, as it is for the reference's `json.loads`."""
    with Path(path).open(encoding="utf-8") as handle:
        raw_lines = handle.readlines()
    if not raw_lines:
        raise ValueError("validation set is empty")
    return raw_lines


def read_chat_lines(path: Path | str) -> list[ChatLine]:
    """Every line of a validation set, decoded and validated once; the first malformed one
    raises `ValueError` naming its number. What the module encodes."""
    return [parse_line(text, number) for number, text in enumerate(_raw_lines(path), start=1)]


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """Every line as its decoded JSON object, checked as `read_chat_lines` checks it; for
    callers that want plain data. The module reads with `read_chat_lines` instead, so that
    encoding does not validate each line a second time."""
    lines = []
    for number, text in enumerate(_raw_lines(path), start=1):
        data = _decode_line(text, number)
        _validate_line(data, number)
        lines.append(data)
    return lines


# --- encoding ---------------------------------------------------------------------------------


Piece = tuple[str, int]  # text to tokenize on its own, and the mask value of its tokens
Line = ChatLine | Mapping[str, Any]  # a validated line, or a decoded one still to validate


def _chat_line(line: Line) -> ChatLine:
    return line if isinstance(line, ChatLine) else ChatLine.model_validate(line)


def _prefix_pieces(line: ChatLine, template: Template) -> list[Piece]:
    """System text then tool prompt: each its own piece, before the first prompt buffer."""
    pieces = []
    if template.system_format is not None:
        system = line.system_text(template)
        if system is not None:
            pieces.append((template.render_system(system), 0))
    # A non-empty string counts, even "[]" (an empty tool list still renders the tool prompt).
    if line.tools:
        pieces.append((template.render_tools(line.tools), 0))
    return pieces


def _render_prompt_turn(turn: Turn, content: str, template: Template, eos: str | None) -> str:
    if turn.role == "user":
        return template.render_user(content, eos)
    if turn.role == "function_call":
        return template.render_function_call(content)
    return template.render_observation(content)


def render_pieces(line: Line, template: Template, eos_token: str | None) -> list[Piece]:
    """The texts of one line in order, each with its mask value (docs/lora-scoring.md,
    "Chat templates").

    Non-assistant turns accumulate into one prompt piece that is closed by the next assistant
    turn; turns after the last assistant turn are dropped. An empty prompt piece (an assistant
    turn right after another) is kept: the reference tokenizes it too, and a normalizer that
    prepends to every text could make it non-empty.
    """
    chat = _chat_line(line)
    pieces = _prefix_pieces(chat, template)
    buffer = ""
    for turn in chat.conversations:
        content = turn.content.strip()
        if turn.role != "assistant":
            buffer += _render_prompt_turn(turn, content, template, eos_token)
            continue
        pieces += [(buffer, 0), (template.render_assistant(content, eos_token), 1)]
        buffer = ""
    return pieces


def encode_example(
    line: Line,
    template: Template,
    tokenizer: PreTrainedTokenizerBase,
    context_length: int,
) -> EncodedExample:
    """Token ids and target mask of one line, truncated to `context_length` tokens."""
    if context_length < 1:
        raise ValueError(f"context_length must be positive, got {context_length}")
    input_ids: list[int] = []
    target_mask: list[int] = []
    for text, mask in render_pieces(line, template, tokenizer.eos_token):
        ids = tokenizer.encode(text, add_special_tokens=False)
        input_ids += ids
        target_mask += [mask] * len(ids)
    return EncodedExample(
        input_ids=input_ids[:context_length], target_mask=target_mask[:context_length]
    )


def target_bytes(example: EncodedExample, tokenizer: PreTrainedTokenizerBase) -> int:
    """UTF-8 length of the example's target tokens decoded together (not token by token)."""
    pairs = zip(example.input_ids, example.target_mask, strict=True)
    target_ids = [tid for tid, m in pairs if m == 1]
    if not target_ids:
        return 0
    return len(tokenizer.decode(target_ids, skip_special_tokens=True).encode("utf-8"))


def encode_set(
    lines: Sequence[Line],
    template: Template,
    tokenizer: PreTrainedTokenizerBase,
    context_length: int,
) -> EncodedSet:
    """Encode every line and total its targets (docs/lora-scoring.md, "Encoding and masking");
    a bad line names its number."""
    examples = []
    for number, line in enumerate(lines, start=1):
        try:
            examples.append(encode_example(line, template, tokenizer, context_length))
        except (ValueError, ValidationError) as exc:
            raise ValueError(f"example {number}: {exc}") from exc
    return EncodedSet(
        examples=examples,
        total_target_tokens=sum(e.target_count for e in examples),
        total_bytes=sum(target_bytes(e, tokenizer) for e in examples),
    )


class EncodedSetCache:
    """The submissions of a task share one validation set: encode it once per content,
    template, tokenizer and context length. One set is kept, since tasks rarely interleave."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._encoded: EncodedSet | None = None

    def get(
        self,
        path: Path,
        template_key: str,
        tokenizer_name: str,
        tokenizer: PreTrainedTokenizerBase,
        context_length: int,
    ) -> EncodedSet:
        # Hashed every time: each assignment downloads the set again, maybe from a new URL.
        # The hash is of the raw bytes, so a hit decodes nothing; a miss decodes and validates
        # each line once, and encoding takes the validated lines as they are.
        key = (_sha256(path), template_key, tokenizer_name, context_length)
        if key != self._key or self._encoded is None:
            lines = read_chat_lines(path)
            self._encoded = encode_set(lines, get_template(template_key), tokenizer, context_length)
            self._key = key
        return self._encoded


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- tokenizer --------------------------------------------------------------------------------


def load_tokenizer(path_or_repo: Path | str, name_hint: str) -> PreTrainedTokenizerFast:
    """The base model's fast tokenizer, adjusted as the reference adjusts it (docs/lora-scoring.md,
    "Tokenizer").

    `name_hint` is the base model's repo id: the reference decides "gemma" from that name, and
    `path_or_repo` may be a local snapshot whose path says nothing about the model.
    """
    tokenizer = AutoTokenizer.from_pretrained(str(path_or_repo), use_fast=True)
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise ValueError(f"{name_hint}: no fast tokenizer (got {type(tokenizer).__name__})")
    if "gemma" in name_hint.lower():
        tokenizer.add_special_tokens({"additional_special_tokens": GEMMA_TURN_TOKENS})
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{name_hint}: tokenizer has no eos token")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    log.debug("tokenizer %s: vocab_size %d", name_hint, tokenizer.vocab_size)
    return tokenizer
