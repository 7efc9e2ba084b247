"""GPU mode of the lora benchmark: real model shapes, random weights, context 4096."""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from lora_common import Batching, print_versions
from lora_shapes import (
    CPU_SHAPE,
    GPU_SHAPES,
    Shape,
    forward_flops,
    meta_param_count,
    peak_tflops_for,
    total_params,
)
from transformers import (
    AutoModelForCausalLM,
    PreTrainedModel,
)

from modules.lora.loss import (
    example_losses,
)
from modules.lora.records import EncodedExample

# --- GPU mode ----------------------------------------------------------------------------------


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
        mask = [0] * draw(150, 700)
        while len(mask) < length:
            mask += [1] * draw(20, 350) + [0] * draw(30, 300)
        mask = mask[:length]
        if sum(mask[1:]) == 0:
            mask[-16:] = [1] * 16
        ids = torch.randint(0, vocab, (length,), generator=generator).tolist()
        examples.append(EncodedExample(input_ids=ids, target_mask=mask))
    return examples


def cuda_seconds(action: Callable[[], Any]) -> tuple[float, Any]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    value = action()
    torch.cuda.synchronize()
    return time.perf_counter() - start, value


def build_on_gpu(shape: Shape, dtype: torch.dtype) -> PreTrainedModel:
    """Random weights created on the GPU in `dtype`: no CPU copy, no fp32 detour."""
    with torch.device("cuda"):
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
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
            losses.append(out.loss.detach().float())  # no sync per step, like the Trainer
    return torch.stack(losses).tolist()


def ours_losses(
    model: PreTrainedModel, examples: list[EncodedExample], batching: Batching
) -> list[float]:
    return example_losses(
        model,
        examples,
        token_budget=batching.token_budget,
        max_batch_size=batching.max_batch_size,
        pad_token_id=0,
    )


def measure_gpu(
    name: str, run: Callable[[], list[float]], flops: float, tokens: int, peak: float | None
) -> tuple[float, list[float]]:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    seconds, losses = cuda_seconds(run)
    tflops = flops / seconds / 1e12
    share = f"{tflops / peak:.1%}" if peak else "n/a"
    memory = torch.cuda.max_memory_allocated() / 1024**3
    print(
        f"  {name:<9} {seconds:>7.2f} s {tokens / seconds:>9.0f} tokens/s "
        f"{tflops:>7.1f} TFLOP/s  {share:>6} of peak  peak mem {memory:>6.1f} GiB"
    )
    return seconds, losses


def bench_gpu_model(
    shape: Shape,
    dtype: torch.dtype,
    examples: list[EncodedExample],
    peak: float | None,
    batching: Batching,
) -> None:
    started = time.perf_counter()
    model = build_on_gpu(shape, dtype)
    print(f"\n{shape.name}: built in {time.perf_counter() - started:.1f} s")
    try:
        compare_on_gpu(model, shape, examples, peak, batching)
    finally:
        # The next, larger model needs the memory back.
        del model
        gc.collect()
        torch.cuda.empty_cache()


def compare_on_gpu(
    model: PreTrainedModel,
    shape: Shape,
    examples: list[EncodedExample],
    peak: float | None,
    batching: Batching,
) -> None:
    lengths = [len(e.input_ids) for e in examples]
    rows = sum(sum(e.target_mask[1:]) for e in examples)
    tokens = sum(lengths)
    ours_losses(model, examples[:4], batching)  # warm-up: kernels, cuBLAS handles, allocator
    hf_losses(model, examples[:2])
    ours_flops = forward_flops(shape, lengths, rows)
    ours_s, ours = measure_gpu(
        "ours", partial(ours_losses, model, examples, batching), ours_flops, tokens, peak
    )
    base_flops = forward_flops(shape, lengths, tokens)
    base_s, base = measure_gpu(
        "baseline", partial(hf_losses, model, examples), base_flops, tokens, peak
    )
    ours_mean, base_mean = statistics.fmean(ours), statistics.fmean(base)
    print(
        f"  ratio baseline/ours {base_s / ours_s:.2f}x; mean loss ours {ours_mean:.5f} vs "
        f"baseline {base_mean:.5f} (rel diff {abs(ours_mean - base_mean) / abs(base_mean):.1e}, "
        "rounding of batched vs single forwards in low precision, not checked)"
    )


def run_gpu(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        raise SystemExit(
            f"error: --device cuda needs a CUDA GPU, and torch {torch.__version__} "
            f"(CUDA build: {torch.version.cuda}) sees none. Run it on a GPU machine, or use "
            "--dry-run to check the shapes and FLOP counts without one."
        )
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.dtype or "bf16")
    if dtype is None:
        raise SystemExit("error: --device cuda takes --dtype bf16 or fp16")
    context_length = args.context_length or 4096
    device_name = torch.cuda.get_device_name()
    peak = args.peak_tflops or peak_tflops_for(device_name)
    print_versions(f"cuda ({device_name})")
    print(
        f"peak dense {args.dtype or 'bf16'}: {peak or 'unknown (pass --peak-tflops)'} TFLOP/s; "
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
    for key in args.models:
        bench_gpu_model(GPU_SHAPES[key], dtype, examples, peak, args.batching)
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
