"""Downloads for the lora module from the Hub: submitted adapters and base models.

A submission is hostile (docs/lora-scoring.md, "Untrusted submissions"): we pin the revision we
score to a commit, fetch only the allow-listed adapter files, never pickle weights or code, and
check sizes from the Hub's listing before any byte is downloaded and again on what was written.

Everything goes through `huggingface_hub`, so `HF_ENDPOINT`, `HF_HUB_CACHE`/`HF_HOME` and
`HF_TOKEN` work. huggingface_hub reads the first two into constants when it is imported, so we
read them again on every call and pass them explicitly (`endpoint=`, `cache_dir=`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import requests
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub import errors as hf
from huggingface_hub.hf_api import ModelInfo

from validator.errors import (
    RecoverableException,
    SubmissionRejected,
    TransientError,
    exception_chain,
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
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# Statuses that say "try again later" rather than "this request is wrong".
TRANSIENT_STATUSES = frozenset({408, 425, 429})

T = TypeVar("T")


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


# -- configuration read at call time ----------------------------------------------------------


def _endpoint() -> str | None:
    value = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return value or None


def _cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None  # the library's own default


def _api() -> HfApi:
    return HfApi(endpoint=_endpoint())


# -- error translation ------------------------------------------------------------------------


def _classify(exc: BaseException, what: str, submission: bool) -> Exception | None:
    """The project exception for a failed hub call, or None when it is not a hub problem."""
    # Private/gated/missing is the submitter's doing; for a base model it is the operator's.
    blame: type[Exception] = SubmissionRejected if submission else RecoverableException
    hint = "" if submission else " Check the repo id, and that HF_TOKEN has been granted access."
    for err in exception_chain(exc):
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return RecoverableException(f"no disk space left while downloading {what}: {err}")
        if isinstance(err, hf.HFValidationError):
            return blame(f"{what}: invalid repo id or revision: {err}")
        if isinstance(err, hf.RevisionNotFoundError):
            return blame(f"{what}: revision not found on the Hub.{hint}")
        if isinstance(err, hf.GatedRepoError):
            return blame(f"{what}: repo is gated and our HF_TOKEN has no access to it.{hint}")
        if isinstance(err, hf.RepositoryNotFoundError):
            return blame(f"{what}: repo not found (or private) on the Hub.{hint}")
        if isinstance(err, hf.LocalEntryNotFoundError):
            continue  # a network failure or 5xx wrapped by the library; its cause says which
        if isinstance(err, hf.EntryNotFoundError):
            return blame(f"{what}: file listed by the Hub is missing at that commit")
        response = getattr(err, "response", None)
        if isinstance(err, requests.HTTPError) and response is not None:
            return _classify_status(response, what, blame, hint)
        if isinstance(err, (requests.ConnectionError, requests.Timeout, hf.FileMetadataError)):
            return TransientError(f"{what}: could not reach the Hub: {err}")
    if any(isinstance(err, hf.LocalEntryNotFoundError) for err in exception_chain(exc)):
        return TransientError(f"{what}: could not reach the Hub: {exc}")
    return None


def _classify_status(
    response: requests.Response, what: str, blame: type[Exception], hint: str
) -> Exception:
    status = response.status_code
    if status >= 500 or status in TRANSIENT_STATUSES:
        return TransientError(f"{what}: the Hub answered HTTP {status}")
    message = response.headers.get("X-Error-Message", "")
    if status in (401, 403) and "Invalid credentials" in message:
        return RecoverableException(f"{what}: the Hub refused HF_TOKEN (HTTP {status})")
    return blame(f"{what}: the Hub answered HTTP {status}.{hint}")


def _hub_call(call: Callable[[], T], what: str, *, submission: bool) -> T:
    try:
        return call()
    except Exception as exc:
        translated = _classify(exc, what, submission)
        if translated is None:
            raise
        raise translated from exc


def _model_info(repo_id: str, what: str, *, submission: bool, **kwargs: Any) -> ModelInfo:
    call = partial(_api().model_info, repo_id, **kwargs)
    return _hub_call(call, what, submission=submission)


def _download(repo_id: str, name: str, what: str, *, submission: bool, **kwargs: Any) -> Path:
    call = partial(hf_hub_download, repo_id, name, endpoint=_endpoint(), **kwargs)
    return Path(_hub_call(call, what, submission=submission))


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
    info = _model_info(
        repo_id, what, submission=True, revision=revision or "main", files_metadata=True,
        token=token,
    )  # fmt: skip
    commit = _commit_of(info.sha, what)
    what = f"submission {repo_id}@{commit}"
    sizes = {s.rfilename: (s.lfs.size if s.lfs else s.size) for s in info.siblings or []}
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
        paths.append(_download(
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


def _commit_of(sha: str | None, what: str) -> str:
    if sha is None or not COMMIT_RE.match(sha):
        raise TransientError(f"{what}: the Hub did not return a commit sha (got {sha!r})")
    return sha


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
        info = _model_info(repo_id, what, submission=False, token=token)
    except TransientError:
        cached = _cached_snapshot(repo_id)
        if cached is None:
            raise
        log.warning("%s: the Hub is unreachable, using the cached snapshot %s", what, cached)
        return cached
    commit = _commit_of(info.sha, what)
    files = {s.rfilename for s in info.siblings or []}
    weights = _base_weight_files(repo_id, commit, files, token, what)
    patterns = [name for name in BASE_MODEL_FILES if name in files] + weights
    call = partial(
        snapshot_download, repo_id, allow_patterns=patterns, cache_dir=_cache_dir(),
        endpoint=_endpoint(), token=token,
    )  # fmt: skip
    path = Path(_hub_call(call, what, submission=False))
    if not (path / "config.json").is_file():
        raise RecoverableException(f"{what}: the snapshot at {path} has no config.json")
    return path


def _base_weight_files(
    repo_id: str, commit: str, files: set[str], token: str | None, what: str
) -> list[str]:
    if SAFETENSORS_INDEX in files:
        index_path = _download(
            repo_id, SAFETENSORS_INDEX, what, submission=False, revision=commit,
            cache_dir=_cache_dir(), token=token,
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
        path = snapshot_download(repo_id, cache_dir=_cache_dir(), local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure just means "not cached"
        return None
    return Path(path) if (Path(path) / "config.json").is_file() else None
