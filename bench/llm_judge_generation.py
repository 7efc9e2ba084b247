"""`make bench-llm-judge`: generated tokens per second of the llm_judge module's batched
generation against one prompt at a time (what a validator that loops over prompts does), on the
same model and prompts, in the same run. Runs in the llm_judge stack (.venv-llm_judge).

The model is a Qwen3.5-architecture model built here with random weights (`--hidden`,
`--layers`); prompts are the first `--prompts` lines of the sample chat and function-calling
sets. Sampling is greedy and every answer runs to `--new-tokens` (end of text is suppressed),
so both sides generate the same number of tokens.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from devkit import DATA_DIR
from devkit.tiny_chat_models import BASE_CONFIG, build_chat_base
from modules.llm_judge.conversation import read_prompts
from modules.llm_judge.generation import EndTokens, Request, Sampling, generate, render

DATA = DATA_DIR


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--batch", type=int, default=64, help="rows per batch at most")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = _model(Path(tmp), args.hidden, args.layers)
        if args.device == "cuda":  # bf16 on a GPU, as the module loads models there
            model = model.to("cuda", torch.bfloat16)
        prompts = read_prompts(DATA / "chat_sample.jsonl")
        prompts = (prompts + read_prompts(DATA / "function_calling_sample.jsonl"))[: args.prompts]
        requests = [Request(i, 0, render(tokenizer, p.messages, p.tools))
                    for i, p in enumerate(prompts)]  # fmt: skip
        model.generation_config.suppress_tokens = _stop_tokens(tokenizer)
        sampling = Sampling(0, 1.0, 0, args.new_tokens, token_budget=1 << 22, max_batch=args.batch)
        single = Sampling(0, 1.0, 0, args.new_tokens, token_budget=1 << 20, max_batch=1)
        tokens = len(requests) * args.new_tokens
        ends = EndTokens.of(tokenizer)
        generate(model, requests[:2], sampling, 1, ends)  # warm-up (kernels, caches)
        ours = _timed(lambda: generate(model, requests, sampling, 1, ends))
        baseline = _timed(lambda: [generate(model, [r], single, 1, ends) for r in requests])
    where = torch.cuda.get_device_name() if args.device == "cuda" else (
        f"{torch.get_num_threads()} CPU threads")  # fmt: skip
    print(f"{len(requests)} prompts x {args.new_tokens} new tokens, hidden {args.hidden}, "
          f"{args.layers} layers, {where}")  # fmt: skip
    print(f"batched:          {tokens / ours:8.1f} tokens/s ({ours:.2f} s)")
    print(f"one at a time:    {tokens / baseline:8.1f} tokens/s ({baseline:.2f} s)")
    print(f"ratio:            {baseline / ours:8.2f}x")


def _model(tmp: Path, hidden: int, layers: int):
    BASE_CONFIG.update(
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        layer_types=["linear_attention", "full_attention"] * (layers // 2),
    )
    path = build_chat_base(tmp / "base")
    return AutoModelForCausalLM.from_pretrained(str(path)).eval(), AutoTokenizer.from_pretrained(
        str(path)
    )


def _stop_tokens(tokenizer) -> list[int]:
    return [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]


def _timed(work) -> float:
    began = time.perf_counter()
    work()
    return time.perf_counter() - began


if __name__ == "__main__":
    main()
