"""The submitted model: a LoRA adapter on a supported base, or a full model, fetched pinned to
the commit its revision resolves to (also for full models, which upstream fetches at `main`),
only the files needed, safetensors only, never remote code, within size caps
(docs/llm-judge-scoring.md, "The submission"). Every file goes to the assignment's folder,
never to the shared HF cache, and its metadata is read only in the bounded child
(inspection.py): this process parses none of the submission's files before transformers loads
weights whose headers the child has checked."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from modules.llm_judge.file_checks import check_generation_config
from modules.llm_judge.inspection import (
    check_against_headers,
    inspect_adapter,
    inspect_headers,
    inspect_model,
)
from validator.kit import (
    LoraTensor,
    SubmissionRejected,
    TransientError,
    check_layer_replication,
    checked_listing,
    hub,
    short_commit,
)


class OverMaxParams(SubmissionRejected):
    """The model has more parameters than the task's max_params: -999, never judged, as the
    network scores it (raised by `check_max_params` alone)."""


def check_max_params(count: int, max_params: int, what: str) -> None:
    """The task's bound on the model's parameter count, the one place it is compared: a full
    model's count from its config before any weight is fetched (here), a LoRA's merged model's
    once loaded (the module). OverMaxParams past it."""
    if count > max_params:
        raise OverMaxParams(f"{what}: {count} parameters, over {max_params} (max_params)")


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
T = TypeVar("T")
# A full model's files besides its weights: its config, and every file transformers reads a
# tokenizer and its chat templates from (data and Jinja, never Python code), as the network's
# validator reads them from the whole repo: a tokenizer given as vocab and merges, a WordPiece
# vocab, a sentencepiece model or versioned files, or chat templates given as JSON or as named
# templates (`tool_use`, chosen for lines with tools), would otherwise not load, or load or
# render otherwise than there (a WordPiece tokenizer without its vocab.txt loads, all [UNK]).
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "chat_template.jinja",
    "chat_template.json",
    # The other files transformers' tokenizer classes name (`vocab_files_names`: a test holds
    # this list to the installed transformers), and those it looks for when a repo has no
    # tokenizer.json (Mistral's and tiktoken's).
    "bpe.codes",
    "byte_maps.json",
    "emoji.json",
    "entity_vocab.json",
    "normalizer.json",
    "prophetnet.tokenizer",
    "sentencepiece.model",
    "spm.model",
    "vocab-src.json",
    "vocab-tgt.json",
    "word_pronunciation.json",
    "word_shape.json",
    "tekken.json",
    "tiktoken.model",
)
# Named templates: additional_chat_templates/<name>.jinja, read by transformers 5; one level,
# plain names (a listing's name never leads out of the download folder).
NAMED_TEMPLATE = re.compile(r"additional_chat_templates/[A-Za-z0-9_-][A-Za-z0-9_.-]*\.jinja")
# Versioned tokenizer files (`fast_tokenizer_files` in tokenizer_config.json: tokenizer.4.0.json;
# Mistral's tokenizer.model.v3)
VERSIONED_TOKENIZER = re.compile(
    r"tokenizer\.[0-9]+(\.[0-9]+)*\.json|tokenizer\.model\.[A-Za-z0-9_-]+"
)
MAX_NAMED_TEMPLATES = 32  # and as many versioned tokenizer files
# Shards a full model's index may name: each is a download in this process (1,000 tiny shards
# take 27 s of its CPU). Released checkpoints have a few to a few dozen, and
# 80 GiB (max_model_total_bytes) in 1 GB shards is 80. With the files above, a submission is at
# most 28 + 2 x 32 + 256 files and an index.
MAX_SHARDS = 256
# A full model's weight files may hold this many bytes a parameter of max_params, no more:
# float32 (the widest dtype checkpoints use) for four times the parameters, room for the weights
# the causal LM leaves out (Qwen3.5's vision model and MTP weights: a fraction of the text
# model in the released checkpoints; the tests' tiny one's files hold 2.4 times its parameters).
# Past it, the files are mostly weights the model never loads, which the network downloads and
# ignores.
MAX_WEIGHT_BYTES_PER_PARAMETER = 16
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl")


@dataclass(frozen=True)
class Submission:
    path: Path
    commit: str
    base_model: str | None  # the supported base a LoRA adapter names; None: a full model
    parameter_count: int | None  # a full model's, as its config builds it (inspection.py)
    # An adapter's `r` and `rank_pattern` as the child read them (validator.kit.ranks_of).
    adapter_ranks: dict[str, Any] | None = None
    # An adapter's tensors (name, dtype, shape) as the child read its safetensors header.
    adapter_tensors: tuple[LoraTensor, ...] | None = None


def fetch_submission(
    repo_id: str,
    revision: str,
    dest: Path,
    supported_bases: list[str],
    max_adapter_bytes: int,
    max_model_bytes: int,
    max_params: int,
) -> Submission:
    """The submission's files in `dest` (never in the shared HF cache), their metadata read by
    the bounded child (inspection.py; its answers and requests live beside `dest`). A full model
    over `max_params` (the causal LM its config describes, counted on the meta device) is
    OverMaxParams before its weights are fetched: it scores -999 unloaded."""
    what = f"submission {repo_id}@{short_commit(revision)}"
    info = hub.model_info(repo_id, what, submission=True, revision=revision, files_metadata=True)
    commit = hub.commit_of(info.sha, what)
    what = f"submission {repo_id}@{short_commit(commit)}"
    sizes = checked_listing(info, what)  # its count, names and sizes, before any download
    work = dest.parent / "inspect"
    try:
        if ADAPTER_CONFIG in sizes:
            return _fetch_adapter(
                repo_id, commit, sizes, dest, supported_bases, max_adapter_bytes, what, work
            )
        return _fetch_full_model(
            repo_id, commit, sizes, dest, max_model_bytes, max_params, what, work
        )
    finally:
        _tidy(dest)


def _fetch_adapter(
    repo_id: str,
    commit: str,
    sizes: dict[str, int | None],
    dest: Path,
    supported_bases: list[str],
    limit: int,
    what: str,
    work: Path,
) -> Submission:
    if ADAPTER_WEIGHTS not in sizes:
        raise SubmissionRejected(
            f"{what}: {ADAPTER_CONFIG} without {ADAPTER_WEIGHTS}{_pickles(sizes)}"
        )
    _check_total({name: sizes[name] for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)}, limit, what)
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        _get(repo_id, commit, name, dest, what, sizes)
    facts = _inspected(lambda: inspect_adapter(dest, ADAPTER_WEIGHTS, work), what)
    # peft re-reads adapter_config.json when it loads the adapter here and builds the type it
    # names; only a LoRA's ranks and tensors are checked against the base before it allocates
    # (a PROMPT_TUNING config's num_virtual_tokens x token_dim is an allocation of any size).
    peft_type = facts.peft_type or "LORA"
    if peft_type.upper() != "LORA":
        raise SubmissionRejected(f"{what}: peft_type {peft_type[:100]!r} is not a LoRA adapter")
    # peft copies one base layer per replicated layer when it loads the adapter here.
    try:
        check_layer_replication(facts.replicated_layers)
    except SubmissionRejected as exc:
        raise SubmissionRejected(f"{what}: {exc}") from exc
    if facts.base_model not in supported_bases:
        raise SubmissionRejected(
            f"{what}: base_model_name_or_path {facts.base_text!r} is not a supported base "
            f"({', '.join(supported_bases)})"
        )
    return Submission(
        dest, commit, facts.base_model, None, facts.ranks(), tuple(facts.weights.listing)
    )


def _fetch_full_model(
    repo_id: str,
    commit: str,
    sizes: dict[str, int | None],
    dest: Path,
    limit: int,
    max_params: int,
    what: str,
    work: Path,
) -> Submission:
    if "config.json" not in sizes:
        raise SubmissionRejected(f"{what}: neither {ADAPTER_CONFIG} nor config.json: not a model")
    # transformers reads model.safetensors when there is one, the index's shards otherwise.
    sharded = "model.safetensors" not in sizes
    if sharded and hub.SAFETENSORS_INDEX not in sizes:
        raise SubmissionRejected(f"{what}: no safetensors weights{_pickles(sizes)}")
    # The metadata first, sized by the listing, read by the child: the config decides the count
    # (the model the network loads and counts, and what transformers would allocate whatever
    # the weights hold; not every tensor of the files: Qwen3.5's own checkpoints also hold a
    # vision model and MTP weights that the causal LM leaves out), the index the shards.
    metadata = ["config.json", "generation_config.json"] + [hub.SAFETENSORS_INDEX] * sharded
    metadata = [name for name in metadata if name in sizes]
    _check_total({name: sizes[name] for name in metadata}, limit, what)
    for name in metadata:
        _get(repo_id, commit, name, dest, what, sizes)
    # The child also checks the download the index plans: how many shards, each one listed.
    facts = _inspected(lambda: inspect_model(dest, work, listed=sizes, max_shards=MAX_SHARDS), what)
    if facts.buffer_count > max_params:
        # The buffers are built here with the model (gpt_neo: a max_position_embeddings**2 mask
        # per layer, 10 GB a layer at 10**5) and no real model's come near its parameters.
        raise SubmissionRejected(
            f"{what}: config.json makes the model's buffers hold {facts.buffer_count} elements, "
            f"over max_params {max_params}"
        )
    check_max_params(facts.parameter_count, max_params, what)
    check_generation_config(facts, what)
    weights = (facts.shards or []) if sharded else ["model.safetensors"]
    _check_weight_budget({name: sizes[name] for name in weights}, max_params, what)
    named = sorted(name for name in sizes if NAMED_TEMPLATE.fullmatch(name))
    versioned = sorted(name for name in sizes if VERSIONED_TOKENIZER.fullmatch(name))
    for found, kind in ((named, "named chat templates"), (versioned, "versioned tokenizers")):
        if len(found) > MAX_NAMED_TEMPLATES:
            raise SubmissionRejected(f"{what}: {len(found)} {kind}, over {MAX_NAMED_TEMPLATES}")
    wanted = [
        name
        for name in dict.fromkeys((*MODEL_FILES, *named, *versioned, *weights))
        if name in sizes and name not in metadata
    ]
    _check_total({name: sizes[name] for name in [*wanted, *metadata]}, limit, what)
    for name in wanted:
        _get(repo_id, commit, name, dest, what, sizes)
    # Before transformers reads them here: the headers, checked in the child.
    headers = _inspected(lambda: inspect_headers(dest, weights, work), what)
    _inspected(lambda: check_against_headers(facts.parameter_count, headers.parameters), what)
    return Submission(dest, commit, None, facts.parameter_count)


def _inspected(call: Callable[[], T], what: str) -> T:
    """`call()`, its rejection named for the submission."""
    try:
        return call()
    except SubmissionRejected as exc:
        raise SubmissionRejected(f"{what}: {exc}") from exc


def _get(
    repo_id: str, commit: str, name: str, dest: Path, what: str, sizes: dict[str, int | None]
) -> Path:
    # The listed size sets the download's overall deadline (validator/kit/hub.py).
    return hub.download(
        repo_id, name, what, submission=True, size=sizes.get(name), revision=commit,
        local_dir=dest, force_download=True,
    )  # fmt: skip


def _check_total(sizes: dict[str, int | None], limit: int, what: str) -> None:
    if any(size is None for size in sizes.values()):
        raise TransientError(f"{what}: the Hub listing has no file sizes")
    total = sum(size for size in sizes.values() if size is not None)
    if total > limit:
        raise SubmissionRejected(f"{what}: the files add up to {total} bytes, over {limit}")


def _check_weight_budget(sizes: dict[str, int | None], max_params: int, what: str) -> None:
    """The weight files against what a model of max_params parameters can need to be stored
    (MAX_WEIGHT_BYTES_PER_PARAMETER), from the listing, before any of them is fetched."""
    total = sum(size or 0 for size in sizes.values())
    budget = MAX_WEIGHT_BYTES_PER_PARAMETER * max(max_params, 0)
    if total > budget:
        raise SubmissionRejected(
            f"{what}: its weight files add up to {total} bytes, over {budget} "
            f"({MAX_WEIGHT_BYTES_PER_PARAMETER} bytes a parameter of max_params {max_params})"
        )


def _pickles(sizes: dict[str, int | None]) -> str:
    pickles = sorted(name for name in sizes if name.endswith(PICKLE_SUFFIXES))
    return f" (pickle weights {', '.join(pickles)} are never loaded)" if pickles else ""


def _tidy(dest: Path) -> None:
    # hf_hub_download keeps its bookkeeping in dest/.cache; only the model's files belong there.
    shutil.rmtree(dest / ".cache", ignore_errors=True)
