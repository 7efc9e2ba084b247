"""The parameter count of a full model's config, before any weight is downloaded or allocated
(issue 23, item 6): transformers builds a model as its config describes it, whatever the weights
hold, so a config of 32 layers at hidden 2048 beside a tiny safetensors file took gigabytes (and
the process) before the count could be checked.

The config is built on the meta device in a child (count_child.py, via
validator/kit/child_process.py): no tensor gets storage, and a config that describes millions of
layers or experts, whose module objects alone would fill the host, meets the child's CPU,
memory and wall-clock limits instead. `check_full_model` then compares the count with
`max_params` and with the count of the safetensors headers.
"""

from __future__ import annotations

import json
from pathlib import Path

from validator.kit import ChildLimits, ChildOutcome, SubmissionRejected, run_child

CHILD = Path(__file__).with_name("count_child.py")
# A real model of 100 layers builds on the meta device in seconds and tens of MB.
LIMITS = ChildLimits(
    wall_seconds=300.0,
    cpu_seconds=120.0,
    memory_bytes=2 * 1024**3,
    file_bytes=64 * 1024,
)
# The config may describe this many times the parameters the headers hold, no more: weights
# that the config needs and the files lack would be filled with random values (loading.py
# refuses that), so a config far beyond its weights cannot load.
MAX_CONFIG_TO_HEADERS = 2.0


def config_parameter_count(config_dir: Path, work: Path) -> int:
    """The parameters that `config_dir/config.json` describes, counted on the meta device in
    a bounded child. SubmissionRejected when the config cannot be built or meets a limit."""
    work.mkdir(parents=True, exist_ok=True)
    request, result = work / "count-request.json", work / "count-result.json"
    result.unlink(missing_ok=True)
    request.write_text(json.dumps({"config_dir": str(config_dir), "result": str(result)}))
    outcome = run_child(
        CHILD,
        [str(request)],
        cwd=work,
        limits=LIMITS,
        env={
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",  # a local folder: nothing to fetch
            "TRANSFORMERS_VERBOSITY": "error",
        },
        preload=("torch", "transformers"),
    )
    if outcome.outcome is ChildOutcome.CRASHED and outcome.exit_code > 0:
        # A traceback, not a signal: the counter's own failure (a config's errors are caught
        # and reported in the result), not the submission's doing.
        raise RuntimeError(f"the parameter counter {outcome.describe()}")
    if outcome.outcome is not ChildOutcome.OK:
        raise SubmissionRejected(f"config.json: building its model {outcome.describe()}")
    try:
        answer = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"the parameter counter left no result: {exc}") from exc
    if "error" in answer:
        raise SubmissionRejected(f"config.json does not build a model: {answer['error']}")
    count = answer.get("count")
    if not isinstance(count, int) or count < 0:
        raise RuntimeError(f"the parameter counter returned {count!r}")
    return count


def check_against_headers(config_count: int, header_count: int) -> None:
    """SubmissionRejected when the config describes far more parameters than the weights hold:
    the weights are missing, and the model cannot load (-999 as the network scores it)."""
    if config_count > MAX_CONFIG_TO_HEADERS * header_count:
        raise SubmissionRejected(
            f"config.json describes {config_count} parameters, the safetensors headers hold "
            f"{header_count}: the weights are missing"
        )
