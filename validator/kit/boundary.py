"""The trust boundary (DESIGN.md): a submission's files are parsed only in a bounded child, never
in the validator's own process. For modules: `inspect_in_child(SCRIPT, request, work=...,
what=..., answer=Model)` runs a standalone script on a request file and returns its answer,
bounded and validated whole by `Model`; `{"error": ...}` or a limit met is SubmissionRejected,
the script's own traceback RuntimeError (docs/internals.md, "The trust boundary").
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from validator.errors import JsonRefused, SubmissionRejected
from validator.outbound.safe_json import loads_bounded
from validator.sandbox.child_files import ChildFileRefused, discard, read_child_file, write_new
from validator.sandbox.child_process import ChildLimits, ChildOutcome, run_child
from validator.text import one_line

log = logging.getLogger(__name__)

A = TypeVar("A", bound=BaseModel)

# What reading a submission's metadata may take: a real config, index, header or ONNX graph is
# read in well under a second and tens of MB; these bounds are far above that and far below
# what would hurt the host.
SUBMISSION_LIMITS = ChildLimits(
    wall_seconds=300.0,
    cpu_seconds=120.0,
    memory_bytes=2 * 1024**3,
    file_bytes=16 * 1024**2,
)
# The child's answer is plain data: counts, shapes, names, a few config values.
MAX_ANSWER_BYTES = 8 * 1024**2
# The child's environment: one thread, nothing fetched, no library chatter on stderr.
# One environment for every child that parses a submission, so that children with the same
# preloads share one pre-imported server (a server per distinct environment).
CHILD_ENV = {
    "OMP_NUM_THREADS": "1",
    "RAYON_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
}


def inspect_in_child(
    script: Path,
    request: dict[str, Any],
    *,
    work: Path,
    what: str,
    answer: type[A],
    preload: tuple[str, ...] = (),
    limits: ChildLimits = SUBMISSION_LIMITS,
    env: dict[str, str] | None = None,
) -> A:
    """Runs `script` on `request` in a bounded child (see the module's docstring) and returns
    its answer validated by `answer`. SubmissionRejected naming `what` when the submission's
    data is at fault or meets a limit; RuntimeError when the script itself failed."""
    work.mkdir(parents=True, exist_ok=True)
    stem = Path(script).stem
    request_path, result_path = work / f"{stem}-request.json", work / f"{stem}-result.json"
    # The folder may hold what an earlier child planted there (validator/sandbox/child_files.py).
    discard(result_path)
    write_new(request_path, json.dumps({**request, "result": str(result_path)}).encode())
    try:
        outcome = run_child(
            Path(script),
            [str(request_path)],
            cwd=work,
            limits=limits,
            env={**CHILD_ENV, **(env or {})},
            preload=preload,
        )
        raw = _read_answer(result_path)
    finally:
        discard(request_path)
        discard(result_path)
    if outcome.outcome is not ChildOutcome.OK:
        if outcome.outcome is ChildOutcome.CRASHED and outcome.exit_code > 0 and raw is None:
            # A traceback and no answer: the script's own failure, not the submission's doing
            # (the scripts catch what the submission's data makes the libraries raise).
            raise RuntimeError(f"{stem} {outcome.describe()}")
        log.warning("%s: the bounded child reading it %s", what, outcome.describe())
        raise SubmissionRejected(f"{what}: reading it {outcome.describe()}")
    if raw is None:
        raise RuntimeError(f"{stem} finished without writing an answer")
    if isinstance(raw, dict) and "error" in raw:
        raise SubmissionRejected(f"{what}: {one_line(str(raw['error']))[:400]}")
    try:
        return answer.model_validate(raw)
    except ValidationError as exc:
        # The script is ours and its answer's shape is fixed: a mismatch is our bug.
        raise RuntimeError(f"{stem} answered in an unexpected shape: {exc}") from exc


def _read_answer(path: Path) -> Any | None:
    try:
        data = read_child_file(path, MAX_ANSWER_BYTES)
    except FileNotFoundError:
        return None
    except ChildFileRefused as exc:  # a link, a FIFO, or an answer too large to take back
        raise SubmissionRejected(f"the answer in {exc}") from exc
    try:
        return loads_bounded(data, f"the answer in {path.name}", max_bytes=MAX_ANSWER_BYTES)
    except JsonRefused as exc:  # an answer the submission made too large to take back
        raise SubmissionRejected(f"{path.name}: {exc}") from exc
