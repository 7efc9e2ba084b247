"""Runs a policy in modules/rl/sandbox.py, a child process the validator can always stop: the
policy is hostile, and onnxruntime can neither be interrupted inside one operator nor bounded in
memory from within (docs/rl-scoring.md, "Running the policy")."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from validator.kit import (
    ChildLimits,
    ChildOutcome,
    SubmissionRejected,
    loads_bounded,
    read_child_file,
    run_child,
    write_new,
)

log = logging.getLogger(__name__)

SANDBOX = Path(__file__).with_name("sandbox.py")
MAX_RESULT_BYTES = 64 * 1024
# An .npy header is at most this long (numpy pads it to a multiple of 64; version 1 up to 64 KiB).
ACTIONS_HEADER_BYTES = 64 * 1024
# Imported by the child's server before its limits are armed (validator/sandbox/child_process.py).
# Not onnxruntime: its import starts a thread, and a server with threads cannot fork; it is
# imported in the child, under the memory limit, as when the sandbox armed the limit itself.
PRELOAD = ("numpy",)


class PolicyResult(BaseModel):
    """What sandbox.py writes to its result file: the rows it ran, or why the policy does not
    fit. Read as untrusted (the child ran the policy): bounded, and nothing else accepted."""

    model_config = ConfigDict(extra="forbid", strict=True)

    rows: int | None = Field(None, ge=0)
    rejected: str | None = None


def run_policy(
    model: Path,
    features: np.ndarray,
    venues: int,
    batch_size: int,
    limits: ChildLimits,
    work: Path,
    threads: int = 1,
) -> np.ndarray:
    """The policy's actions for every row, float32 (rows, venues), run in a child under
    `limits` (its wall clock and memory; `threads` intra-op threads); raises SubmissionRejected
    when the policy does not fit, fails, or runs over a limit."""
    work.mkdir(parents=True, exist_ok=True)
    paths = {
        "features": work / "features.npy",
        "actions": work / "actions.npy",
        "result": work / "result.json",
        "request": work / "request.json",
    }
    # The work folder is the child's: never written or read through what it may plant there
    # (validator/sandbox/child_files.py).
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(features, dtype=np.float32))
    write_new(paths["features"], buffer.getvalue())
    request = {
        "model": str(model),
        "threads": threads,
        "venues": venues,
        "batch_size": batch_size,
        **{name: str(paths[name]) for name in ("features", "actions", "result")},
    }
    write_new(paths["request"], json.dumps(request).encode())
    _run_sandbox(paths["request"], limits, threads, work)
    result = _read_result(paths["result"])
    if result.rejected is not None:
        raise SubmissionRejected(result.rejected[:1000])
    expected = ACTIONS_HEADER_BYTES + 4 * features.shape[0] * venues
    try:
        data = read_child_file(paths["actions"], expected)
        actions = np.load(io.BytesIO(data), allow_pickle=False)
    except FileNotFoundError:
        raise RuntimeError("the policy sandbox left no actions") from None
    if actions.dtype != np.float32 or actions.shape != (features.shape[0], venues):
        raise RuntimeError(f"the sandbox returned {actions.dtype} {actions.shape}")
    return actions


def _run_sandbox(request: Path, limits: ChildLimits, threads: int, work: Path) -> None:
    # validator/sandbox/child_process.py: `python -I`, no secret in the environment (no
    # FLOCK_API_KEY, no HF_TOKEN), its own process group, killed with the validator, swept after a
    # kill, and every limit armed there (the sandbox arms none of its own).
    result = run_child(
        SANDBOX,
        [str(request)],
        cwd=work,
        limits=limits,
        env={"OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": "1"},
        preload=PRELOAD,
    )
    if result.outcome is ChildOutcome.OK:
        return
    if result.outcome is ChildOutcome.OVER_TIME:
        raise SubmissionRejected(
            f"the policy did not finish within {limits.wall_seconds:g} s (inference_seconds); "
            "stopped"
        )
    tail = result.stderr_tail
    if result.outcome is ChildOutcome.OVER_MEMORY or result.exit_code < 0:
        # Killed by a signal (the kernel's OOM killer, an allocation past the limit) or out
        # of memory: the policy's doing, since the features alone fit easily.
        raise SubmissionRejected(
            f"the policy's process ended abnormally (exit {result.exit_code}), most likely "
            f"over its memory limit of {limits.memory_bytes} bytes: {tail.strip()[-300:]}"
        )
    raise RuntimeError(f"the policy sandbox failed (exit {result.exit_code}): {tail}")


def _read_result(path: Path) -> PolicyResult:
    """The child's result; SubmissionRejected for one that is not a PolicyResult (the policy's
    doing: honest code writes one), RuntimeError for none at all."""
    try:
        data = read_child_file(path, MAX_RESULT_BYTES)
    except FileNotFoundError:
        raise RuntimeError(f"the policy sandbox left no result in {path}") from None
    try:
        return PolicyResult.model_validate(loads_bounded(data, "the policy sandbox's result"))
    except ValueError as exc:  # JsonRefused, pydantic's ValidationError
        raise SubmissionRejected(f"the policy sandbox's result is not one: {exc}"[:500]) from exc
