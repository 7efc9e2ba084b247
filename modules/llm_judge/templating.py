"""The assignment's chat template and tokenizer, run in a child process
(modules/llm_judge/tokenizer_child.py via validator/sandbox/child_process.py): the prompts rendered
and tokenized (`encode_prompts`), the generated ids decoded (`decode_answers`).

A full model's template and tokenizer are the submission's: three nested `range(100000)` loops
in the Jinja, a string doubled 31 times, or a tokenizer.json regex that backtracks (`(a|aa)+$`
took 14.5 s on 2.9 kB of prompt, and panics the regex engine on a longer one) would hold a core,
take the host's memory or crash the process if run in the validator's own process, and none of
it can be interrupted from within. In the child each op runs under CPU, memory, file-size and
wall-clock limits (the `template_*` config keys); past one, or on a crash, the submission is
rejected with the limit named, and the validator stays responsive to stop signals throughout.
Token ids travel in a binary file (int32), bounded like the texts by `max_output_bytes`. A LoRA's
template and tokenizer are its supported base's: their failures fail the assignment alike (one
verdict, REJECTED, in validator/errors.py; docs/llm-judge-scoring.md), only a base's tokenizer
that does not load is the host's.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from validator.kit import (
    CHILD_ENV,
    ChildFileRefused,
    ChildLimits,
    ChildOutcome,
    OperatorError,
    SubmissionRejected,
    discard,
    loads_bounded,
    read_child_file,
    run_child,
    write_new,
)

CHILD = Path(__file__).with_name("tokenizer_child.py")
# The result file may exceed the texts' own size by its JSON frame.
RESULT_MARGIN_BYTES = 64 * 1024
INT32_MAX = 2**31 - 1


class _Untrusted(BaseModel):
    # The child ran the submission's template and tokenizer: nothing but these fields, each of
    # its type (strict: no "3" for 3).
    model_config = ConfigDict(extra="forbid", strict=True)


class ItemAt(_Untrusted):
    index: int = Field(ge=0)  # the op's item, from 0
    stage: str = ""  # failed: the phase (PHASES) in which the template or the tokenizer raised
    error: str = ""  # failed: what it raised
    bytes: int = Field(0, ge=0)  # too_long: the output's size so far


class TokenizerResult(_Untrusted):
    """What tokenizer_child.py writes to its result file: one of the failures, or the op's
    answer (encode: the special ids; decode: the texts)."""

    load_error: str | None = None
    failed: ItemAt | None = None
    empty: ItemAt | None = None
    too_long: ItemAt | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    texts: list[str] | None = None


# What the child was doing (its phase file), in words: who ran into a limit, doing what.
PHASES = {
    "load": ("the tokenizer", "loading"),
    "render": ("the chat template", "rendering the prompts"),
    "tokenize": ("the tokenizer", "tokenizing the prompts"),
    "decode": ("the tokenizer", "decoding the answers"),
}


@dataclass(frozen=True)
class TemplateLimits:
    cpu_seconds: float  # CPU time for loading the tokenizer and one op (after the imports)
    memory_bytes: int  # address space on top of the child's imports
    wall_seconds: float  # the whole child, imports included
    max_output_bytes: int  # all rendered texts, all ids, all decoded texts (each)
    # Added to the CPU limit (and twice to the wall limit) per prompt rendered or answer
    # decoded, so that the task's set size alone never rejects an honest tokenizer, while a
    # hostile template still gets a bound that grows only with the task's own set.
    seconds_per_item: float = 0.0

    @classmethod
    def of(cls, config: Any) -> TemplateLimits:
        """The limits a module config (schemas.LlmJudgeConfig) sets."""
        return cls(
            cpu_seconds=config.template_cpu_seconds,
            memory_bytes=config.template_memory_bytes,
            wall_seconds=config.template_wall_seconds,
            max_output_bytes=config.template_max_output_bytes,
            seconds_per_item=config.template_seconds_per_item,
        )

    def for_items(self, count: int) -> ChildLimits:
        extra = self.seconds_per_item * count
        return ChildLimits(
            wall_seconds=self.wall_seconds + 2 * extra,
            cpu_seconds=self.cpu_seconds + extra,
            memory_bytes=self.memory_bytes,
            file_bytes=self.max_output_bytes + RESULT_MARGIN_BYTES,
        )


@dataclass(frozen=True)
class Encoded:
    """The prompts' token ids (int32 arrays, in the items' order) and the tokenizer's special
    ids, as the tokenizer reports them (None where it has none)."""

    ids: list[np.ndarray]
    eos_token_id: int | None
    pad_token_id: int | None


class TokenizerCannotLoad(SubmissionRejected):
    """A full model's tokenizer does not load: the network scores the submission -999."""


