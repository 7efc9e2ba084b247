"""Downloads for the lora module from the Hub: submitted adapters and base models.

A submission is hostile (docs/lora-scoring.md, "Untrusted submissions"): we pin the revision we
score to a commit, check the Hub's listing (at most 10,000 files, names inside the repo's
folder, whole sizes: validator/kit/listing.py), fetch only the allow-listed adapter files into
the assignment's work folder (never the shared HF cache), never pickle weights or code, and
check sizes from the listing before any byte is downloaded and again on what was written.
Nothing here parses a downloaded file: modules/lora/reading.py reads them in a bounded child.

Every call goes through validator/kit/hub.py: huggingface_hub with one error translation, and
`HF_ENDPOINT`, `HF_HUB_CACHE`/`HF_HOME` and `HF_TOKEN` read at call time.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from validator.kit import SubmissionRejected, TransientError, checked_listing, hub, short_commit

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
PICKLE_SUFFIXES = (".bin", ".pt", ".pkl", ".pth")


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
    what = f"submission {repo_id}@{short_commit(revision or 'main')}"
    # One listing gives both the commit and its files, so they cannot disagree.
    info = hub.model_info(
        repo_id, what, submission=True, revision=revision or "main", files_metadata=True,
        token=token,
    )  # fmt: skip
    commit = hub.commit_of(info.sha, what)
    what = f"submission {repo_id}@{short_commit(commit)}"
    # Its count, names and sizes, before any download (validator/kit/listing.py).
    sizes = checked_listing(info, what)
    if ADAPTER_CONFIG not in sizes:
        return FetchedSubmission(dest, commit, False, sorted(sizes))
    _check_weight_format(sizes, what)
    listed = {name: size for name in ADAPTER_FILES if (size := sizes[name]) is not None}
    if len(listed) < len(ADAPTER_FILES):  # the Hub always sizes files when asked for blobs
        raise TransientError(f"{what}: the Hub listing has no file sizes")
    _check_sizes(listed, limits, what)

    dest.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name in ADAPTER_FILES:
        # force_download: never reuse a file already in dest (hf_hub_download falls back to one
        # when the Hub is unreachable); revision=commit: what we score is what we recorded.
        paths.append(hub.download(
            repo_id, name, what, submission=True, revision=commit, local_dir=dest, token=token,
            force_download=True, size=listed[name],
        ))  # fmt: skip
        _check_written(paths, limits, what)
    # hf_hub_download keeps its bookkeeping in dest/.cache; only the adapter files belong there.
    shutil.rmtree(dest / ".cache", ignore_errors=True)
    ignored = sorted(set(sizes) - set(ADAPTER_FILES))
    return FetchedSubmission(dest, commit, True, ignored)


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
