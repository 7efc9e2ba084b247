"""GPU mode of the lora benchmark: real model shapes, random weights, context 4096.

The comparison itself (`compare`) takes any device, so the test suite runs it on a CPU with a
tiny shape; only `run_gpu` needs CUDA.
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
)

from bench.lora_adapter_cost import (
    print_adapter_cycle,
    print_per_assignment,
    reference_reload,
    time_adapter_cycle,
    write_random_adapter,
)
from bench.lora_agreement import autocast_for, forward_regime, measure_agreement, print_agreement
from bench.lora_common import GIB, Batching, print_versions, synchronize
from bench.lora_shapes import (
    CPU_SHAPE,
    GPU_SHAPES,
    Shape,
    forward_flops,
    meta_param_count,
    peak_tflops_for,
    total_params,
)
from modules.lora import packing as packing_rows
from modules.lora.forward import example_losses
from modules.lora.packing import use_packing
from modules.lora.records import EncodedExample
from modules.lora.schemas import PackingMode

# The GPU targets (bench/README.md). The memory line leaves 1 GiB of a 24 GB card to the CUDA
# context, which the allocator's figures do not include.
TARGET_PEAK_FRACTION = 0.40
TARGET_RATIO = 5.0
TARGET_MEMORY_BYTES = 23 * GIB
TARGET_SHAPE = "7b"
# The reference's Trainer path is slow (batch 1, full logits): its agreement runs on a subset.
AGREEMENT_EXAMPLES = 16


def synthetic_examples(
    count: int, context_length: int, vocab: int, seed: int = 0
) -> list[EncodedExample]:
    """Conversations of realistic lengths: a long system/tool prefix, then alternating prompt
    and assistant turns (the targets), truncated to the context; about 40-50% targets."""
    generator = torch.Generator().manual_seed(seed)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high, (1,), generator=generator))

    examples = []
    for _ in range(count):
        # Log-normal total length with a median near 1200 tokens, as chat/tool sets have.
        wanted = int(math.exp(7.1 + 0.6 * float(torch.randn(1, generator=generator))))
        length = max(64, min(context_length, wanted))
        mask = [0] * draw(min(150, length // 4), min(700, length // 2))
        while len(mask) < length:
            mask += [1] * draw(20, 350) + [0] * draw(30, 300)
        mask = mask[:length]
        if sum(mask[1:]) == 0:
            mask[-16:] = [1] * 16
        ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
        examples.append(EncodedExample(input_ids=ids, target_mask=mask))
    return examples


# --- measuring on any device -------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One side's pass over the examples."""

    seconds: float
    losses: list[float]
    peak_allocated: int | None  # bytes; None off CUDA
    peak_reserved: int | None


@dataclass(frozen=True)
class Comparison:
    """Ours against the baseline on one model. `ours` is the module's default path (packed rows
    on CUDA, padded batches on a CPU); `other` the other one, run on the same examples."""

    shape: Shape
    tokens: int
    ours: Run
    baseline: Run
    ours_flops: float
    baseline_flops: float
    ours_path: str = "padded"  # what `ours` ran: "packed", "padded", or a fallback note
    other: Run | None = None
    other_path: str | None = None
    warmup_seconds: float | None = None  # ours' first calls: FlexAttention's compile on CUDA

    @property
    def ratio(self) -> float:
        return self.baseline.seconds / self.ours.seconds

    @property
    def loss_rel_diff(self) -> float:
        ours, base = statistics.fmean(self.ours.losses), statistics.fmean(self.baseline.losses)
        return abs(ours - base) / abs(base)

    def tflops(self, side: str) -> float:
        run, flops = (
            (self.ours, self.ours_flops) if side == "ours" else (self.baseline, self.baseline_flops)
        )
        return flops / run.seconds / 1e12


def timed_run(action: Callable[[], list[float]], device: torch.device) -> Run:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    losses = action()
    synchronize(device)
    seconds = time.perf_counter() - start
    if device.type != "cuda":
        return Run(seconds, losses, None, None)
    allocated = torch.cuda.max_memory_allocated(device)
    return Run(seconds, losses, allocated, torch.cuda.max_memory_reserved(device))


