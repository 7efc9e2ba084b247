"""Rendering the validation set's prompts with the model's chat template, in a child process
(modules/llm_judge/template_child.py via validator/kit/child_process.py).

A full model's chat template is the submission's own Jinja: three nested `range(100000)` loops
or a string doubled 31 times would hold a core or take the host's memory for good if rendered in
the validator's process, and Jinja cannot be interrupted from within. In the child it runs under
CPU, memory and wall-clock limits; past one, the submission is rejected with the limit named,
and the validator stays responsive to stop signals throughout.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validator.kit import ChildLimits, ChildOutcome, SubmissionRejected, run_child

CHILD = Path(__file__).with_name("template_child.py")
# The result file may exceed the texts' own size by its JSON frame.
RESULT_MARGIN_BYTES = 64 * 1024


@dataclass(frozen=True)
class TemplateLimits:
    cpu_seconds: float  # CPU time for loading the tokenizer and rendering every prompt
    memory_bytes: int  # address space on top of the child's imports
    wall_seconds: float  # the whole child, imports included
    max_output_bytes: int  # all rendered texts together


def render_prompts(
    tokenizer_dir: Path,
    items: list[tuple[list[dict], Any]],
    *,
    submitted: bool,
    limits: TemplateLimits,
    work: Path | None = None,
) -> list[str]:
    """For each (messages, tools): the text of the chat template of `tokenizer_dir` with a
    generation prompt and thinking off, as `apply_chat_template(..., tokenize=False)` renders
    it. `submitted`: the template is the submission's (a full model), so its failures reject
    the submission (SubmissionRejected); otherwise they are ValueErrors."""
    if work is None:
        with tempfile.TemporaryDirectory(prefix="flock-template-") as folder:
            return _render(tokenizer_dir, items, submitted, limits, Path(folder))
    return _render(tokenizer_dir, items, submitted, limits, work)


def _render(
    tokenizer_dir: Path,
    items: list[tuple[list[dict], Any]],
    submitted: bool,
    limits: TemplateLimits,
    work: Path,
) -> list[str]:
    error = SubmissionRejected if submitted else ValueError
    work.mkdir(parents=True, exist_ok=True)
    paths = {name: work / f"template-{name}.json" for name in ("request", "items", "result")}
    paths["items"].write_text(json.dumps([[m, t] for m, t in items]), encoding="utf-8")
    request = {
        "tokenizer_dir": str(tokenizer_dir),
        "max_output_bytes": limits.max_output_bytes,
        "items": str(paths["items"]),
        "result": str(paths["result"]),
    }
    paths["request"].write_text(json.dumps(request), encoding="utf-8")
    outcome = run_child(
        CHILD,
        [str(paths["request"])],
        cwd=work,
        limits=ChildLimits(
            wall_seconds=limits.wall_seconds,
            cpu_seconds=limits.cpu_seconds,
            memory_bytes=limits.memory_bytes,
            file_bytes=limits.max_output_bytes + RESULT_MARGIN_BYTES,
        ),
        env={
            # One thread each: rendering is Jinja, and the tokenizer is only loaded.
            "OMP_NUM_THREADS": "1",
            "RAYON_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",  # a local folder: nothing to fetch
            "TRANSFORMERS_VERBOSITY": "error",
        },
        preload=("transformers",),
    )
    if outcome.outcome is ChildOutcome.CRASHED and outcome.exit_code > 0:
        # A traceback, not a signal: the renderer's own failure (template errors are caught
        # and reported in the result), not the template's doing.
        raise RuntimeError(f"the template renderer {outcome.describe()}")
    if outcome.outcome is not ChildOutcome.OK:
        raise error(f"the chat template {outcome.describe()} while rendering the prompts")
    result = _read(paths["result"], limits)
    for name in ("items", "result"):
        paths[name].unlink(missing_ok=True)
    if "load_error" in result:
        raise error(f"the tokenizer does not load for its chat template: {result['load_error']}")
    if "failed" in result:
        failed = result["failed"]
        raise error(
            f"the chat template fails on line {failed['index']} of the validation set: "
            f"{failed['error']}"
        )
    if "too_long" in result:
        raise error(
            f"the chat template's texts exceed {limits.max_output_bytes} bytes "
            f"(template_max_output_bytes) at line {result['too_long']['index']}"
        )
    texts = result.get("texts")
    if not isinstance(texts, list) or len(texts) != len(items):
        raise RuntimeError(f"the template renderer returned {type(texts).__name__}, not texts")
    return texts


def _read(path: Path, limits: TemplateLimits) -> dict:
    if not path.is_file() or path.stat().st_size > limits.max_output_bytes + RESULT_MARGIN_BYTES:
        raise RuntimeError(f"the template renderer left no result in {path}")
    result = json.loads(path.read_text(encoding="utf-8", errors="surrogatepass"))
    if not isinstance(result, dict):
        raise RuntimeError(f"the template renderer wrote {type(result).__name__}")
    return result