def encode_prompts(
    tokenizer_dir: Path,
    items: Sequence[tuple[Any, ...]],
    *,
    submitted: bool,
    limits: TemplateLimits,
    work: Path | None = None,
) -> Encoded:
    """For each (messages, tools[, fallback]): the ids of the chat template of `tokenizer_dir`
    with a generation prompt and thinking off, as `apply_chat_template(..., tokenize=False)`
    renders it, tokenized with `add_special_tokens=True`, as the network does; where the
    template raises on `messages` and there is a `fallback` (conversation.Prompt.fallback: the
    calls' arguments read as objects), the fallback's. Its failures fail the
    assignment (SubmissionRejected), whoever's the tokenizer is; `submitted`: it is the
    submission's (a full model), and one that does not load is TokenizerCannotLoad (the
    network's -999); otherwise the base's, and OperatorError (the host's fault)."""

    lines = [[item[0], item[1], item[2] if len(item) > 2 else None] for item in items]
    data = json.dumps(lines).encode()
    with _folder(work) as folder:
        result, ids = _run(
            "encode", tokenizer_dir, data, submitted, limits, folder, count=len(items)
        )
        rows = _read_ids(ids, limits.max_output_bytes, len(items))
    specials: dict[str, int | None] = {}
    for name in ("eos_token_id", "pad_token_id"):
        value = getattr(result, name)
        if value is not None and not 0 <= value <= INT32_MAX:
            raise SubmissionRejected(
                f"the tokenizer's {name} is {str(value)[:100]}, not a token id"
            )
        specials[name] = value
    return Encoded(rows, **specials)


def decode_answers(
    tokenizer_dir: Path,
    rows: Sequence[Sequence[int]],
    *,
    submitted: bool,
    limits: TemplateLimits,
    work: Path | None = None,
) -> list[str]:
    """Each row of generated ids as `batch_decode(..., skip_special_tokens=True)` decodes it,
    by the tokenizer of `tokenizer_dir`, in a child, under `limits`: all the texts together
    within `max_output_bytes` (the ids are sent in parts of at most that size)."""
    texts: list[str] = []
    left = limits.max_output_bytes
    with _folder(work) as folder:
        for part in _parts(rows, limits.max_output_bytes):
            budget = replace(limits, max_output_bytes=max(left, 0))
            result, _ = _run(
                "decode", tokenizer_dir, _ids_bytes(part), submitted, budget, folder,
                first=len(texts) + 1, count=len(part),
            )  # fmt: skip
            got = result.texts
            if got is None or len(got) != len(part):
                raise RuntimeError("the tokenizer child returned no texts")
            texts += got
            left -= sum(map(_json_bytes, got))
    return texts


def _run(
    op: str,
    tokenizer_dir: Path,
    input_data: bytes,
    submitted: bool,
    limits: TemplateLimits,
    work: Path,
    first: int = 1,
    count: int = 0,
) -> tuple[TokenizerResult, Path]:
    """Runs `op` in the child; returns its result and the path of its ids file. Every outcome
    but success raises: past a limit or crashed, or failing on an item, SubmissionRejected (the
    base's tokenizer of a LoRA too: the assignment fails either way); a tokenizer that does not
    load, TokenizerCannotLoad for the submission's (`submitted`), OperatorError for the base's;
    the child's own failure, RuntimeError. `first`: the number of the op's first item, as the
    failures name it; `count`: how many items the op handles (the limits grow with it)."""
    paths = _child_request(op, tokenizer_dir, input_data, limits, work)
    outcome = run_child(
        CHILD,
        [str(paths["request.json"])],
        cwd=work,
        limits=limits.for_items(count),
        # The kit's child environment (one thread each, offline, quiet) and the preloads of
        # llm_judge's other children: one pre-imported server serves them all.
        env=CHILD_ENV,
        preload=("torch", "transformers"),
    )
    who, doing = PHASES.get(_phase(paths["phase"]), ("the tokenizer", "starting"))
    for name in ("request.json", "phase", "ids" if op == "decode" else "input"):
        discard(paths[name])
    if outcome.outcome is ChildOutcome.CRASHED and outcome.exit_code > 0:
        # A traceback, not a signal: the child script's own failure (what the template and the
        # tokenizer raise, a panic included, is caught and reported in the result).
        raise RuntimeError(f"the tokenizer child {outcome.describe()} while {doing}")
    if outcome.outcome is not ChildOutcome.OK:
        raise SubmissionRejected(f"{who} {outcome.describe()} while {doing}")
    result = _read_result(paths["result.json"], limits)
    _raise_on_failure(result, op, tokenizer_dir, submitted, limits, first)
    return result, paths["ids"]


def _child_request(
    op: str, tokenizer_dir: Path, input_data: bytes, limits: TemplateLimits, work: Path
) -> dict[str, Path]:
    """The child's files in `work`: its input and its request written, the rest to come."""
    work.mkdir(parents=True, exist_ok=True)
    paths = {
        name: work / f"tokenizer-{op}-{name}"
        for name in ("request.json", "input", "ids", "phase", "result.json")
    }
    # The folder is the child's: what an earlier child planted there is removed, never
    # followed, and what it left is read as a plain file or refused
    # (validator/sandbox/child_files.py).
    for path in paths.values():
        discard(path)
    write_new(paths["ids" if op == "decode" else "input"], input_data)
    request = {
        "op": op,
        "tokenizer_dir": str(tokenizer_dir),
        "max_output_bytes": limits.max_output_bytes,
        "input": str(paths["input"]),
        "ids": str(paths["ids"]),
        "phase": str(paths["phase"]),
        "result": str(paths["result.json"]),
    }
    write_new(paths["request.json"], json.dumps(request).encode())
    return paths


