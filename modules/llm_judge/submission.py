"""The submitted model: a LoRA adapter on a supported base, or a full model, fetched pinned to
the commit its revision resolves to (also for full models, which upstream fetches at `main`),
only the files needed, safetensors only, never remote code, within size caps
(docs/llm-judge-scoring.md, "The submission")."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from modules.llm_judge.file_checks import check_generation_config, check_model_config
from modules.llm_judge.param_count import check_against_headers, config_parameter_count
from validator.kit import JsonRefused, SubmissionRejected, TransientError, hub, loads_bounded

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_JSON_BYTES = 1024 * 1024
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
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl")


@dataclass(frozen=True)
class Submission:
    path: Path
    commit: str
    base_model: str | None  # the supported base a LoRA adapter names; None: a full model
    parameter_count: int | None  # a full model's, as its config builds it (param_count.py)


def fetch_submission(
    repo_id: str,
    revision: str,
    dest: Path,
    supported_bases: list[str],
    max_adapter_bytes: int,
    max_model_bytes: int,
    max_params: int,
) -> Submission:
    """The submission's files in `dest`. A full model over `max_params` (the causal LM its
    config describes, counted on the meta device) comes back without its weights: it scores
    -999 unloaded."""
    what = f"submission {repo_id}@{revision}"
    info = hub.model_info(repo_id, what, submission=True, revision=revision, files_metadata=True)
    commit = hub.commit_of(info.sha, what)
    what = f"submission {repo_id}@{commit}"
    sizes = hub.file_sizes(info)
    if ADAPTER_CONFIG in sizes:
        return _fetch_adapter(
            repo_id, commit, sizes, dest, supported_bases, max_adapter_bytes, what
        )
    return _fetch_full_model(repo_id, commit, sizes, dest, max_model_bytes, max_params, what)


def _fetch_adapter(repo_id, commit, sizes, dest, supported_bases, limit, what) -> Submission:
    if ADAPTER_WEIGHTS not in sizes:
        raise SubmissionRejected(
            f"{what}: {ADAPTER_CONFIG} without {ADAPTER_WEIGHTS}{_pickles(sizes)}"
        )
    _check_total({name: sizes[name] for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)}, limit, what)
    config_path = _get(repo_id, commit, ADAPTER_CONFIG, dest, what, sizes)
    config = _read_json(config_path, what)
    base = config.get("base_model_name_or_path")
    if base not in supported_bases:
        raise SubmissionRejected(
            f"{what}: base_model_name_or_path {str(base)[:200]!r} is not a supported base "
            f"({', '.join(supported_bases)})"
        )
    _get(repo_id, commit, ADAPTER_WEIGHTS, dest, what, sizes)
    _tidy(dest)
    return Submission(dest, commit, base, None)


def _fetch_full_model(repo_id, commit, sizes, dest, limit, max_params, what) -> Submission:
    if "config.json" not in sizes:
        raise SubmissionRejected(f"{what}: neither {ADAPTER_CONFIG} nor config.json: not a model")
    if "model.safetensors" not in sizes and hub.SAFETENSORS_INDEX not in sizes:
        raise SubmissionRejected(f"{what}: no safetensors weights{_pickles(sizes)}")
    config_path = _get(repo_id, commit, "config.json", dest, what, sizes)
    _check_architecture(config_path, what)
    # The safetensors headers, before any weight is downloaded (a header the library refuses,
    # e.g. over 25 MB, rejects the submission: hub.py).
    metadata, in_files = _safetensors_metadata(repo_id, commit, what)
    # The count that decides is the model's the config describes, which is what the network
    # loads and counts (not every tensor of the files: Qwen3.5's own checkpoints also hold a
    # vision model and MTP weights that the causal LM leaves out), and what transformers would
    # allocate whatever the weights hold: built on the meta device, in a bounded child.
    try:
        count = config_parameter_count(dest, dest.parent / "param-count")
        if count > max_params:
            _tidy(dest)
            return Submission(dest, commit, None, count)
        check_against_headers(count, in_files)
    except SubmissionRejected as exc:
        raise SubmissionRejected(f"{what}: {exc}") from exc
    weights = (
        sorted(set(metadata.weight_map.values())) if metadata.sharded else ["model.safetensors"]
    )
    named = sorted(name for name in sizes if NAMED_TEMPLATE.fullmatch(name))
    versioned = sorted(name for name in sizes if VERSIONED_TOKENIZER.fullmatch(name))
    for found, kind in ((named, "named chat templates"), (versioned, "versioned tokenizers")):
        if len(found) > MAX_NAMED_TEMPLATES:
            raise SubmissionRejected(f"{what}: {len(found)} {kind}, over {MAX_NAMED_TEMPLATES}")
    wanted = [
        name
        for name in (*MODEL_FILES, *named, *versioned, *weights)
        if name in sizes and name != "config.json"
    ]
    if metadata.sharded:
        wanted.append(hub.SAFETENSORS_INDEX)
    _check_total({name: sizes[name] for name in [*wanted, "config.json"]}, limit, what)
    for name in wanted:
        _get(repo_id, commit, name, dest, what, sizes)
    _tidy(dest)
    check_generation_config(dest, what)
    return Submission(dest, commit, None, count)


def _safetensors_metadata(repo_id: str, commit: str, what: str) -> tuple[Any, int]:
    """The weights' index and headers as huggingface_hub reads them, and the parameters they
    hold (every tensor). Its reader trusts their shapes: an index whose weight_map is a list, a
    header that is a list or an entry with text for a shape raise TypeError or AttributeError
    inside it (the module-bug path, before)."""
    try:
        metadata = hub.hub_call(
            lambda: hub.api().get_safetensors_metadata(repo_id, revision=commit),
            what,
            submission=True,
        )
        files = metadata.weight_map.values() if metadata.sharded else []
        if not all(isinstance(name, str) for name in files):
            raise TypeError("a weight_map value is not a file name")
        in_files = sum(metadata.parameter_count.values())
    except (TypeError, AttributeError, KeyError, UnicodeDecodeError) as exc:
        raise SubmissionRejected(
            f"{what}: its safetensors index or headers do not parse "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    return metadata, in_files


def _check_architecture(config_path: Path, what: str) -> None:
    """Only models transformers implements itself: a config that asks for remote code
    (`auto_map`) is refused. (`architectures` is not read: the causal LM is chosen by the
    config's `model_type`, as the network loads it, whatever names the list gives or lacks.)"""
    config = _read_json(config_path, what)
    if "auto_map" in config:
        raise SubmissionRejected(f"{what}: config.json asks for remote code (auto_map); never run")
    check_model_config(config, what)
    try:
        AutoConfig.from_pretrained(str(config_path.parent), trust_remote_code=False)
    except Exception as exc:  # the submission's data: whatever transformers raises on it
        raise SubmissionRejected(
            f"{what}: config.json cannot be read: {type(exc).__name__}: {str(exc)[:300]}"
        ) from exc


def _get(
    repo_id: str, commit: str, name: str, dest: Path, what: str, sizes: dict[str, int | None]
) -> Path:
    # The listed size sets the download's overall deadline (validator/kit/hub.py).
    return hub.download(
        repo_id, name, what, submission=True, size=sizes.get(name), revision=commit,
        local_dir=dest, force_download=True,
    )  # fmt: skip


def _read_json(path: Path, what: str) -> dict:
    try:
        data = loads_bounded(path.read_bytes(), f"{what}: {path.name}", max_bytes=MAX_JSON_BYTES)
    except JsonRefused as exc:
        raise SubmissionRejected(str(exc)) from exc
    if not isinstance(data, dict):
        raise SubmissionRejected(f"{what}: {path.name} must be a JSON object")
    return data


def _check_total(sizes: dict[str, int | None], limit: int, what: str) -> None:
    if any(size is None for size in sizes.values()):
        raise TransientError(f"{what}: the Hub listing has no file sizes")
    total = sum(size for size in sizes.values() if size is not None)
    if total > limit:
        raise SubmissionRejected(f"{what}: the files add up to {total} bytes, over {limit}")


def _pickles(sizes: dict[str, int | None]) -> str:
    pickles = sorted(name for name in sizes if name.endswith(PICKLE_SUFFIXES))
    return f" (pickle weights {', '.join(pickles)} are never loaded)" if pickles else ""


def _tidy(dest: Path) -> None:
    # hf_hub_download keeps its bookkeeping in dest/.cache; only the model's files belong there.
    shutil.rmtree(dest / ".cache", ignore_errors=True)
