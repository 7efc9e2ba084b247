"""The llm_judge module's greedy output with flash-linear-attention's kernels against
transformers' torch fallback, on one tiny Qwen3.5-architecture model (random weights, built
here), in one process on a GPU: `python -m bench.llm_judge_fla_check --device cuda`. Runs in
the llm_judge stack; bench/gpu_session_llm_judge.sh runs it on a lent GPU.

The module decides the kernels (`loading.linear_attention_kernels`); this check first holds
that the model the module reads runs fla's kernels in every linear-attention layer (else FAIL:
the GPU figures would be the fallback's), then generates greedily through the module's
`generate`, swaps every layer to the torch path on the same weights (`use_torch_path`) and
generates again. Each answer must be the same, token for token, or part where the torch path's
own logits hold a near-tie between the two tokens (gap within twice the largest logit difference
the two paths show on the same input): kernels that round differently may pick the other of two
tied tokens, never another answer. Exit 1 on any other difference, 2 without CUDA: never a pass
that did not compare.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer

from devkit import DATA_DIR
from devkit.tiny_chat_models import BASE_CONFIG, build_chat_base
from modules.llm_judge.conversation import read_prompts
from modules.llm_judge.generation import render
from modules.llm_judge.loading import linear_attention_kernels, read_model

# A shape with several linear-attention heads and chunks, small enough to build in seconds.
SHAPE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    layer_types=["linear_attention", "full_attention"] * 2,
)
# The largest teacher-forced logit difference, over the logits' standard deviation, that the
# two paths may show: rounding (tf32 dots in the kernels, bf16 weights), not another result.
DRIFT = {torch.float32: 1e-2, torch.bfloat16: 6e-2}


def kernels_of(model) -> set[str]:
    """Where the linear-attention layers' kernels come from: {"fla"}, {"torch"} or both."""
    found = set()
    for module in model.modules():
        if hasattr(module, "chunk_gated_delta_rule"):
            for kernel in (module.chunk_gated_delta_rule, module.recurrent_gated_delta_rule):
                found.add("fla" if kernel.__module__.startswith("fla") else "torch")
            found.add("fla" if type(module.norm).__module__.startswith("fla") else "torch")
    return found


def use_torch_path(model) -> int:
    """Every linear-attention layer of `model` on transformers' torch fallback, the same weights
    (the gated norm rebuilt as transformers' own, its weight copied); the layers changed."""
    changed = 0
    for module in model.modules():
        if not hasattr(module, "chunk_gated_delta_rule"):
            continue
        modeling = sys.modules[type(module).__module__]
        prefix = type(module).__name__.removesuffix("GatedDeltaNet")
        module.chunk_gated_delta_rule = modeling.torch_chunk_gated_delta_rule
        module.recurrent_gated_delta_rule = modeling.torch_recurrent_gated_delta_rule
        old = module.norm
        eps = getattr(old, "eps", None) or old.variance_epsilon  # fla's name, transformers'
        norm = getattr(modeling, f"{prefix}RMSNormGated")(module.head_v_dim, eps=eps)
        norm = norm.to(old.weight.device, old.weight.dtype)
        with torch.no_grad():
            norm.weight.copy_(old.weight)
        module.norm = norm
        changed += 1
    return changed


def greedy(model, prompts: list[list[int]], new_tokens: int, pad: int) -> torch.Tensor:
    """Greedy continuations, left-padded as the module batches them, end of text suppressed so
    that every row runs `new_tokens`: [rows, new_tokens]."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad,
        )
    return out[:, width:].cpu()


def logits_of(model, ids: list[int]) -> torch.Tensor:
    device = next(model.parameters()).device
    with torch.inference_mode():
        return model(torch.tensor([ids], device=device)).logits[0].float().cpu()


def compare(model, prompts: list[list[int]], new_tokens: int, pad: int) -> tuple[list[str], str]:
    """Problems found (empty: the paths agree) and a one-line summary. `model` runs fla's
    kernels on entry and the torch path on return."""
    fla_out = greedy(model, prompts, new_tokens, pad)
    fla_logits = [logits_of(model, p + fla_out[i].tolist()) for i, p in enumerate(prompts)]
    use_torch_path(model)
    if kernels_of(model) != {"torch"}:
        return ["the swap to the torch path left fla kernels in place"], ""
    torch_out = greedy(model, prompts, new_tokens, pad)
    drift, scale = 0.0, 0.0
    for i, prompt in enumerate(prompts):
        torch_logits = logits_of(model, prompt + fla_out[i].tolist())
        drift = max(drift, (torch_logits - fla_logits[i]).abs().max().item())
        scale = max(scale, torch_logits.std().item())
    problems = []
    dtype = next(model.parameters()).dtype
    if drift > DRIFT[dtype] * scale:
        problems.append(f"teacher-forced logits differ by {drift:.3g} (std {scale:.3g})")
    same = ties = 0
    for i, prompt in enumerate(prompts):
        differ = (fla_out[i] != torch_out[i]).nonzero()
        if len(differ) == 0:
            same += 1
            continue
        at = int(differ[0])
        logits = logits_of(model, prompt + torch_out[i, :at].tolist())[-1]
        gap = (logits[torch_out[i, at]] - logits[fla_out[i, at]]).item()
        if gap <= 2 * drift:
            ties += 1
        else:
            problems.append(f"prompt {i}: answers part at token {at} with a logit gap of "
                            f"{gap:.3g}, beyond rounding ({drift:.3g})")  # fmt: skip
    summary = (f"{dtype}: {same} of {len(prompts)} answers identical, {ties} part at a "
               f"near-tie; largest logit difference {drift:.3g} "
               f"(logit std {scale:.3g})")  # fmt: skip
    return problems, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda: the only device it can check")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    args = parser.parse_args(argv)
    if args.device != "cuda" or not torch.cuda.is_available():
        print("error: the fla kernels need a CUDA device; nothing was compared", file=sys.stderr)
        return 2
    kernels = linear_attention_kernels()
    if kernels != "fla":
        print(f"FAIL: the module chose the {kernels} kernels on this GPU (see the warning above)")
        return 1
    BASE_CONFIG.update(SHAPE)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        path = build_chat_base(Path(tmp) / "base")
        for name in args.dtypes:
            dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
            model = read_model(path, dtype).to("cuda").eval()
            tokenizer = AutoTokenizer.from_pretrained(str(path))  # the tiny, trusted one
            if kernels_of(model) != {"fla"}:
                print(f"FAIL: the model read by the module runs {sorted(kernels_of(model))}")
                return 1
            model.generation_config.suppress_tokens = [
                tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]  # fmt: skip
            data = read_prompts(DATA_DIR / "chat_sample.jsonl")
            data += read_prompts(DATA_DIR / "function_calling_sample.jsonl")
            prompts = [render(tokenizer, p.messages, p.tools) for p in data[: args.prompts]]
            problems, summary = compare(model, prompts, args.new_tokens, tokenizer.eos_token_id)
            print(summary)
            for problem in problems:
                print(f"FAIL ({name}): {problem}")
            failed = failed or bool(problems)
            del model
            torch.cuda.empty_cache()
    print("FAIL: fla and torch paths disagree" if failed else "PASS: fla and torch paths agree")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