def build_model(shape: Shape, dtype: torch.dtype, device: torch.device) -> PreTrainedModel:
    """Random weights created on `device` in `dtype`: no host copy, no fp32 detour."""
    with device:
        model = AutoModelForCausalLM.from_config(
            shape.config(), torch_dtype=dtype, attn_implementation="sdpa"
        )
    return model.eval()


def hf_losses(model: PreTrainedModel, examples: list[EncodedExample]) -> list[float]:
    """The reference's per-example loss: HF forward at batch size 1, full-vocabulary logits."""
    losses = []
    with torch.inference_mode():
        for example in examples:
            # Built on the host and copied per step, as the Trainer's data loader does.
            ids = torch.tensor([example.input_ids]).to(model.device)
            mask = torch.tensor([example.target_mask]).to(model.device)
            labels = torch.where(mask == 1, ids, torch.full_like(ids, -100))
            # The reference's Trainer wraps its forward in this regime (accelerate's autocast).
            with forward_regime(model):
                out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
            losses.append(out.loss.detach().float())  # no sync per step, like the Trainer
    return torch.stack(losses).tolist()


def ours_losses(
    model: PreTrainedModel,
    examples: list[EncodedExample],
    batching: Batching,
    packing: PackingMode = "auto",
) -> list[float]:
    """The module's scoring; `packing` as LoraConfig's (auto, its default: packed on CUDA)."""
    return example_losses(
        model,
        examples,
        token_budget=batching.token_budget,
        max_batch_size=batching.max_batch_size,
        pad_token_id=0,
        autocast=autocast_for(model),
        packing=packing,
    )


def path_taken(model: PreTrainedModel, packing: PackingMode) -> str:
    """What `ours_losses(..., packing)` ran on this model, fallbacks included, for the report."""
    if not use_packing(packing, model.device.type):
        return "padded"
    key = packing_rows.health_key(model, model.device, autocast_for(model))
    failure = packing_rows.HEALTH.failures.get(key)
    return "packed" if failure is None else f"padded (packing fell back: {failure})"


def compare(
    model: PreTrainedModel, shape: Shape, examples: list[EncodedExample], batching: Batching
) -> Comparison:
    """Both sides on the same model and examples, each timed after a warm-up; ours in the
    module's default path (packed on CUDA) and in the other one."""
    device = model.device
    lengths = [len(e.input_ids) for e in examples]
    rows = sum(e.predicted_count for e in examples)
    other_mode: PackingMode = "off" if use_packing("auto", device.type) else "on"
    # Warm-up: kernels, cuBLAS handles, the allocator, and on CUDA FlexAttention's compile
    # (once per process in the module; timed apart so the runs below show the steady state).
    synchronize(device)
    started = time.perf_counter()
    ours_losses(model, examples[:4], batching)
    synchronize(device)
    warmup = time.perf_counter() - started
    ours_losses(model, examples[:4], batching, other_mode)
    hf_losses(model, examples[:2])
    ours = timed_run(lambda: ours_losses(model, examples, batching), device)
    ours_path = path_taken(model, "auto")
    other = timed_run(lambda: ours_losses(model, examples, batching, other_mode), device)
    baseline = timed_run(lambda: hf_losses(model, examples), device)
    return Comparison(
        shape=shape,
        tokens=sum(lengths),
        ours=ours,
        baseline=baseline,
        ours_flops=forward_flops(shape, lengths, rows),
        baseline_flops=forward_flops(shape, lengths, sum(lengths)),
        ours_path=ours_path,
        other=other,
        other_path=path_taken(model, other_mode),
        warmup_seconds=warmup,
    )


# --- report ------------------------------------------------------------------------------------


