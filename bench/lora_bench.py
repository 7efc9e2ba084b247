"""The lora module's scoring against the network reference's way of scoring, on the same data.

CPU mode (default, `make bench`): a random-weight Qwen2 model of ~40M parameters with a
realistic 32000-entry vocabulary, saved as a safetensors base repo, and N random LoRA adapters;
the first conversations of the function-calling sample, `qwen1.5` template, context 1280.
  ours      the module's code path without HTTP: a warm `BaseModelCache`, then per assignment
            `encode_set`, `applied_adapter`, `example_losses`, `eval_loss`, `score_metrics`
  baseline  what the reference does per assignment: tokenizer and data set, base model
            `from_pretrained`, `PeftModel.from_pretrained(...).merge_and_unload()`,
            `Trainer.evaluate()` at batch size 1 with an SFT collator
Exits 1 when a bpc differs by more than 1e-4 (relative) between the two.

GPU mode (`--device cuda`): random-weight models with the shapes of Qwen2.5-0.5B/1.5B/7B, built
directly on the GPU, random token sequences with assistant masks at context 4096; throughput of
`example_losses` against an HF forward at batch size 1 with full logits. `--dry-run` prints the
shapes, parameter and FLOP counts from meta-device models, allocating no weights.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Every model here is built locally; nothing may reach the hub (peft would otherwise ask it
# about the adapter's base model name).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    PreTrainedModel,
    PrinterCallback,
    Qwen2Config,
    Trainer,
    TrainingArguments,
)

from modules.lora import LoraConfig  # noqa: E402
from modules.lora.adapters import applied_adapter, plan_adapter  # noqa: E402
from modules.lora.base_models import BaseModelCache, pick_dtype  # noqa: E402
from modules.lora.dataset import encode_set, load_tokenizer, read_jsonl  # noqa: E402
from modules.lora.loss import eval_loss, example_losses, score_metrics  # noqa: E402
from modules.lora.records import EncodedExample  # noqa: E402
from modules.lora.templates import get_template  # noqa: E402
from tests.lora.tiny_models import build_model, make_lora, save_base  # noqa: E402
from tests.lora.tiny_tokenizer import build_tokenizer  # noqa: E402

DATA_FILE = Path("/work/shared/reference/data/function_calling_sample.jsonl")
BASE_NAME = "Qwen/Qwen2.5-0.5B"  # what the adapters name as their base; served from disk
TEMPLATE = "qwen1.5"
TOLERANCE = 1e-4  # relative bpc difference allowed between ours and the baseline, fp32
MIB = 1024**2
DEFAULTS = LoraConfig.model_fields
TOKEN_BUDGET: int = DEFAULTS["token_budget"].default
MAX_BATCH_SIZE: int = DEFAULTS["max_batch_size"].default

# --- shapes and FLOP arithmetic ----------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A Qwen2-architecture model shape (q/k/v biases, no o_proj bias, gated MLP)."""

    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def config_values(self) -> dict[str, Any]:
        # sliding_window=None: unused at these lengths (use_sliding_window is off in the real
        # configs too), and transformers warns about it with sdpa otherwise.
        return {
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "tie_word_embeddings": self.tied,
            "max_position_embeddings": 32768,
            "rope_theta": 1_000_000.0,
            "rms_norm_eps": 1e-6,
            "sliding_window": None,
            "use_cache": False,
        }

    def config(self) -> Qwen2Config:
        return Qwen2Config(**self.config_values())


# Public configs of the Qwen2.5 family (config.json of each repo), typed in, not downloaded.
GPU_SHAPES = {
    "0.5b": Shape("Qwen2.5-0.5B", 151936, 896, 4864, 24, 14, 2, tied=True),
    "1.5b": Shape("Qwen2.5-1.5B", 151936, 1536, 8960, 28, 12, 2, tied=True),
    "7b": Shape("Qwen2.5-7B", 152064, 3584, 18944, 28, 28, 4, tied=False),
}
# Small enough for 2 CPU cores, with a real vocabulary so the lm_head costs what it would.
CPU_SHAPE = Shape("bench-qwen2-40M", 32000, 512, 1536, 8, 8, 2, tied=True)

