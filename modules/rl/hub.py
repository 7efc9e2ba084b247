"""The policy's download: `model_filename`, and `model_filename + ".data"` when the repo has it,
pinned to the commit the revision resolves to, within size limits (docs/rl-scoring.md)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from validator.kit import SubmissionRejected, TransientError, checked_listing, hub, short_commit


@dataclass(frozen=True)
class FetchedPolicy:
    folder: Path  # holds the policy's files and nothing else
    model: Path
    external_data: Path | None
    commit: str


def fetch_policy(
    repo_id: str,
    revision: str,
    model_filename: str,
    dest: Path,
    max_model_bytes: int,
    max_data_bytes: int,
) -> FetchedPolicy:
    """Download the policy's one or two files into `dest`; the Hub's listing is checked
    (validator/kit/listing.py) and the files' sizes taken from it before any byte is fetched,
    and checked again on disk."""
    what = f"submission {repo_id}@{short_commit(revision)}"
    info = hub.model_info(repo_id, what, submission=True, revision=revision, files_metadata=True)
    commit = hub.commit_of(info.sha, what)
    what = f"submission {repo_id}@{short_commit(commit)}"
    # Its count, names and sizes, before any download (validator/kit/listing.py).
    sizes = checked_listing(info, what)
    data_filename = model_filename + ".data"
    if model_filename not in sizes:
        onnx_files = sorted(name for name in sizes if name.endswith(".onnx"))
        raise SubmissionRejected(
            f"{what}: {model_filename} is not in the repo (its .onnx files: "
            f"{', '.join(onnx_files) or 'none'})"
        )
    wanted = {model_filename: max_model_bytes}
    if data_filename in sizes:
        wanted[data_filename] = max_data_bytes
    for name, limit in wanted.items():
        size = sizes[name]
        if size is None:
            raise TransientError(f"{what}: the Hub listing has no size for {name}")
        _check_size(name, size, limit, what)
    dest.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, limit in wanted.items():
        # force_download: never a stale file from an earlier run; revision=commit: what is
        # scored is what was logged.
        path = hub.download(
            repo_id, name, what, submission=True, revision=commit, local_dir=dest,
            force_download=True, size=sizes[name],
        )  # fmt: skip
        _check_size(name, path.stat().st_size, limit, what, path)
        paths[name] = path
    # hf_hub_download keeps its bookkeeping in dest/.cache; only the policy's files belong there.
    shutil.rmtree(dest / ".cache", ignore_errors=True)
    return FetchedPolicy(dest, paths[model_filename], paths.get(data_filename), commit)


def _check_size(name: str, size: int, limit: int, what: str, path: Path | None = None) -> None:
    if size > limit:
        if path is not None:
            path.unlink(missing_ok=True)
        raise SubmissionRejected(f"{what}: {name} is {size} bytes, over the limit of {limit}")