def print_comparison(result: Comparison, peak: float | None) -> None:
    other = f"; other: {result.other_path}" if result.other is not None else ""
    print(f"  ours: the module's default path, {result.ours_path}{other}")
    sides = [("ours", result.ours), ("baseline", result.baseline)]
    if result.other is not None:
        sides.insert(1, ("other", result.other))
    for side, run in sides:
        flops = result.baseline_flops if side == "baseline" else result.ours_flops
        tflops = flops / run.seconds / 1e12
        share = f"{tflops / peak:.1%}" if peak else "n/a"
        memory = (
            f"peak mem {run.peak_allocated / GIB:.1f} GiB allocated, "
            f"{run.peak_reserved / GIB:.1f} GiB reserved"
            if run.peak_allocated is not None and run.peak_reserved is not None
            else "peak mem n/a"
        )
        print(
            f"  {side:<9} {run.seconds:>7.2f} s {result.tokens / run.seconds:>9.0f} tokens/s "
            f"{tflops:>7.1f} TFLOP/s  {share:>6} of peak  {memory}"
        )
    print(
        f"  ratio baseline/ours {result.ratio:.2f}x; mean loss rel diff "
        f"{result.loss_rel_diff:.1e} (batched vs single forwards round differently in 16-bit)"
    )
    if result.other is not None:
        ours, other = statistics.fmean(result.ours.losses), statistics.fmean(result.other.losses)
        worst = max(
            abs(a - b) / max(1.0, abs(b))
            for a, b in zip(result.ours.losses, result.other.losses, strict=True)
        )
        print(
            f"  {result.ours_path} is "
            f"{result.other.seconds / result.ours.seconds:.2f}x the speed of "
            f"{result.other_path}; mean loss rel diff "
            f"{abs(ours - other) / abs(other):.1e}, largest per conversation {worst:.1e} "
            "(the module's packed-row check allows modules/lora/packed_rows.py CHECK_TOLERANCE)"
        )
    if result.warmup_seconds is not None:
        print(
            f"  ours' warm-up on 4 sequences (FlexAttention's compile when packed on CUDA): "
            f"{result.warmup_seconds:.1f} s"
        )


def target_verdicts(
    results: dict[str, Comparison], dtype_name: str, peak: float | None
) -> list[str]:
    """One line per GPU target that this run can decide."""
    result = results.get(TARGET_SHAPE)
    if result is None:
        return [f"targets: not checked (they are set on the {TARGET_SHAPE} shape; add it)"]

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    lines = []
    if peak and dtype_name == "bf16":
        share = result.tflops("ours") / peak
        lines.append(
            f"target forward >= {TARGET_PEAK_FRACTION:.0%} of bf16 peak on {result.shape.name}: "
            f"{share:.1%} {verdict(share >= TARGET_PEAK_FRACTION)}"
        )
    else:
        lines.append("target share of bf16 peak: not checked (needs --dtype bf16 and a peak)")
    lines.append(
        f"target >= {TARGET_RATIO:.0f}x the baseline's tokens/s on {result.shape.name}: "
        f"{result.ratio:.2f}x {verdict(result.ratio >= TARGET_RATIO)}"
    )
    reserved = result.ours.peak_reserved
    if reserved is not None:
        lines.append(
            f"target {result.shape.name} at this context within 24 GB (reserved <= "
            f"{TARGET_MEMORY_BYTES / GIB:.0f} GiB): {reserved / GIB:.1f} GiB "
            f"{verdict(reserved <= TARGET_MEMORY_BYTES)}"
        )
    return lines


# --- entry points ------------------------------------------------------------------------------


def run_gpu(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise SystemExit(
            f"error: --device cuda needs a CUDA GPU, and torch {torch.__version__} "
            f"(CUDA build: {torch.version.cuda}) sees none. Run it on a GPU machine, or use "
            "--dry-run to check the shapes and FLOP counts without one."
        )
    dtype_name = args.dtype or "bf16"
    dtype: Any = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype_name)
    if dtype is None:
        raise SystemExit("error: --device cuda takes --dtype bf16 or fp16")
    context_length = args.context_length or 4096
    device_name = torch.cuda.get_device_name()
    peak = args.peak_tflops or peak_tflops_for(device_name)
    print_versions(f"cuda ({device_name})")
    print(
        f"peak dense {dtype_name}: {peak or 'unknown (pass --peak-tflops)'} TFLOP/s; "
        "TFLOP/s counts 2 x body params x tokens + 2 x lm_head params x logit rows computed "
        "+ causal attention; padding is not counted"
    )
    examples = synthetic_examples(args.gpu_examples, context_length, vocab=151936)
    lengths = [len(e.input_ids) for e in examples]
    targets = sum(sum(e.target_mask) for e in examples) / sum(lengths)
    print(
        f"{len(examples)} random sequences, context {context_length}: mean length "
        f"{statistics.fmean(lengths):.0f}, max {max(lengths)}, {targets:.0%} targets; "
        f"ours: {args.batching}"
    )
    results = {}
    for key in args.models:
        results[key] = measure_shape(
            GPU_SHAPES[key], dtype, torch.device("cuda"), examples, args.batching, args.rank, peak
        )
    print()
    for line in target_verdicts(results, dtype_name, peak):
        print(line)
    return 0