# Dense (no sparsity) bf16/fp16 tensor-core peaks in TFLOP/s, from the vendor data sheets;
# matched in order against torch.cuda.get_device_name().
PEAK_TFLOPS = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM (HBM3)
    ("A100", 312.0),
)


def layer_params(shape: Shape) -> int:
    kv = shape.kv_heads * shape.head_dim
    attention = (shape.hidden + 1) * shape.hidden + 2 * (shape.hidden + 1) * kv
    attention += shape.hidden * shape.hidden  # o_proj, no bias
    mlp = 3 * shape.hidden * shape.intermediate
    return attention + mlp + 2 * shape.hidden  # two RMSNorm weights


def body_params(shape: Shape) -> int:
    """Everything but the embedding and the lm_head: what every token goes through."""
    return shape.layers * layer_params(shape) + shape.hidden


def head_params(shape: Shape) -> int:
    return shape.vocab * shape.hidden


def total_params(shape: Shape) -> int:
    embeddings = shape.vocab * shape.hidden
    return embeddings + body_params(shape) + (0 if shape.tied else head_params(shape))


def forward_flops(shape: Shape, lengths: Sequence[int], head_rows: int) -> float:
    """FLOPs of a forward pass over sequences of `lengths` (no padding) whose lm_head is applied
    to `head_rows` positions: 2 x body parameters x tokens, plus 2 x lm_head parameters x rows,
    plus causal attention (QK^T and AV, 2 x 2 x L^2 x d per layer, halved by the mask)."""
    tokens = sum(lengths)
    attention = sum(2 * shape.layers * length * length * shape.hidden for length in lengths)
    return 2.0 * body_params(shape) * tokens + 2.0 * head_params(shape) * head_rows + attention


def meta_param_count(shape: Shape) -> int:
    """Parameters of the HF model built on the meta device (no memory); tied weights once."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape.config(), torch_dtype=torch.bfloat16)
    return sum(p.numel() for p in model.parameters())


def peak_tflops_for(device_name: str) -> float | None:
    for key, peak in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return peak
    return None


# --- measuring ---------------------------------------------------------------------------------


def reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS mark of this process (Linux >= 4.0); False if it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def rss_bytes(key: str = "VmHWM") -> int:
    """Peak (VmHWM) or current (VmRSS) resident memory; the lifetime peak where /proc is absent."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass
class Phases:
    """Wall-clock seconds per named phase of one assignment, in the order they ran."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


@dataclass
class Assignment:
    adapter: str
    phases: Phases
    eval_loss: float
    bpc: float


@dataclass
class SideResult:
    """One implementation's assignments, in order (the first is cold), and its peak memory."""

    name: str
    assignments: list[Assignment]
    rss_start: int
    rss_peak: int

    @property
    def steady(self) -> list[Assignment]:
        return self.assignments[1:] or self.assignments

    def steady_seconds(self) -> float:
        return statistics.median(a.phases.total for a in self.steady)

    def steady_phase(self, name: str) -> float:
        return statistics.median(a.phases.seconds.get(name, 0.0) for a in self.steady)


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


# --- ours: the module's code path --------------------------------------------------------------


def ours_assignment(
    cache: BaseModelCache, adapter_dir: Path, data: Path, context_length: int
) -> tuple[Assignment, list[EncodedExample]]:
    """One assignment as `LoraModule.validate` runs it, from the downloaded files on."""
    phases = Phases()
    with phases.phase("plan + load base"):
        raw = json.loads((adapter_dir / "adapter_config.json").read_text())
        plan = plan_adapter(raw, [BASE_NAME])
        base = cache.get(plan.base_model)
    with phases.phase("encode"):
        encoded = encode_set(read_jsonl(data), get_template(TEMPLATE), base.tokenizer, context_length)
    apply_started = time.perf_counter()
    with applied_adapter(base.model, adapter_dir, plan, merge=True) as model:
        phases.seconds["apply + restore adapter"] = time.perf_counter() - apply_started
        with phases.phase("forward + loss"):
            losses = example_losses(
                model,
                encoded.examples,
                token_budget=TOKEN_BUDGET,
                max_batch_size=MAX_BATCH_SIZE,
                pad_token_id=base.tokenizer.pad_token_id,
            )
        restore_started = time.perf_counter()
    phases.seconds["apply + restore adapter"] += time.perf_counter() - restore_started
    loss = eval_loss(losses)
    metrics = score_metrics(loss, encoded.total_target_tokens, encoded.total_bytes)
    return Assignment(adapter_dir.name, phases, loss, metrics["bpc"]), encoded.examples


