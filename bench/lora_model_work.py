"""The model work of a lora assignment on a CPU at real sizes: ours against the reference's.

Per assignment the reference (FLock-io/llm-loss-validator, `load_model`) reads the base from
disk, applies the adapter with peft and merges it; ours keeps the base loaded, merges the
adapter into it and copies the touched weights back afterwards (`applied_adapter` with the
base's pristine store), in a process set up as the module sets it up on a CPU
(`keep_freed_memory`). Scoring is left out on both sides: it is the same forward, measured by
`make bench`. Random weights in Qwen2.5 shapes, saved as safetensors in fp16 or bf16 and loaded
in that dtype; adapters of rank 16 on every attention and MLP projection. Each side runs in a
process of its own, so that neither inherits the other's heap.

    .venv/bin/python -m bench.lora_model_work [--models 1.5b 3b] [--dtypes fp16 bf16]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.modeling_utils import no_init_weights

from bench.lora_adapter_cost import (
    print_adapter_cycle,
    reference_reload,
    time_adapter_cycle,
    write_random_adapter,
)
from bench.lora_common import print_versions
from bench.lora_shapes import MODEL_WORK_SHAPES, Shape, total_params
from modules.lora.host_memory import keep_freed_memory

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
RANK = 16
CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[1]


def random_model(shape: Shape, dtype: torch.dtype) -> PreTrainedModel:
    """Random N(0, 0.02) weights written straight in `dtype` (HF's own init would go through
    fp32 layer by layer, and take longer than the measurement)."""
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(shape.config(), torch_dtype=dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02, generator=generator)
    return model.eval()


def measure(shape: Shape, dtype_name: str, reloads: int, work: Path) -> tuple[float, float]:
    """Seconds of model work per assignment, (ours, reference), printed as they come."""
    started = time.perf_counter()
    model = random_model(shape, DTYPES[dtype_name])
    base_name = f"Qwen/{shape.name}"
    base_dir, adapter_dir = work / "base", work / "adapter"
    model.save_pretrained(base_dir)
    write_random_adapter(model, adapter_dir, RANK, base_name)
    del model
    gc.collect()
    size = sum(f.stat().st_size for f in base_dir.glob("*.safetensors"))
    written = time.perf_counter() - started
    print(
        f"\n{shape.name} {dtype_name} ({total_params(shape) / 1e9:.2f} B parameters, "
        f"{size / 1024**3:.1f} GiB of safetensors): written in {written:.0f} s",
        flush=True,
    )
    sides = {}
    for side in ("reference", "ours"):
        command = [sys.executable, "-m", "bench.lora_model_work", "--side", side, str(work)]
        command += ["--dtypes", dtype_name, "--reloads", str(reloads)]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the {side} side failed:\n{done.stderr[-4000:]}")
        *lines, last = done.stdout.rstrip().splitlines()
        print("\n".join(lines), flush=True)
        sides[side] = json.loads(last)["seconds"]
    ours, reference = sides["ours"], sides["reference"]
    print(
        f"  model work per assignment: ours {ours:.2f} s, reference {reference:.2f} s: "
        f"ratio {reference / ours:.1f}x"
    )
    return ours, reference


def run_side(side: str, work: Path, dtype_name: str, reloads: int) -> float:
    """One side's seconds per assignment, in this process; printed as it goes."""
    transformers.logging.set_verbosity_error()
    dtype = DTYPES[dtype_name]
    base_dir, adapter_dir = work / "base", work / "adapter"
    base_name = json.loads((adapter_dir / "adapter_config.json").read_text())[
        "base_model_name_or_path"
    ]
    if side == "reference":
        seconds = []
        for _ in range(reloads):
            model, took = reference_reload(base_dir, adapter_dir, dtype, CPU)
            seconds.append(took)
            del model
            gc.collect()
        reference = statistics.median(seconds)
        listed = ", ".join(f"{s:.2f}" for s in seconds)
        print(
            f"  reference: read the base from disk, apply and merge the adapter: "
            f"{reference:.2f} s per assignment (median of {reloads}: {listed})"
        )
        return reference
    kept = keep_freed_memory()  # as LoraModule does on a CPU
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=dtype, use_cache=False)
    load_seconds = time.perf_counter() - started
    cycle = time_adapter_cycle(model.eval(), adapter_dir, base_name, later=max(3, reloads))
    print(
        f"  ours: the base loaded once per process in {load_seconds:.1f} s "
        f"(freed memory kept for reuse: {'yes' if kept else 'no'})"
    )
    print_adapter_cycle(cycle, RANK)
    return cycle.later_seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", choices=sorted(MODEL_WORK_SHAPES), default=list(MODEL_WORK_SHAPES)
    )
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp16", "bf16"])
    parser.add_argument("--reloads", type=int, default=3, help="reference reloads per model")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the models are saved")
    parser.add_argument("--side", choices=["ours", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("side_work", nargs="?", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        seconds = run_side(args.side, args.side_work, args.dtypes[0], args.reloads)
        print(json.dumps({"seconds": seconds}))
        return 0
    transformers.logging.set_verbosity_error()
    print_versions("cpu")
    print(f"{torch.get_num_threads()} torch threads; LoRA rank {RANK} on every projection")
    rows = []
    for key in args.models:
        shape = MODEL_WORK_SHAPES[key]
        for dtype_name in args.dtypes:
            with tempfile.TemporaryDirectory(prefix="lora-model-work-", dir=args.work_dir) as tmp:
                ours, reference = measure(shape, dtype_name, args.reloads, Path(tmp))
            rows.append((shape.name, dtype_name, ours, reference))
    print("\n| shape | dtype | ours (s) | reference (s) | ratio |")
    print("|---|---|---:|---:|---:|")
    for name, dtype_name, ours, reference in rows:
        print(f"| {name} | {dtype_name} | {ours:.2f} | {reference:.2f} | {reference / ours:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