def measure_shape(
    shape: Shape,
    dtype: torch.dtype,
    device: torch.device,
    examples: list[EncodedExample],
    batching: Batching,
    rank: int,
    peak: float | None,
) -> Comparison:
    """Everything GPU mode measures on one model, printed as it goes: the scoring comparison,
    then the model work per assignment on both sides, then the bpc agreement with the
    reference's Trainer path. Any device, so the tests run it."""
    started = time.perf_counter()
    model = build_model(shape, dtype, device)
    print(f"\n{shape.name}: built in {time.perf_counter() - started:.1f} s")
    result = compare(model, shape, examples, batching)
    print_comparison(result, peak)
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        base_name = f"Qwen/{shape.name}"
        adapter = write_random_adapter(model, Path(tmp) / "adapter", rank, base_name)
        cycle = time_adapter_cycle(model, adapter, base_name)
        print_adapter_cycle(cycle, rank)
        model.save_pretrained(Path(tmp) / "base")  # safetensors, read back by the reference
        print_agreement(
            measure_agreement(model, examples[:AGREEMENT_EXAMPLES], batching.max_batch_size)
        )
        _release(model)
        model, reload_seconds = reference_reload(Path(tmp) / "base", adapter, dtype, device)
        _release(model)
    print_per_assignment(result.ours.seconds, result.baseline.seconds, cycle, reload_seconds)
    return result


def _release(model: PreTrainedModel) -> None:
    """Gives a model's memory back: the next model, or the next side, needs it."""
    device = model.device
    model.to("meta")
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# GPU mode's steps at a shape two CPU cores run in seconds (`--rehearse`, CI's rehearsal of
# bench/gpu_session.sh): Qwen2 layout, vocabulary 640.
REHEARSAL_SHAPE = Shape("rehearsal-qwen2", 640, 64, 128, 2, 4, 2, tied=True)


def run_rehearsal(args: argparse.Namespace) -> int:
    """GPU mode's measurement of one shape (`measure_shape`: scoring both paths against the
    per-example forward, the adapter cycle, the save, the Trainer's agreement, the reference's
    reload) on this CPU, fp32, at a tiny shape and 8 short sequences: what the GPU session runs,
    end to end, in seconds. Figures mean nothing here; that every step runs does."""
    print_versions("cpu (rehearsal of GPU mode)")
    examples = synthetic_examples(8, args.context_length or 256, vocab=REHEARSAL_SHAPE.vocab)
    print(f"{len(examples)} random sequences; ours: {args.batching}")
    cpu = torch.device("cpu")
    result = measure_shape(
        REHEARSAL_SHAPE, torch.float32, cpu, examples, args.batching, args.rank, None
    )
    print()
    for line in target_verdicts({TARGET_SHAPE: result}, "fp32", None):
        print(line)
    return 0


def run_dry(args: argparse.Namespace) -> int:
    """Shapes, parameter counts (arithmetic, and from meta-device models) and FLOPs per token."""
    context_length = args.context_length or (4096 if args.device == "cuda" else 1280)
    print(f"dry run: no weights allocated; FLOPs per token at a full {context_length} context")
    print(
        f"{'model':<16} {'layers':>6} {'hidden':>6} {'inter':>6} {'heads':>5} {'kv':>3} "
        f"{'vocab':>7} {'tied':>5} {'params':>14} {'meta count':>14} {'GFLOP/token':>12}"
    )
    ok = True
    for shape in (CPU_SHAPE, *(GPU_SHAPES[key] for key in args.models)):
        counted = meta_param_count(shape)
        ok &= counted == total_params(shape)
        per_token = forward_flops(shape, [context_length], context_length) / context_length
        print(
            f"{shape.name:<16} {shape.layers:>6} {shape.hidden:>6} {shape.intermediate:>6} "
            f"{shape.heads:>5} {shape.kv_heads:>3} {shape.vocab:>7} {str(shape.tied):>5} "
            f"{total_params(shape):>14,} {counted:>14,} {per_token / 1e9:>12.2f}"
        )
    print("parameter arithmetic matches the meta models" if ok else "MISMATCH in parameter counts")
    return 0 if ok else 1