def _raise_on_failure(
    result: TokenizerResult,
    op: str,
    tokenizer_dir: Path,
    submitted: bool,
    limits: TemplateLimits,
    first: int,
) -> None:
    """Raises what the child's result reports: the tokenizer not loading, or an item failed."""
    item = "generated answer" if op == "decode" else "validation set prompt"
    if result.load_error is not None:
        message = f"the tokenizer does not load: {result.load_error}"
        if submitted:
            raise TokenizerCannotLoad(message)
        # The base's (a LoRA's), in the HF cache: nothing of the submission's is read to load
        # it, so its files not loading is the host's fault (kept, exit 3), never a failure.
        raise OperatorError(f"{message} (the base model's, at {tokenizer_dir})")
    if result.failed is not None:
        who, doing = PHASES.get(result.failed.stage, ("the tokenizer", ""))
        raise SubmissionRejected(
            f"{who} fails on {item} {result.failed.index + first}: {result.failed.error}"
        )
    if result.empty is not None:
        raise SubmissionRejected(
            f"the chat template renders an empty text for {item} "
            f"{result.empty.index + first} (the network refuses an empty conversation)"
        )
    if result.too_long is not None:
        what = "decoded answers" if op == "decode" else "prompts' texts or ids"
        raise SubmissionRejected(
            f"the {what} exceed {limits.max_output_bytes} bytes (template_max_output_bytes) "
            f"at {item} {result.too_long.index + first}"
        )


@contextmanager
def _folder(work: Path | None) -> Iterator[Path]:
    """`work`, or a temporary folder removed afterwards."""
    if work is not None:
        yield work
        return
    with tempfile.TemporaryDirectory(prefix="flock-tokenizer-") as folder:
        yield Path(folder)


def _parts(rows: Sequence[Sequence[int]], max_bytes: int) -> list[list[Sequence[int]]]:
    """The rows in consecutive parts whose ids files stay within `max_bytes` (at least one
    row each, and one part for no rows)."""
    parts: list[list[Sequence[int]]] = [[]]
    size = 4
    for row in rows:
        need = 4 * (1 + len(row))
        if parts[-1] and size + need > max_bytes:
            parts.append([])
            size = 4
        parts[-1].append(row)
        size += need
    return parts


def _ids_bytes(rows: Sequence[Sequence[int]]) -> bytes:
    """The child's format: little-endian int32, the number of rows, their lengths, the ids."""
    parts = [np.asarray([len(rows), *map(len, rows)], dtype="<i4").tobytes()]
    parts += [np.asarray(row, dtype="<i4").tobytes() for row in rows]
    return b"".join(parts)


def _child_file(path: Path, max_bytes: int, what: str) -> bytes:
    """The file the child left at `path`: RuntimeError where there is none; a link, a FIFO or
    one too large is the tokenizer's doing (SubmissionRejected)."""
    try:
        data = read_child_file(path, max_bytes)
    except FileNotFoundError:
        raise RuntimeError(f"the tokenizer child left no {what} in {path}") from None
    except ChildFileRefused as exc:
        raise SubmissionRejected(f"the tokenizer child's {what}: {exc}") from None
    discard(path)
    return data


def _read_ids(path: Path, max_bytes: int, count: int) -> list[np.ndarray]:
    data = _child_file(path, max_bytes + RESULT_MARGIN_BYTES, "ids")
    flat = np.frombuffer(data[: len(data) // 4 * 4], dtype="<i4").copy()
    lengths = flat[1 : 1 + count].astype(np.int64)
    if flat.size < 1 + count or int(flat[0]) != count or (lengths < 0).any():
        raise RuntimeError("the tokenizer child wrote a malformed ids file")
    if 1 + count + int(lengths.sum()) != flat.size:
        raise RuntimeError("the tokenizer child wrote a malformed ids file")
    starts = (np.cumsum(lengths) - lengths + 1 + count).tolist()
    return [flat[start : start + n] for start, n in zip(starts, lengths.tolist(), strict=True)]


def _json_bytes(text: str) -> int:
    """A text's size as the child counts it in its result file."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) + 2


def _phase(path: Path) -> str:
    try:
        return read_child_file(path, 32).decode("ascii", "replace")
    except (OSError, ChildFileRefused):
        return ""


def _read_result(path: Path, limits: TemplateLimits) -> TokenizerResult:
    """The child's result (its texts may hold lone surrogates, as a validation set may);
    SubmissionRejected for one that is not a TokenizerResult: honest code writes one."""
    max_bytes = limits.max_output_bytes + RESULT_MARGIN_BYTES
    data = _child_file(path, max_bytes, "result")
    what = "the tokenizer child's result"
    try:
        text = data.decode("utf-8", errors="surrogatepass")
        return TokenizerResult.model_validate(loads_bounded(text, what))
    except ValueError as exc:  # not UTF-8, JsonRefused, pydantic's ValidationError
        raise SubmissionRejected(f"{what} is not one: {exc}"[:500]) from exc
