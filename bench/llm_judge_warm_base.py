"""`make bench-llm-judge-warm`: the llm_judge module's model work per LoRA assignment, a warm
base (merge into the kept base, copy the merged weights back, check the fingerprint) against
the reload the module did before and the network does (read the base from disk, merge), in the
same run, through the module's own `load`. Runs in the llm_judge stack (.venv-llm_judge).

The base is a Qwen3.5-architecture model with random weights, built here: `--shape tiny` is the
tests' (devkit/tiny_chat_models.py), `--shape 0.8b` approximates Qwen3.5-0.8B's dimensions
(about 3 GiB of fp32 weights; needs about 12 GiB of free memory). Adapters are random, rank
`--rank` on every attention and MLP projection; the sides alternate per assignment, and every
warm merge is compared bit for bit with the reload's. Generation is left out: it is the same
work on the same weights on both sides (`make bench-llm-judge` measures it).

`--device cuda` (a lent GPU, bench/gpu_session.sh): the warm base is kept on the card, as the
module keeps it there; the reload is the network's way (read on the CPU, merge, copy to the
card), and every warm merge on the card is compared bit for bit with it. The fingerprint check
alone is timed too, against the warm side's model work (target: at most 10% of it), and, with
`--decode-steps K`, against one decode step of one answer on the same weights: an assignment's
generation runs up to `max_new_tokens` (2048) such steps per batch of answers.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

from devkit.tiny_chat_models import build_chat_base
from modules.llm_judge import loading
from modules.llm_judge.inspection import inspect_adapter
from modules.llm_judge.loading import load, read_model
from modules.llm_judge.submission import Submission
from validator.kit import WarmBase

BASE = "Qwen/Qwen3.5-0.8B"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# Qwen3.5-0.8B's text model as we recall it (hidden 1024, 24 layers, 3 linear-attention layers
# to 1 full, tied embeddings, vocabulary 248320), not read from the Hub: no network here. The
# bench's tokenizer is the tiny one, so the vocabulary is padded to this size.
SHAPE_0_8B = dict(
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=24,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    layer_types=["linear_attention"] * 3 + ["full_attention"],  # repeated
    tie_word_embeddings=True,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["tiny", "0.8b"], default="tiny")
    parser.add_argument("--adapters", type=int, default=3, help="distinct adapters, in turn")
    parser.add_argument("--assignments", type=int, default=7, help="per side")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--decode-steps",
        type=int,
        default=0,
        help="also time this many decode steps of one answer on the warm base (0: no)",
    )
    args = parser.parse_args()
    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the module's (loading.py)
    with tempfile.TemporaryDirectory() as tmp:
        base = _base(Path(tmp), args.shape)
        adapters = [_adapter(base, Path(tmp) / f"adapter-{i}", args.rank, i) for i in range(3)]
        adapters = (adapters * args.adapters)[: args.adapters]
        # The module's fetch of a supported base, without the Hub: the folder built here.
        loading.fetch_base_model = lambda _repo: base
        loading.device_and_dtype = lambda: (device, dtype)
        warm = WarmBase(lambda source: read_model(source, dtype, device))
        cold_first, ours, reload, exact = _measure(warm, adapters, args.assignments, device)
        parameters = sum(p.numel() for p in warm.held.model.parameters())
        check = _timed_check(warm, device)
        step = _timed_decode_step(warm.held.model, args.decode_steps, device)
    print(f"python {platform.python_version()}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, peft {peft.__version__}, {torch.get_num_threads()} "
          f"CPU threads, {platform.machine()}")  # fmt: skip
    print(f"shape {args.shape}: {parameters / 1e6:.1f}M parameters, {str(dtype)[6:]} on {device}; "
          f"LoRA rank {args.rank} "
          f"on {', '.join(TARGETS)}; {args.adapters} adapters in turn, {args.assignments} "
          f"assignments per side")  # fmt: skip
    same = "all" if all(exact) else "NOT ALL"
    print(f"warm merges bit-identical to the reload's: {same} ({sum(exact)} of {len(exact)}); "
          f"base reads from disk, warm side: {warm.loads}")  # fmt: skip
    print(f"reload (baseline), median s/assignment:   {statistics.median(reload):8.3f}")
    print(f"warm base, first assignment (reads):      {cold_first:8.3f}")
    print(f"warm base, later assignments, median:     {statistics.median(ours):8.3f}")
    print(f"ratio reload / warm:                      "
          f"{statistics.median(reload) / statistics.median(ours):8.1f}x")  # fmt: skip
    share = check / statistics.median(ours)
    print(f"fingerprint check alone, median of 3 s:   {check:8.3f} ({share:.0%} of the warm side's "
          f"model work, {check / statistics.median(reload):.0%} of a reload)")  # fmt: skip
    if step:
        print(f"one decode step (one answer), s:          {step:8.3f} (the check costs "
              f"{check / step:.1f} steps; an assignment runs up to max_new_tokens of them per "
              f"batch of answers, 2048 by default)")  # fmt: skip


def _measure(warm: WarmBase, adapters: list[Path], assignments: int, device: str):
    """Seconds of model work per assignment on each side, alternating, and whether each warm
    merge equalled the reload's bit for bit."""
    cold_first = _timed_warm(warm, adapters[0], device)[0]
    ours, reload, exact = [], [], []
    for n in range(assignments):
        adapter = adapters[n % len(adapters)]
        seconds, reloaded = _timed_reload(adapter, device)
        reload.append(seconds)
        seconds, merged = _timed_warm(warm, adapter, device, keep=reloaded)
        ours.append(seconds)
        exact.append(merged)
        print(f"  assignment {n + 1}: reload {reload[-1]:.3f} s, warm {ours[-1]:.3f} s, "
              f"bit-identical {merged}", flush=True)  # fmt: skip
    return cold_first, ours, reload, exact


