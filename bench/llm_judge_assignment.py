"""A whole llm_judge assignment, ours against the network's way, on the same model, set and
judge: `python -m bench.llm_judge_assignment --device cuda --shape 0.8b`. Runs in the llm_judge
stack (.venv-llm_judge here; bench/gpu_session_llm_judge.sh on a lent GPU).

- **ours**: the module's own code: `load` with its warm base (kept where the model runs: in host
  memory, or on the card), the chat template rendered and tokenized in
  the module's bounded child (the answers decoded in another: "render" counts both), batched
  generation (`generation.generate`, the module's config), the warm base released, then every
  answer judged through the module's `Judge` (`judge_concurrency` in
  flight). Linear attention on the kernels the module chose (fla on a GPU when it imports).
- **network**: the model read from disk and the adapter merged for the assignment, moved to the
  device, then one conversation at a time: the template rendered in-process, plain `generate` of
  that one prompt, then its judge calls one after another. Linear attention on transformers'
  torch fallback by default (`--network-kernels torch`: the network's environment has no
  fla-core); `same` gives it the module's kernels, to separate the two gains.

Both sides sample as the module does (temperature 0.7, top_p 0.8, top_k 20) with the end of
text suppressed, so every answer is `--new-tokens` long and both generate the same number of
tokens. The judge is devkit's local OpenAI-compatible server (instant, deterministic grades), so
the judging figures are the client's own cost. The network's way at real shapes takes minutes
per assignment: `--network-prompts K` runs its first K conversations and scales its per-
conversation time to the set (printed as such). The model is a Qwen3.5-architecture model with
random weights built here from a config (`--shape`: tiny, 0.8b, 2b; the real shapes as recalled,
not read from the Hub), with devkit's tiny tokenizer; the adapter is random, rank `--rank`.
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from peft import PeftModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from bench.llm_judge_fla_check import kernels_of, use_torch_path
from bench.llm_judge_warm_base import BASE, SHAPE_0_8B, _adapter
from devkit import DATA_DIR
from devkit.judge_server import LocalJudge
from devkit.tiny_chat_models import build_chat_base
from modules.llm_judge import loading
from modules.llm_judge.conversation import Prompt, read_prompts
from modules.llm_judge.generation import EndTokens, Request, Sampling, decode, generate, render
from modules.llm_judge.inspection import inspect_adapter
from modules.llm_judge.judge_texts import load_judge_texts
from modules.llm_judge.judging import Judge, score_answers
from modules.llm_judge.loading import device_and_dtype, linear_attention_kernels, load, read_model
from modules.llm_judge.schemas import EvalArgs, LlmJudgeConfig
from modules.llm_judge.submission import Submission
from modules.llm_judge.templating import TemplateLimits, decode_answers, encode_prompts
from validator.kit import WarmBase

# Qwen3.5-2B's text model as we recall it (not read from the Hub: no network where it runs).
SHAPE_2B = {**SHAPE_0_8B, "hidden_size": 2048, "intermediate_size": 6144}
SHAPES = {"0.8b": SHAPE_0_8B, "2b": SHAPE_2B}
KEY = "sk-bench-judge-0000000000"
DEFAULTS = LlmJudgeConfig.model_fields


@dataclass
class Side:
    """Seconds per phase of one assignment, and the tokens it generated."""

    phases: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    kernels: str = ""
    score: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.phases.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", choices=["tiny", *SHAPES], default="tiny")
    parser.add_argument("--prompts", type=int, default=16, help="conversations in the set")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--network-prompts", type=int, default=0, help="0: the whole set")
    parser.add_argument("--network-kernels", choices=["torch", "same"], default="torch")
    parser.add_argument("--assignments", type=int, default=2, help="ours; the first warms up")
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but torch sees no CUDA device")
    if args.device == "cpu" and torch.cuda.is_available():
        raise SystemExit("error: a CUDA device is present; the module would use it: --device cuda")
    device, dtype = device_and_dtype()
    eval_args = EvalArgs()
    with tempfile.TemporaryDirectory() as tmp, LocalJudge(["judge-a"], KEY) as server:
        work = Path(tmp)
        base = _base(work, args.shape, dtype)
        adapter = _adapter(base, work / "adapter", args.rank, seed=1)
        loading.fetch_base_model = lambda _repo: base  # the module's fetch, without the Hub
        prompts = read_prompts(DATA_DIR / "chat_sample.jsonl")
        prompts = prompts + read_prompts(DATA_DIR / "function_calling_sample.jsonl")
        prompts = prompts[: args.prompts]
        texts = load_judge_texts("builtin", work / "cache")
        sampling = Sampling(
            DEFAULTS["temperature"].default,
            DEFAULTS["top_p"].default,
            DEFAULTS["top_k"].default,
            args.new_tokens,
            DEFAULTS["generation_token_budget"].default,
            DEFAULTS["max_generation_batch"].default,
        )
        judge = Judge(server.endpoint, KEY, 60.0, 0, DEFAULTS["judge_concurrency"].default)
        one_by_one = Judge(server.endpoint, KEY, 60.0, 0, 1)
        warm = WarmBase(lambda source: read_model(source, dtype))
        job = (adapter, prompts, texts, eval_args, sampling, work)
        ours = [_ours(warm, judge, *job) for _ in range(args.assignments)]
        warm.drop()
        _free()
        network, scaled = _network(one_by_one, device, dtype, args, *job)
        parameters = _parameters(base)
    _print(args, device, dtype, ours, network, scaled, parameters)


def _ours(warm, judge, adapter, prompts, texts, eval_args, sampling, work) -> Side:
    side = Side()
    began = time.perf_counter()
    loaded = load(_submission(adapter), warm, "bench")
    _suppress_end(loaded)
    side.phases["load"] = _lap(began)
    side.kernels = "+".join(sorted(kernels_of(loaded.model)))
    began = time.perf_counter()
    bounded = {
        "submitted": False,
        "limits": TemplateLimits.of(LlmJudgeConfig(supported_base_models=[BASE])),
        "work": work / "tokenizer",
    }
    items = [(p.messages, p.tools, p.fallback) for p in prompts]
    encoded = encode_prompts(loaded.tokenizer_dir, items, **bounded)
    side.phases["render"] = _lap(began)
    requests = [Request(i, r, encoded.ids[i]) for i in range(len(prompts))
                for r in range(eval_args.gen_require)]  # fmt: skip
    began = time.perf_counter()
    ends = EndTokens(encoded.eos_token_id, encoded.pad_token_id)
    generated = generate(loaded.model, requests, sampling, 1, ends)
    _sync()
    side.phases["generate"] = _lap(began)
    began = time.perf_counter()
    keys = list(generated)
    decoded = decode_answers(loaded.tokenizer_dir, [generated[k] for k in keys], **bounded)
    answers = dict(zip(keys, decoded, strict=True))
    side.phases["render"] += _lap(began)  # the tokenizer's children: both ops
    side.tokens = len(requests) * sampling.max_new_tokens
    began = time.perf_counter()
    warm.release("bench")
    del loaded
    _free()
    side.phases["release"] = _lap(began)
    began = time.perf_counter()
    side.score = score_answers(judge, texts, eval_args, prompts, answers, judge.resolve_models([]))
    side.phases["judge"] = _lap(began)
    return side


def _network(judge, device, dtype, args, adapter, prompts, texts, eval_args, sampling, work):
    """The network's way; returns the side (scaled to the whole set) and whether it was."""
    side = Side()
    began = time.perf_counter()
    source = loading.fetch_base_model(BASE)
    model, tokenizer = read_model(source, dtype), AutoTokenizer.from_pretrained(str(source))
    model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    model = model.to(device).eval()
    if args.network_kernels == "torch":
        use_torch_path(model)
    _suppress_end_of(model, tokenizer)
    side.phases["load"] = _lap(began)
    side.kernels = "+".join(sorted(kernels_of(model)))
    single = Sampling(sampling.temperature, sampling.top_p, sampling.top_k,
                      sampling.max_new_tokens, sampling.token_budget, max_batch=1)  # fmt: skip
    ends = EndTokens.of(tokenizer)
    count = args.network_prompts or len(prompts)
    count = min(count, len(prompts))
    render_s = generate_s = judge_s = 0.0
    grades = []
    for index, prompt in enumerate(prompts[:count]):
        began = time.perf_counter()
        ids = render(tokenizer, prompt.messages, prompt.tools)
        render_s += _lap(began)
        began = time.perf_counter()
        answers = {}
        for repeat in range(eval_args.gen_require):
            generated = generate(model, [Request(index, repeat, ids)], single, 1, ends)
            answers.update(decode(tokenizer, generated))
        _sync()
        generate_s += _lap(began)
        began = time.perf_counter()
        grades.append(score_answers(judge, texts, eval_args, _only(prompts, index), answers,
                                    judge.resolve_models([])))  # fmt: skip
        judge_s += _lap(began)
    scale = len(prompts) / count
    side.phases.update(render=render_s * scale, generate=generate_s * scale, judge=judge_s * scale)
    side.tokens = len(prompts) * eval_args.gen_require * sampling.max_new_tokens
    side.score = statistics.mean(grades)
    began = time.perf_counter()
    del model
    _free()
    side.phases["release"] = _lap(began)
    return side, count < len(prompts)


