"""The fixed cost of a bounded child (validator/sandbox/child_process.py): forked from a
pre-imported server against a fresh `python -I` that imports its preloads itself (the fallback
path), measured in the same run: `.venv-llm_judge/bin/python -m
bench.child_start`.

1. A child that does nothing, with preload ("transformers",) and ("torch", "transformers"):
   the server's start (once), then the median of `--repeats` children on each path.
2. The children of one warm llm_judge assignment on the demo's tiny model (devkit's tiny chat
   base): the prompts encoded (`encode_prompts`), the answers decoded (`decode_answers`) and
   the full model's config read and its parameters counted (`inspect_model`), each in its own
   child, as the module runs them: their total on each path, after one warm-up assignment.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from devkit import DATA_DIR
from devkit.tiny_chat_models import build_chat_base
from modules.llm_judge.conversation import read_prompts
from modules.llm_judge.inspection import inspect_model
from modules.llm_judge.schemas import LlmJudgeConfig
from modules.llm_judge.templating import TemplateLimits, decode_answers, encode_prompts
from validator.sandbox import child_server
from validator.sandbox.child_process import ChildLimits, ChildOutcome, run_child

LIMITS = ChildLimits(wall_seconds=300, cpu_seconds=120, memory_bytes=2 * 1024**3)
PRELOADS = [("transformers",), ("torch", "transformers")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--assignments", type=int, default=3, help="warm, after one warm-up")
    args = parser.parse_args()
    print(f"machine: {platform.node()}, {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        nothing = work / "nothing.py"
        nothing.write_text("pass\n")
        print("\n1. one child that does nothing (seconds; median of", args.repeats, "runs)")
        print(f"{'preload':<24}{'fresh':>9}{'served':>9}{'ratio':>8}{'server start':>14}")
        for preload in PRELOADS:
            one = _nothing(nothing, work / "run", preload)
            fresh = _median(lambda one=one: _fresh(one), args.repeats)
            start = _time(one)  # the server's start and its first child
            served = _median(one, args.repeats)
            print(f"{'+'.join(preload):<24}{fresh:9.3f}{served:9.3f}{fresh / served:8.1f}"
                  f"{start:14.2f}")  # fmt: skip
        print("\n2. the children of one warm llm_judge assignment, tiny model (seconds)")
        assignment = _assignment(work)
        assignment()  # the servers start here
        _fresh(assignment)  # and the fresh path's files are cached too
        fresh, served = [], []
        for _ in range(args.assignments):  # alternating, so drift falls on both
            fresh.append(_time(lambda: _fresh(assignment)))
            served.append(_time(assignment))
        f, s = statistics.median(fresh), statistics.median(served)
        print(f"fresh {f:.2f}  served {s:.2f}  ratio {f / s:.1f}  (medians of {args.assignments})")
    child_server.shutdown()


def _nothing(script: Path, cwd: Path, preload: tuple[str, ...]) -> Callable[[], None]:
    return lambda: _ok(run_child(script, [], cwd=cwd, limits=LIMITS, preload=preload))


def _assignment(work: Path) -> Callable[[], None]:
    base = build_chat_base(work / "base")
    prompts = read_prompts(DATA_DIR / "chat_sample.jsonl")[:8]
    items = [(p.messages, p.tools, p.fallback) for p in prompts]
    limits = TemplateLimits.of(LlmJudgeConfig(supported_base_models=["bench/base"]))

    def assignment() -> None:
        bounded = {"submitted": True, "limits": limits, "work": work / "tokenizer"}
        encoded = encode_prompts(base, items, **bounded)
        decode_answers(base, [ids[-16:] for ids in encoded.ids for _ in range(2)], **bounded)
        inspect_model(base, work / "param-count")

    return assignment


def _fresh(call: Callable[[], object]) -> object:
    """`call` with no server: every child a fresh process, the fallback's way."""
    server_for = child_server.server_for
    child_server.server_for = lambda *_args, **_kwargs: None
    try:
        return call()
    finally:
        child_server.server_for = server_for


def _ok(result) -> None:
    if result.outcome is not ChildOutcome.OK:
        raise SystemExit(f"the child {result.describe()}: {result.stderr_tail}")


def _time(call: Callable[[], object]) -> float:
    began = time.perf_counter()
    call()
    return time.perf_counter() - began


def _median(call: Callable[[], object], repeats: int) -> float:
    return statistics.median(_time(call) for _ in range(repeats))


if __name__ == "__main__":
    main()