def _timed_check(warm: WarmBase, device: str) -> float:
    """The fingerprint check of the warm base alone (what `release` adds), median of 3."""
    held, times = warm.held, []
    for _ in range(3):
        _sync(device)
        began = time.perf_counter()
        assert held.fingerprint.differences(held.model) == []
        _sync(device)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


@torch.no_grad()
def _timed_decode_step(model: torch.nn.Module, steps: int, device: str) -> float:
    """Seconds per decode step of one answer on the base (greedy, a short prompt, the prompt's
    prefill and the first token taken out by timing `steps` + 1 against 1 new token), the unit
    of an assignment's generation: each step reads every weight once, as the check does."""
    if steps <= 0:
        return 0.0
    prompt = torch.arange(1, 17, device=device).unsqueeze(0)

    def timed(new: int) -> float:
        _sync(device)
        began = time.perf_counter()
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                       min_new_tokens=new, do_sample=False)  # fmt: skip
        _sync(device)
        return time.perf_counter() - began

    timed(1)  # the first call's one-off costs (kernels chosen, caches made)
    return (timed(steps + 1) - timed(1)) / steps


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed_reload(adapter: Path, device: str) -> tuple[float, dict[str, torch.Tensor]]:
    """The module's code before the warm base (and the network's way): read on the CPU, merge,
    move to the device; the model dropped after use. The copy kept for the comparison is made
    outside the timed parts."""
    began = time.perf_counter()
    loaded = load(_submission(adapter), device=device)
    _sync(device)
    seconds = time.perf_counter() - began
    state = {name: t.clone() for name, t in loaded.model.state_dict().items()}
    began = time.perf_counter()
    del loaded
    gc.collect()
    return seconds + time.perf_counter() - began, state


def _timed_warm(
    warm: WarmBase, adapter: Path, device: str, keep: dict | None = None
) -> tuple[float, bool]:
    """Ours: merge into the warm base; afterwards copy back and check the fingerprint."""
    began = time.perf_counter()
    loaded = load(_submission(adapter), warm, "bench", device=device)
    _sync(device)
    seconds = time.perf_counter() - began
    exact = keep is None or _equal(loaded.model.state_dict(), keep)
    began = time.perf_counter()
    del loaded
    warm.release("bench")
    _sync(device)
    return seconds + time.perf_counter() - began, exact


def _equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def _submission(adapter: Path) -> Submission:
    # The bench's own adapter, read by the module's child as fetch_submission has it read.
    facts = inspect_adapter(adapter, "adapter_model.safetensors", adapter.parent / "inspect")
    return Submission(adapter, "0" * 40, BASE, None, facts.ranks(), tuple(facts.weights.listing))


def _base(tmp: Path, shape: str) -> Path:
    """The tests' tiny base; at 0.8b its weights are replaced by a model of that shape."""
    path = build_chat_base(tmp / "base")
    if shape == "0.8b":
        config = AutoConfig.from_pretrained(str(path))
        layer_types = SHAPE_0_8B["layer_types"] * (SHAPE_0_8B["num_hidden_layers"] // 4)
        for key, value in {**SHAPE_0_8B, "layer_types": layer_types, "vocab_size": 248320}.items():
            setattr(config, key, value)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
    return path


def _adapter(base: Path, dest: Path, rank: int, seed: int) -> Path:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base))
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank,
                                                  target_modules=TARGETS))  # fmt: skip
    for name, parameter in peft_model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: a no-op adapter would prove nothing
            torch.nn.init.normal_(parameter, std=0.02)
    peft_model.save_pretrained(str(dest), safe_serialization=True)
    config = json.loads((dest / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = BASE
    (dest / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return dest


if __name__ == "__main__":
    main()