def _only(prompts: list[Prompt], index: int) -> list[Prompt]:
    """The set as score_answers indexes it, for the one answer of conversation `index`."""
    return prompts[: index + 1]


def _print(args, device, dtype, ours: list[Side], network: Side, scaled: bool, parameters):
    where = torch.cuda.get_device_name() if device == "cuda" else (
        f"{torch.get_num_threads()} CPU threads, {platform.machine()}")  # fmt: skip
    print(f"python {platform.python_version()}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, {where}; kernels chosen by the module: "
          f"{linear_attention_kernels()}")  # fmt: skip
    print(f"shape {args.shape} ({parameters / 1e6:.0f}M parameters, {dtype}), LoRA rank "
          f"{args.rank}; {args.prompts} conversations x {args.new_tokens} new tokens, sampled; "
          f"judge: local stand-in")  # fmt: skip
    steady = ours[1:] or ours
    best = min(steady, key=lambda s: s.total)
    rows = [("ours, first (warm-up)", ours[0]), ("ours, steady", best), ("network", network)]
    print(f"{'side':<24}{'kernels':>10}{'load':>8}{'render':>8}{'generate':>10}{'release':>9}"
          f"{'judge':>8}{'total s':>9}{'gen tok/s':>11}{'tok/s':>9}")  # fmt: skip
    for name, side in rows:
        p = side.phases
        print(f"{name:<24}{side.kernels:>10}{p['load']:8.2f}{p['render']:8.2f}"
              f"{p['generate']:10.2f}{p['release']:9.2f}{p['judge']:8.2f}{side.total:9.2f}"
              f"{side.tokens / p['generate']:11.1f}{side.tokens / side.total:9.1f}")  # fmt: skip
    if scaled:
        print(f"network: its first {args.network_prompts} conversations run, scaled to the set")
    ratio = network.total / best.total
    verdict = "PASS" if ratio >= 10 else "FAIL"
    print(f"per assignment, network / ours: {ratio:.1f}x (target 10x: {verdict}); generation "
          f"alone {network.phases['generate'] / best.phases['generate']:.1f}x")  # fmt: skip