def run_ours(
    base_dir: Path, adapters: list[Path], data: Path, context_length: int
) -> tuple[SideResult, list[EncodedExample]]:
    reset_peak_rss()
    rss_start = rss_bytes("VmRSS")
    cache = BaseModelCache(
        fetch=lambda repo_id: base_dir,
        load_tokenizer=load_tokenizer,
        device="cpu",
        dtype=pick_dtype("cpu", fp16=False),
    )
    results, examples = [], []
    for adapter in adapters:
        result, examples = ours_assignment(cache, adapter, data, context_length)
        results.append(result)
    if cache.loads != 1:
        raise RuntimeError(f"the base was loaded {cache.loads} times; the cache should keep it")
    return SideResult("ours", results, rss_start, rss_bytes()), examples


# --- baseline: the reference's way, written plainly ---------------------------------------------


def sft_collate(batch: list[dict[str, list[int]]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pads a batch; labels are the ids at target positions and -100 elsewhere."""
    width = max(len(item["input_ids"]) for item in batch)

    def padded(key: str, value: int) -> torch.Tensor:
        rows = [item[key] + [value] * (width - len(item[key])) for item in batch]
        return torch.tensor(rows, dtype=torch.long)

    input_ids = padded("input_ids", pad_token_id)
    target_mask = padded("target_mask", 0)
    labels = torch.where(target_mask == 1, input_ids, torch.full_like(input_ids, -100))
    return {"input_ids": input_ids, "attention_mask": padded("attention_mask", 0), "labels": labels}


def trainer_eval_loss(
    model: PreTrainedModel, examples: list[EncodedExample], pad_token_id: int, work: Path
) -> float:
    rows = [
        {
            "input_ids": list(e.input_ids),
            "attention_mask": [1] * len(e.input_ids),
            "target_mask": list(e.target_mask),
        }
        for e in examples
    ]
    args = TrainingArguments(
        output_dir=str(work),
        per_device_eval_batch_size=1,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        eval_dataset=rows,
        data_collator=lambda batch: sft_collate(batch, pad_token_id),
    )
    trainer.remove_callback(PrinterCallback)  # it prints every metrics dict
    return float(trainer.evaluate()["eval_loss"])


def baseline_assignment(
    base_dir: Path, adapter_dir: Path, data: Path, context_length: int, work: Path
) -> tuple[Assignment, list[EncodedExample]]:
    """One assignment as the reference runs it: everything loaded again from disk."""
    phases = Phases()
    with phases.phase("encode"):
        tokenizer = load_tokenizer(base_dir, BASE_NAME)
        encoded = encode_set(read_jsonl(data), get_template(TEMPLATE), tokenizer, context_length)
    with phases.phase("plan + load base"):
        model = AutoModelForCausalLM.from_pretrained(
            base_dir, torch_dtype=torch.float32, use_cache=False
        )
    with phases.phase("apply + restore adapter"):
        model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    with phases.phase("forward + loss"):
        loss = trainer_eval_loss(model, encoded.examples, tokenizer.pad_token_id, work)
    del model
    gc.collect()
    metrics = score_metrics(loss, encoded.total_target_tokens, encoded.total_bytes)
    return Assignment(adapter_dir.name, phases, loss, metrics["bpc"]), encoded.examples


def run_baseline(
    base_dir: Path,
    adapters: list[Path],
    data: Path,
    context_length: int,
    work: Path,
    expected: list[EncodedExample],
) -> SideResult:
    reset_peak_rss()
    rss_start = rss_bytes("VmRSS")
    results = []
    for adapter in adapters:
        result, examples = baseline_assignment(base_dir, adapter, data, context_length, work)
        if examples != expected:
            raise RuntimeError("the baseline encoded different examples from ours")
        results.append(result)
    return SideResult("baseline", results, rss_start, rss_bytes())


# --- CPU report --------------------------------------------------------------------------------


def scored(examples: list[EncodedExample]) -> list[EncodedExample]:
    """Examples with at least one predicted target (position 0 is never predicted)."""
    return [e for e in examples if sum(e.target_mask[1:]) > 0]


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


def print_profile(ours: SideResult, baseline: SideResult) -> None:
    """Median steady-state seconds per phase: where each side spends an assignment."""
    names = ["encode", "plan + load base", "apply + restore adapter", "forward + loss"]
    print(f"\nsteady-state phases (median s)   {'ours':>8} {'baseline':>9}")
    for name in names:
        print(f"  {name:<30} {ours.steady_phase(name):>8.3f} {baseline.steady_phase(name):>9.3f}")
    print(f"  {'total':<30} {ours.steady_seconds():>8.3f} {baseline.steady_seconds():>9.3f}")


def print_throughput(
    ours: SideResult, baseline: SideResult, examples: list[EncodedExample]
) -> None:
    useful = scored(examples)
    tokens = sum(len(e.input_ids) for e in useful)
    lengths = [len(e.input_ids) for e in useful]
    ours_flops = forward_flops(CPU_SHAPE, lengths, sum(sum(e.target_mask[1:]) for e in useful))
    base_flops = forward_flops(CPU_SHAPE, lengths, tokens)
    print(f"\nthroughput over {len(useful)} target-bearing sequences, {tokens} tokens:")
    for side, flops in ((ours, ours_flops), (baseline, base_flops)):
        forward = side.steady_phase("forward + loss")
        print(
            f"  {side.name:<9} {tokens / side.steady_seconds():>8.0f} tokens/s per assignment, "
            f"{tokens / forward:>8.0f} tokens/s in forward + loss, "
            f"{flops / forward / 1e9:>6.1f} GFLOP/s ({flops / 1e12:.2f} TFLOP executed)"
        )
    print(
        f"  FLOP ratio baseline/ours {base_flops / ours_flops:.2f}x: the most skipping "
        "non-target lm_head rows can save; the body forward is the same work on both sides"
    )


def print_memory(ours: SideResult, baseline: SideResult, exact: bool) -> None:
    how = "VmHWM reset per side" if exact else "lifetime ru_maxrss, not per side"
    print(f"\npeak RSS ({how}), whole process incl. interpreter and torch:")
    for side in (ours, baseline):
        print(
            f"  {side.name:<9} peak {side.rss_peak / MIB:>7.0f} MiB "
            f"(RSS at start {side.rss_start / MIB:.0f} MiB)"
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
        count = write_subset(DATA_FILE, data, args.examples)
        print(
            f"model {CPU_SHAPE.name}: Qwen2, hidden {CPU_SHAPE.hidden}, {CPU_SHAPE.layers} layers, "
            f"vocab {CPU_SHAPE.vocab}, {total_params(CPU_SHAPE) / 1e6:.1f}M parameters, fp32; "
            f"{args.adapters} adapters r={args.rank} on q,k,v,o,gate,up,down"
        )
        subset = "all" if not args.examples else f"the first {count} (a fixed subset)"
        print(
            f"data: {DATA_FILE.name}, {subset} of its conversations, template {TEMPLATE}, "
            f"context {context_length}; ours: token_budget {TOKEN_BUDGET}, "
            f"max_batch_size {MAX_BATCH_SIZE}; torch threads {torch.get_num_threads()}"
        )
        print(f"fixtures built in {time.perf_counter() - started:.1f} s\n")
        ours, examples = run_ours(base_dir, adapters, data, context_length)
        gc.collect()
        baseline = run_baseline(base_dir, adapters, data, context_length, tmp / "trainer", examples)
    exact = reset_peak_rss()
    return report_cpu(ours, baseline, examples, exact)


def report_cpu(
    ours: SideResult, baseline: SideResult, examples: list[EncodedExample], exact: bool
) -> int:
    all_ok = print_assignments(ours, baseline)
    ratio = baseline.steady_seconds() / ours.steady_seconds()
    cold = baseline.assignments[0].phases.total / ours.assignments[0].phases.total
    print(
        f"\nsteady state (median of assignments 2..{len(ours.assignments)}): "
        f"ours {ours.steady_seconds():.2f} s, baseline {baseline.steady_seconds():.2f} s, "
        f"ratio baseline/ours {ratio:.2f}x (cold assignment {cold:.2f}x)"
    )
    print_profile(ours, baseline)
    print_throughput(ours, baseline, examples)
    print_memory(ours, baseline, exact)
    verdict = "PASS" if all_ok else "FAIL"
    print(f"\nbpc agreement within {TOLERANCE:g} relative: {verdict}")
    return 0 if all_ok else 1


def print_versions(device: str) -> None:
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, peft {peft.__version__}; "
        f"device {device}, {os.cpu_count()} CPU cores"
    )


# --- GPU mode ----------------------------------------------------------------------------------


def synthetic_examples(
    count: int, context_length: int, vocab: int, seed: int = 0
) -> list[EncodedExample]:
    """Conversations of realistic lengths: a long system/tool prefix, then alternating prompt
    and assistant turns (the targets), truncated to the context; about 35-45% targets."""
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
            ids = torch.tensor([example.input_ids]).cuda()
            mask = torch.tensor([example.target_mask]).cuda()
            labels = torch.where(mask == 1, ids, torch.full_like(ids, -100))
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
            losses.append(out.loss.detach().float())  # no sync per step, like the Trainer
    return torch.stack(losses).tolist()


def ours_losses(model: PreTrainedModel, examples: list[EncodedExample]) -> list[float]:
    return example_losses(
        model, examples, token_budget=TOKEN_BUDGET, max_batch_size=MAX_BATCH_SIZE, pad_token_id=0
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
    shape: Shape, dtype: torch.dtype, examples: list[EncodedExample], peak: float | None
) -> None:
    started = time.perf_counter()
    model = build_on_gpu(shape, dtype)
    print(f"\n{shape.name}: built in {time.perf_counter() - started:.1f} s")
    lengths = [len(e.input_ids) for e in examples]
    rows = sum(sum(e.target_mask[1:]) for e in examples)
    tokens = sum(lengths)
    ours_losses(model, examples[:4])  # warm-up: kernels, cuBLAS handles, allocator
    hf_losses(model, examples[:2])
    ours_s, ours = measure_gpu(
        "ours", lambda: ours_losses(model, examples), forward_flops(shape, lengths, rows), tokens, peak
    )
    base_s, base = measure_gpu(
        "baseline", lambda: hf_losses(model, examples), forward_flops(shape, lengths, tokens), tokens,
        peak,
    )
    ours_mean, base_mean = statistics.fmean(ours), statistics.fmean(base)
    print(
        f"  ratio baseline/ours {base_s / ours_s:.2f}x; mean loss ours {ours_mean:.5f} vs "
        f"baseline {base_mean:.5f} (rel diff {abs(ours_mean - base_mean) / abs(base_mean):.1e}, "
        "rounding of batched vs single forwards in low precision, not checked)"
    )
    del model
    gc.collect()
    torch.cuda.empty_cache()


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
        f"ours: token_budget {TOKEN_BUDGET}, max_batch_size {MAX_BATCH_SIZE}"
    )
    for key in args.models:
        bench_gpu_model(GPU_SHAPES[key], dtype, examples, peak)
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


# --- entry point -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default=None)
    parser.add_argument("--adapters", type=int, default=4, help="CPU: assignments (>= 2)")
    parser.add_argument("--rank", type=int, default=16, help="CPU: LoRA rank")
    parser.add_argument(
        "--examples", type=int, default=64, help="CPU: first N conversations (0: all 299)"
    )
    parser.add_argument("--context-length", type=int, default=None, help="1280 CPU, 4096 GPU")
    parser.add_argument("--gpu-examples", type=int, default=128)
    parser.add_argument(
        "--models", nargs="+", choices=sorted(GPU_SHAPES), default=list(GPU_SHAPES)
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="GPU dense peak")
    parser.add_argument("--dry-run", action="store_true", help="print shapes and counts only")
    args = parser.parse_args(argv)
    if args.adapters < 2:
        parser.error("--adapters must be at least 2: one cold assignment, then steady state")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    transformers.logging.set_verbosity_error()
    if args.dry_run:
        return run_dry(args)
    if args.device == "cuda":
        return run_gpu(args)
    return run_cpu(args)


if __name__ == "__main__":
    sys.exit(main())
