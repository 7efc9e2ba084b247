"""Downloads for the lora module from the Hub: submitted adapters and base models.

A submission is hostile (docs/lora-scoring.md, "Untrusted submissions"): we pin the revision we
score to a commit, fetch only the allow-listed adapter files, never pickle weights or code, and
check sizes from the Hub's listing before any byte is downloaded and again on what was written.

Every call goes through validator/hub.py: huggingface_hub with one error translation, and
`HF_ENDPOINT`, `HF_HUB_CACHE`/`HF_HOME` and `HF_TOKEN` read at call time.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from huggingface_hub import snapshot_download

from validator.errors import RecoverableException, SubmissionRejected, TransientError
from validator.hub import (
    cache_dir,
    commit_of,
    download,
    endpoint,
    file_sizes,
    hub_call,
    model_info,
)
from validator.safe_json import JsonRefused, loads_bounded

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
# Real adapter configs are about 1 KiB; a larger one is an attack on the journal and logs.
MAX_CONFIG_BYTES = 1024 * 1024
PICKLE_SUFFIXES = (".bin", ".pt", ".pkl", ".pth")
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Everything a base model needs besides its weights; weights are picked from the listing.
BASE_MODEL_FILES = tuple(
    "config.json generation_config.json tokenizer.json tokenizer_config.json tokenizer.model"
    " special_tokens_map.json added_tokens.json vocab.json vocab.txt merges.txt".split()
)


@dataclass
class DownloadLimits:
    max_file_bytes: int
    max_total_bytes: int
    max_validation_set_bytes: int


@dataclass
class FetchedSubmission:
    path: Path
    commit: str
    is_lora: bool
    adapter_config: dict[str, Any] | None
    ignored_files: list[str] = field(default_factory=list)


# -- submissions ------------------------------------------------------------------------------


def fetch_adapter(
    repo_id: str,
    revision: str | None,
    dest: Path,
    limits: DownloadLimits,
    token: str | None = None,
) -> FetchedSubmission:
    """Download a submitted adapter's allow-listed files, pinned to the commit it resolves to.

    A repo without adapter_config.json is a full model: nothing is downloaded and the caller
    decides (the default policy fails it).
    """
    what = f"submission {repo_id}@{revision or 'main'}"
    # One listing gives both the commit and its files, so they cannot disagree.
    info = model_info(
        repo_id, what, submission=True, revision=revision or "main", files_metadata=True,
        token=token,
    )  # fmt: skip
    commit = commit_of(info.sha, what)
    what = f"submission {repo_id}@{commit}"
    sizes = file_sizes(info)
    if ADAPTER_CONFIG not in sizes:
        return FetchedSubmission(dest, commit, False, None, sorted(sizes))
    _check_weight_format(sizes, what)
    listed = {name: sizes[name] for name in ADAPTER_FILES}
    if None in listed.values():  # the Hub always sizes files when asked for blobs
        raise TransientError(f"{what}: the Hub listing has no file sizes")
    _check_sizes(listed, limits, what)  # type: ignore[arg-type]

    dest.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    config: dict[str, Any] = {}
    for name in ADAPTER_FILES:  # the config first: no weights are fetched for a broken one
        # force_download: never reuse a file already in dest (hf_hub_download falls back to one
        # when the Hub is unreachable); revision=commit: what we score is what we recorded.
        paths.append(download(
            repo_id, name, what, submission=True, revision=commit, local_dir=dest, token=token,
            force_download=True,
        ))  # fmt: skip
        _check_written(paths, limits, what)
        if name == ADAPTER_CONFIG:
            config = _read_adapter_config(paths[0], what)
    # hf_hub_download keeps its bookkeeping in dest/.cache; only the adapter files belong there.
    shutil.rmtree(dest / ".cache", ignore_errors=True)
    ignored = sorted(set(sizes) - set(ADAPTER_FILES))
    return FetchedSubmission(dest, commit, True, config, ignored)


def _check_weight_format(sizes: dict[str, int | None], what: str) -> None:
    if ADAPTER_WEIGHTS in sizes:
        return
    pickles = sorted(name for name in sizes if name.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise SubmissionRejected(
            f"{what}: adapter weights are only in pickle format ({', '.join(pickles)}); "
            f"pickle files are never loaded, upload {ADAPTER_WEIGHTS} instead"
        )
    raise SubmissionRejected(f"{what}: {ADAPTER_CONFIG} is present but {ADAPTER_WEIGHTS} is not")


def _check_sizes(sizes: dict[str, int], limits: DownloadLimits, what: str) -> None:
    for name, size in sizes.items():
        if size > limits.max_file_bytes:
            raise SubmissionRejected(
                f"{what}: {name} is {size} bytes, over the limit of {limits.max_file_bytes} "
                "bytes per file"
            )
    total = sum(sizes.values())
    if total > limits.max_total_bytes:
        raise SubmissionRejected(
            f"{what}: the adapter files add up to {total} bytes, over the limit of "
            f"{limits.max_total_bytes} bytes"
        )


def _check_written(paths: list[Path], limits: DownloadLimits, what: str) -> None:
    """The same limits on the bytes on disk: the listing is not the last word."""
    try:
        _check_sizes({p.name: p.stat().st_size for p in paths}, limits, what)
    except SubmissionRejected:
        for path in paths:
            path.unlink(missing_ok=True)
        raise


def _read_adapter_config(path: Path, what: str) -> dict[str, Any]:
    try:
        config = loads_bounded(
            path.read_bytes(), f"{what}: {ADAPTER_CONFIG}", max_bytes=MAX_CONFIG_BYTES
        )
    except JsonRefused as err:
        raise SubmissionRejected(str(err)) from err
    if not isinstance(config, dict):
        raise SubmissionRejected(
            f"{what}: {ADAPTER_CONFIG} must be a JSON object, got {type(config).__name__}"
        )
    return config


# -- base models ------------------------------------------------------------------------------


def fetch_base_model(repo_id: str, token: str | None = None) -> Path:
    """A local snapshot of a (trusted) base model through the normal HF cache.

    Only config, tokenizer and safetensors weights are fetched; when the repo has a shard index,
    only the shards it names (some repos also carry a consolidated copy of the weights).
    """
    what = f"base model {repo_id}"
    try:
        info = model_info(repo_id, what, submission=False, token=token)
    except TransientError:
        cached = _cached_snapshot(repo_id)
        if cached is None:
            raise
        log.warning("%s: the Hub is unreachable, using the cached snapshot %s", what, cached)
        return cached
    commit = commit_of(info.sha, what)
    files = {s.rfilename for s in info.siblings or []}
    weights = _base_weight_files(repo_id, commit, files, token, what)
    patterns = [name for name in BASE_MODEL_FILES if name in files] + weights
    call = partial(
        snapshot_download, repo_id, allow_patterns=patterns, cache_dir=cache_dir(),
        endpoint=endpoint(), token=token,
    )  # fmt: skip
    path = Path(hub_call(call, what, submission=False))
    if not (path / "config.json").is_file():
        raise RecoverableException(f"{what}: the snapshot at {path} has no config.json")
    return path


def _base_weight_files(
    repo_id: str, commit: str, files: set[str], token: str | None, what: str
) -> list[str]:
    if SAFETENSORS_INDEX in files:
        index_path = download(
            repo_id, SAFETENSORS_INDEX, what, submission=False, revision=commit,
            cache_dir=cache_dir(), token=token,
        )  # fmt: skip
        weight_map = json.loads(Path(index_path).read_text()).get("weight_map", {})
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if s not in files or not s.endswith(".safetensors")]
        if not shards or missing:
            raise RecoverableException(
                f"{what}: {SAFETENSORS_INDEX} names missing shards {missing}"
            )
        return [SAFETENSORS_INDEX, *shards]
    if "model.safetensors" in files:
        return ["model.safetensors"]
    raise RecoverableException(
        f"{what}: no safetensors weights (model.safetensors or {SAFETENSORS_INDEX}); "
        "pickle weights are never loaded"
    )


def _cached_snapshot(repo_id: str) -> Path | None:
    try:
        path = snapshot_download(repo_id, cache_dir=cache_dir(), local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure just means "not cached"
        return None
    return Path(path) if (Path(path) / "config.json").is_file() else None