def _base(tmp: Path, shape: str, dtype: torch.dtype) -> Path:
    """The tests' tiny base; at a real shape its weights are replaced by random ones of that
    shape, saved in the dtype the module reads them in on this device."""
    path = build_chat_base(tmp / "base")
    if shape in SHAPES:
        config = AutoConfig.from_pretrained(str(path))
        spec = SHAPES[shape]
        layer_types = spec["layer_types"] * (spec["num_hidden_layers"] // 4)
        for key, value in {**spec, "layer_types": layer_types, "vocab_size": 248320}.items():
            setattr(config, key, value)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.save_pretrained(str(path))
        del model
    return path


def _parameters(base: Path) -> int:
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(base)))
    return sum(p.numel() for p in model.parameters())


def _submission(adapter: Path) -> Submission:
    # The bench's own adapter, read by the module's child as fetch_submission has it read.
    facts = inspect_adapter(adapter, "adapter_model.safetensors", adapter.parent / "inspect")
    return Submission(adapter, "0" * 40, BASE, None, facts.ranks(), tuple(facts.weights.listing))


def _suppress_end(loaded) -> None:
    _suppress_end_of(loaded.model, AutoTokenizer.from_pretrained(str(loaded.tokenizer_dir)))


def _suppress_end_of(model, tokenizer) -> None:
    """Every answer runs to the token limit on both sides: the same work, the same count."""
    model.generation_config.suppress_tokens = [
        tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]  # fmt: skip


def _lap(began: float) -> float:
    return time.perf_counter() - began


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
