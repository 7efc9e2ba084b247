"""A base model's files (trusted: the operator's supported list) through the kit's hub
(validator/kit/hub.py) into the shared HF cache, marked in use there while a scoring needs them
(validator/outbound/hf_cache.py)."""

from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from pathlib import Path

from huggingface_hub import constants, snapshot_download

from validator.errors import JsonRefused, OperatorError, TransientError
from validator.kit.hub import (
    SAFETENSORS_INDEX,
    cache_dir,
    commit_of,
    download,
    file_sizes,
    model_info,
)
from validator.kit.progress import watch_bytes
from validator.outbound import hf_cache
from validator.outbound.answer_caps import ANSWER_CAPS
from validator.outbound.bounded_reader import parse
from validator.scope import held_until_scored

log = logging.getLogger(__name__)

# Everything a base model needs besides its weights; weights are picked from the listing.
BASE_MODEL_FILES = tuple(
    "config.json generation_config.json tokenizer.json tokenizer_config.json tokenizer.model"
    " special_tokens_map.json added_tokens.json vocab.json vocab.txt merges.txt"
    " chat_template.jinja".split()
)


def fetch_base_model(repo_id: str, token: str | None = None) -> Path:
    """A local snapshot of a (trusted) base model through the normal HF cache.

    Only config, tokenizer and safetensors weights are fetched; when the repo has a shard index,
    only the shards it names (some repos also carry a consolidated copy of the weights).

    The base is marked in use in the cache (validator/outbound/hf_cache.py) from before it is read
    until the scoring in progress ends (outside a run: until this returns), so that no worker
    sharing the cache evicts it meanwhile. With a cache budget (VALIDATOR_HF_CACHE_MAX_GB), the
    least recently used bases not in use are evicted to make room for it, and again after.
    """
    cache = Path(cache_dir() or constants.HF_HUB_CACHE)
    budget = hf_cache.budget_bytes()
    with ExitStack() as until_fetched:
        holder = held_until_scored() or until_fetched
        holder.enter_context(hf_cache.base_in_use(cache, repo_id))
        return _fetch_base_model(repo_id, token, cache, budget)


def _fetch_base_model(repo_id: str, token: str | None, cache: Path, budget: int | None) -> Path:
    what = f"base model {repo_id}"
    try:
        info = model_info(repo_id, what, submission=False, token=token, files_metadata=True)
    except TransientError:
        cached = _cached_snapshot(repo_id)
        if cached is None:
            raise
        log.warning("%s: the Hub is unreachable, using the cached snapshot %s", what, cached)
        return cached
    commit = commit_of(info.sha, what)
    sizes = file_sizes(info)
    weights = _base_weight_files(repo_id, commit, sizes, token, what)
    names = [name for name in BASE_MODEL_FILES if name in sizes] + weights
    _all_sized(sizes, names, what)
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    room = sum(sizes.get(n) or 0 for n in names if not (snapshot / n).exists())
    if budget is not None:
        hf_cache.evict(cache, budget, room, warn=False)  # the warning, if any, comes after
    with watch_bytes(folder, f"downloading {what}", total=room):
        # One file at a time in this thread, not in snapshot_download's worker threads: an
        # overall deadline covers the connections of the thread it runs in.
        for name in names:
            download(
                repo_id, name, what, submission=False, size=sizes.get(name), revision=commit,
                cache_dir=cache_dir(), token=token,
            )  # fmt: skip
    # The ref that snapshot_download writes for `main`, which the cached fallback reads; written
    # whole (a rename), as another worker sharing the cache may be reading it.
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    partial_ref = folder / "refs" / f".main.{os.getpid()}"
    partial_ref.write_text(commit)
    partial_ref.replace(folder / "refs" / "main")
    path = folder / "snapshots" / commit
    if not (path / "config.json").is_file():
        raise OperatorError(f"{what}: the snapshot at {path} has no config.json")
    if budget is not None:
        hf_cache.evict(cache, budget)
    return path


def _base_weight_files(
    repo_id: str, commit: str, sizes: dict[str, int | None], token: str | None, what: str
) -> list[str]:
    files = set(sizes)
    if SAFETENSORS_INDEX in files:
        _all_sized(sizes, [SAFETENSORS_INDEX], what)
        index_path = download(
            repo_id, SAFETENSORS_INDEX, what, submission=False, revision=commit,
            cache_dir=cache_dir(), token=token, size=sizes.get(SAFETENSORS_INDEX),
        )  # fmt: skip
        weight_map = _weight_map(Path(index_path), what)
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if s not in files or not s.endswith(".safetensors")]
        if not shards or missing:
            raise OperatorError(f"{what}: {SAFETENSORS_INDEX} names missing shards {missing}")
        return [SAFETENSORS_INDEX, *shards]
    if "model.safetensors" in files:
        return ["model.safetensors"]
    raise OperatorError(
        f"{what}: no safetensors weights (model.safetensors or {SAFETENSORS_INDEX}); "
        "pickle weights are never loaded"
    )


def _all_sized(sizes: dict[str, int | None], names: list[str], what: str) -> None:
    """A base's files are read within their listed sizes, as a submission's: one the listing
    gives no size for is not asked for (read uncapped, a 2 MiB gzip answer writes 2 GiB into
    the HF cache). The Hub sizes every file when asked for blobs: transient."""
    unsized = [name for name in names if sizes.get(name) is None]
    if unsized:
        raise TransientError(f"{what}: the Hub listing has no size for {', '.join(unsized)}")


def _weight_map(path: Path, what: str) -> dict:
    """The index's tensor -> shard map, decoded within the listing's cap (the index lists the
    shards); an index past it, or not JSON, is the operator's to look at."""
    cap = ANSWER_CAPS["hub.listing"]
    try:
        with path.open("rb") as f:
            data = f.read(cap.max_bytes + 1)
        index = parse(data, cap, f"{what}: {SAFETENSORS_INDEX}")
    except (OSError, JsonRefused) as exc:
        raise OperatorError(f"{what}: {SAFETENSORS_INDEX} cannot be read: {exc}") from exc
    weight_map = index.get("weight_map", {}) if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise OperatorError(f"{what}: {SAFETENSORS_INDEX} has no weight_map object")
    return weight_map


def _cached_snapshot(repo_id: str) -> Path | None:
    try:
        path = snapshot_download(repo_id, cache_dir=cache_dir(), local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure just means "not cached"
        return None
    return Path(path) if (Path(path) / "config.json").is_file() else None
