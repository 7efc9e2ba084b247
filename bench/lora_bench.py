"""The lora module's scoring against the network reference's way of scoring, on the same data.

CPU mode (default, `make bench`): a random-weight Qwen2 model of ~40M parameters with a
realistic 32000-entry vocabulary, saved as a safetensors base repo, and N random LoRA adapters;
the first conversations of the function-calling sample, `qwen1.5` template, context 1280.
  ours      the module's code path without HTTP: the kit's warm `WarmBase`, then per assignment
            `encode_set` (once per validation-set content, as the module caches it),
            `applied_adapter`, `example_losses`, `eval_loss`, `score_metrics`
  baseline  what the reference does per assignment: tokenizer and data set, base model
            `from_pretrained`, `PeftModel.from_pretrained(...).merge_and_unload()`,
            `Trainer.evaluate()` at batch size 1 with an SFT collator
Each side runs in a process of its own and the two take turns, assignment by assignment, so
drift in the machine's speed falls on both. Exits 1 when a bpc differs by more than 1e-4
(relative) between the two.

GPU mode (`--device cuda`): random-weight models with the shapes of Qwen2.5-0.5B/1.5B/7B, built
directly on the GPU, random token sequences with assistant masks at context 4096; throughput of
`example_losses` against an HF forward at batch size 1 with full logits. `--dry-run` prints the
shapes, parameter and FLOP counts from meta-device models, allocating no weights.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# Every model here is built locally; nothing may reach the hub (peft would otherwise ask it
# about the adapter's base model name).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import transformers
from transformers import PreTrainedModel

from bench.lora_baseline import BaselineSide
from bench.lora_common import BASE_NAME, MIB, TEMPLATE, TOLERANCE, Batching, print_versions
from bench.lora_gpu import run_dry, run_gpu, run_rehearsal
from bench.lora_measure import Assignment, SideResult
from bench.lora_ours import OursSide, distinct
from bench.lora_shapes import CPU_SHAPE, GPU_SHAPES, Shape, forward_flops, total_params
from bench.lora_sides import SideProcess
from devkit import DATA_DIR
from devkit.tiny_models import build_model, make_lora, save_base
from devkit.tiny_tokenizer import build_tokenizer
from modules.lora.forward import default_max_batch_size
from modules.lora.records import EncodedExample

DATA_FILE = DATA_DIR / "function_calling_sample.jsonl"

# --- CPU fixtures ------------------------------------------------------------------------------


def build_base_repo(tmp: Path, shape: Shape) -> tuple[Path, PreTrainedModel]:
    """The base repo (safetensors weights, config, tokenizer) and the model it holds."""
    tokenizer_dir = build_tokenizer(tmp / "tokenizer", kind="qwen")
    overrides = shape.config_values()
    vocab = overrides.pop("vocab_size")
    # The HF default init; the tests' wider one would saturate the logits of 8 layers.
    model = build_model("qwen2", vocab_size=vocab, seed=0, initializer_range=0.02, **overrides)
    base_dir = save_base(model, tmp / "base")
    for path in tokenizer_dir.iterdir():
        shutil.copy2(path, base_dir / path.name)
    return base_dir, model


def build_adapters(model: PreTrainedModel, tmp: Path, count: int, rank: int) -> list[Path]:
    """`count` adapters with random non-zero A and B on every attention and MLP projection."""
    paths = []
    for index in range(count):
        adapted = make_lora(model, seed=index + 1, r=rank)
        for config in adapted.peft_config.values():
            config.base_model_name_or_path = BASE_NAME
        dest = tmp / f"adapter-{index + 1}"
        adapted.save_pretrained(dest, save_embedding_layers=False)
        paths.append(dest)
        del adapted
    return paths


def write_subset(source: Path, dest: Path, count: int) -> int:
    """The first `count` lines of `source` (all when 0) in `dest`; returns how many."""
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    chosen = lines[:count] if count else lines
    dest.write_text("".join(chosen), encoding="utf-8")
    return len(chosen)


# --- CPU report --------------------------------------------------------------------------------


def scored(examples: list[EncodedExample]) -> list[EncodedExample]:
    """Examples with at least one predicted target (position 0 is never predicted): what the
    baseline runs."""
    return [e for e in examples if e.predicted_count > 0]


def print_assignments(ours: SideResult, baseline: SideResult) -> bool:
    """Per-assignment seconds and bpc of both sides; True when every bpc agrees."""
    print(
        f"{'assignment':<12} {'adapter':<10} {'ours s':>8} {'base s':>8} "
        f"{'bpc ours':>12} {'bpc base':>12} {'abs diff':>10} {'rel diff':>10}  check"
    )
    all_ok = True
    for number, (a, b) in enumerate(zip(ours.assignments, baseline.assignments, strict=True), 1):
        diff = abs(a.bpc - b.bpc)
        relative = diff / abs(b.bpc) if b.bpc else math.inf
        ok = relative <= TOLERANCE
        all_ok &= ok
        label = f"{number} (cold)" if number == 1 else str(number)
        print(
            f"{label:<12} {a.adapter:<10} {a.phases.total:>8.2f} {b.phases.total:>8.2f} "
            f"{a.bpc:>12.7f} {b.bpc:>12.7f} {diff:>10.2e} {relative:>10.2e}  "
            f"{'PASS' if ok else 'FAIL'}"
        )
    return all_ok


def print_profile(ours: SideResult, baseline: SideResult, floor: float) -> None:
    """Median steady-state seconds per phase: where each side spends an assignment."""
    names = ["encode", "plan + load base", "apply + restore adapter", "forward + loss"]
    print(f"\nsteady-state phases (median s)   {'ours':>8} {'baseline':>9}")
    for name in names:
        print(f"  {name:<30} {ours.steady_phase(name):>8.3f} {baseline.steady_phase(name):>9.3f}")
    print(f"  {'total':<30} {ours.steady_seconds():>8.3f} {baseline.steady_seconds():>9.3f}")
    # Whatever ours does to the lm_head and batching, the body forward stays.
    overhead = ours.steady_seconds() - ours.steady_phase("forward + loss")
    print(
        f"  body forward alone, batch size 1, no lm_head: {floor:.3f} s; ceiling on the ratio "
        f"with that forward unchanged and ours' other phases as measured: "
        f"{baseline.steady_seconds() / (floor + overhead):.2f}x"
    )


def print_throughput(
    ours: SideResult, baseline: SideResult, examples: list[EncodedExample]
) -> None:
    useful, unique = scored(examples), distinct(examples)
    tokens = sum(len(e.input_ids) for e in useful)
    lengths = [len(e.input_ids) for e in unique]
    ours_flops = forward_flops(CPU_SHAPE, lengths, sum(e.predicted_count for e in unique))
    base_flops = forward_flops(CPU_SHAPE, [len(e.input_ids) for e in useful], tokens)
    print(
        f"\nthroughput over {len(useful)} target-bearing sequences ({len(unique)} distinct), "
        f"{tokens} tokens:"
    )
    for side, flops in ((ours, ours_flops), (baseline, base_flops)):
        forward = side.steady_phase("forward + loss")
        print(
            f"  {side.name:<9} {tokens / side.steady_seconds():>8.0f} tokens/s per assignment, "
            f"{tokens / forward:>8.0f} tokens/s in forward + loss, "
            f"{flops / forward / 1e9:>6.1f} GFLOP/s ({flops / 1e12:.2f} TFLOP executed)"
        )
    print(
        f"  FLOP ratio baseline/ours {base_flops / ours_flops:.2f}x: what skipping repeats "
        "and non-target lm_head rows saves; the body forward over distinct sequences stays"
    )


def print_memory(ours: SideResult, baseline: SideResult) -> None:
    print("\npeak RSS, each side's own process, incl. interpreter and torch:")
    for side in (ours, baseline):
        how = "VmHWM since start" if side.rss_exact else "lifetime ru_maxrss"
        print(
            f"  {side.name:<9} peak {side.rss_peak / MIB:>7.0f} MiB "
            f"(RSS at start {side.rss_start / MIB:.0f} MiB; {how})"
        )


def run_cpu(args: argparse.Namespace) -> int:
    if args.dtype not in (None, "fp32"):
        raise SystemExit("error: the module scores in fp32 on CPU; --dtype is for --device cuda")
    context_length = args.context_length or 1280
    print_versions("cpu")
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp_name:
        tmp = Path(tmp_name)
        started = time.perf_counter()
        base_dir, model = build_base_repo(tmp, CPU_SHAPE)
        if total_params(CPU_SHAPE) != sum(p.numel() for p in model.parameters()):
            raise RuntimeError("the parameter arithmetic disagrees with the built model")
        adapters = build_adapters(model, tmp, args.adapters, args.rank)
        del model
        gc.collect()
        data = tmp / "validation.jsonl"
        count = write_subset(args.data, data, args.examples)
        print(
            f"model {CPU_SHAPE.name}: Qwen2, hidden {CPU_SHAPE.hidden}, {CPU_SHAPE.layers} layers, "
            f"vocab {CPU_SHAPE.vocab}, {total_params(CPU_SHAPE) / 1e6:.1f}M parameters, fp32; "
            f"{args.adapters} adapters r={args.rank} on q,k,v,o,gate,up,down"
        )
        subset = "all" if not args.examples else f"the first {count} (a fixed subset)"
        print(
            f"data: {args.data.name}, {subset} of its conversations, template {TEMPLATE}, "
            f"context {context_length}; ours: {args.batching}; "
            f"torch threads {torch.get_num_threads()}"
        )
        print(f"fixtures built in {time.perf_counter() - started:.1f} s\n")
        with (
            SideProcess("ours", OursSide, base_dir, data, context_length, args.batching) as ours,
            SideProcess(
                "baseline", BaselineSide, base_dir, data, context_length, tmp / "trainer"
            ) as baseline,
        ):
            return report_cpu(*alternate(ours, baseline, adapters))


def alternate(
    ours: SideProcess, baseline: SideProcess, adapters: list[Path]
) -> tuple[SideResult, SideResult, list[EncodedExample], float]:
    """Both sides' assignments, one of each in turn, then the body floor in ours' process."""
    done: dict[str, list[Assignment]] = {"ours": [], "baseline": []}
    examples: list[EncodedExample] = []
    for number, adapter in enumerate(adapters, 1):
        for side in (ours, baseline):
            result, encoded = side.call("assignment", adapter)
            if examples and encoded != examples:
                raise RuntimeError(f"{side.name} encoded different examples from the other side")
            examples = encoded
            done[side.name].append(result)
        print(
            f"assignment {number}/{len(adapters)}: ours {done['ours'][-1].phases.total:.2f} s, "
            f"baseline {done['baseline'][-1].phases.total:.2f} s",
            flush=True,
        )
    if (loads := ours.call("base_loads")) != 1:
        raise RuntimeError(f"ours loaded the base {loads} times; the cache should keep it")
    floor = ours.call("body_floor", examples)
    sides = [
        SideResult(side.name, done[side.name], *side.call("memory")) for side in (ours, baseline)
    ]
    return sides[0], sides[1], examples, floor


def report_cpu(
    ours: SideResult,
    baseline: SideResult,
    examples: list[EncodedExample],
    floor: float,
) -> int:
    all_ok = print_assignments(ours, baseline)
    ratio = baseline.steady_seconds() / ours.steady_seconds()
    cold = baseline.assignments[0].phases.total / ours.assignments[0].phases.total
    print(
        f"\nsteady state (median of assignments 2..{len(ours.assignments)}): "
        f"ours {ours.steady_seconds():.2f} s, baseline {baseline.steady_seconds():.2f} s, "
        f"ratio baseline/ours {ratio:.2f}x (cold assignment {cold:.2f}x)"
    )
    print_profile(ours, baseline, floor)
    print_throughput(ours, baseline, examples)
    print_memory(ours, baseline)
    verdict = "PASS" if all_ok else "FAIL"
    print(f"\nbpc agreement within {TOLERANCE:g} relative: {verdict}")
    return 0 if all_ok else 1


# --- entry point -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default=None)
    parser.add_argument("--adapters", type=int, default=4, help="CPU: assignments (>= 2)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank of the adapters")
    parser.add_argument(
        "--examples", type=int, default=48, help="CPU: first N conversations (0: all)"
    )
    parser.add_argument("--data", type=Path, default=DATA_FILE, help="CPU: a validation set")
    parser.add_argument("--context-length", type=int, default=None, help="1280 CPU, 4096 GPU")
    parser.add_argument("--gpu-examples", type=int, default=128)
    parser.add_argument("--models", nargs="+", choices=sorted(GPU_SHAPES), default=list(GPU_SHAPES))
    parser.add_argument("--peak-tflops", type=float, default=None, help="GPU dense peak")
    parser.add_argument("--dry-run", action="store_true", help="print shapes and counts only")
    parser.add_argument(
        "--rehearse",
        action="store_true",
        help="GPU mode's steps on this CPU at a tiny shape (bench/gpu_session.sh --rehearse)",
    )
    parser.add_argument(
        "--token-budget", type=int, default=Batching.token_budget, help="the module's config"
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="the module's config [default: what the module picks on the device]",
    )
    args = parser.parse_args(argv)
    # Unset in the config, the module batches 1 conversation on a CPU and 64 on a GPU; the
    # bench must measure what an operator runs.
    max_batch_size = args.max_batch_size or default_max_batch_size(args.device)
    args.batching = Batching(args.token_budget, max_batch_size)
    if args.adapters < 2:
        parser.error("--adapters must be at least 2: one cold assignment, then steady state")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.logging.set_verbosity_error()
    if args.dry_run:
        return run_dry(args)
    if args.rehearse:
        return run_rehearsal(args)
    if args.device == "cuda":
        return run_gpu(args)
    return run_cpu(args)


if __name__ == "__main__":
    sys.exit(main())
