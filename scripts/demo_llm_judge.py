"""`make demo` (third part): the llm_judge validator end to end, offline, through its image.

Builds a tiny Qwen3.5-architecture base, a LoRA adapter on it and a pickle-only adapter here,
serves them and a validation set from a HuggingFace-style hub on 127.0.0.1, starts a local
OpenAI-compatible judge and the Fed Ledger simulator with one task of those submissions, runs
`python run.py llm_judge` (no GPU here) until they are finished, and prints what the simulator
received (each penalty with why) and where to look (scripts/demo_look.py; `make demo-serve
DEMO=llm_judge` keeps it serving its status page). Runs in the llm_judge stack
(.venv-llm_judge; the Makefile picks it).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

from devkit import DATA_DIR, REPO_ROOT
from devkit.demo_secrets import API_KEY, HF_TOKEN, JUDGE_KEY, run_checking_log
from devkit.hf_hub import LocalHub
from devkit.judge_prompts import JudgeSourceServer, write_judge_source
from devkit.judge_server import LocalJudge
from devkit.simulator.process import Simulator, task
from devkit.tiny_chat_models import build_chat_adapter, build_chat_base
from devkit.tiny_repos import files_of
from scripts.demo_look import (
    expect_reasons,
    print_results,
    remove_volumes,
    run_args,
    serve_until_stopped,
    serving,
    where_to_look,
)

BASE = "Qwen/Qwen3.5-0.8B"
SET = DATA_DIR / "chat_sample.jsonl"


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="flock-demo-llm-judge-") as tmp_name:
        tmp = Path(tmp_name)
        print("building a tiny Qwen3.5-architecture base and adapters ...", flush=True)
        base = build_chat_base(tmp / "base")
        # Judge texts of the network's shape, with this project's wording, served here: the
        # validator fetches them as it fetches the network's, without reaching GitHub.
        source = write_judge_source(tmp / "judge-source")
        with (
            LocalHub(tmp / "hub") as hub,
            LocalJudge(["judge-a", "judge-b"], JUDGE_KEY) as judge,
            JudgeSourceServer(source) as texts,
        ):
            hub.add_repo(BASE, files_of(base))
            for seed in (1, 2):
                adapter = build_chat_adapter(base, tmp / f"adapter{seed}", BASE, seed)
                hub.add_repo(f"trainer{seed}/qwen35-lora", files_of(adapter))
            hub.add_repo(
                "mallory/pickle", {"adapter_config.json": b"{}", "adapter_model.bin": b"\x80"}
            )
            hub.add_repo("flock/sets", {"chat.jsonl": SET.read_bytes()})
            repos = ["trainer1/qwen35-lora", "trainer2/qwen35-lora", "mallory/pickle"]
            data = {
                "validation_set_url": f"{hub.endpoint}/flock/sets/resolve/main/chat.jsonl",
                "base_model": "qwen1.5", "context_length": 1024, "max_params": 10**9,
                "eval_args": {"eval_require": 2, "eval_model_list": ["judge-a", "judge-b-low"]},
            }  # fmt: skip
            configs = tmp / "configs"
            configs.mkdir()
            (configs / "llm_judge.json").write_text(
                json.dumps(
                    {
                        "supported_base_models": [BASE],
                        "max_new_tokens": 16,
                        "prompt_source": texts.url,
                    }
                )
            )
            with Simulator({"tasks": [task(1, repos, task_type="llm_judge", **data)]}, tmp) as sim:
                code = run_validator(sim, hub.endpoint, judge.endpoint, configs, len(repos))
            print(f"{len(judge.requests)} judge calls")
        return code


def scores(data: dict) -> str:
    value = data.get("score")
    return "" if value is None else f"score={value:.4f}"


def run_validator(sim: Simulator, hub_url: str, judge_url: str, configs: Path, count: int) -> int:
    volumes = f"flock-validator-demo-lj-{uuid.uuid4().hex[:8]}"
    state = f"{volumes}-state"
    command = [
        sys.executable, str(REPO_ROOT / "run.py"), "llm_judge",
        "--gpus", os.environ.get("GPUS", "none"), "--task_ids", "1", "--api-url", sim.api_url,
        *run_args(count),
        "--assignment-lookup-interval", "0.5", "--time-sleep", "2",
        "--state-volume", state, "--hf-cache-volume", f"{volumes}-hf",
        "--config-dir", str(configs),
    ]  # fmt: skip
    env = {
        **os.environ,
        "HF_ENDPOINT": hub_url,
        "FLOCK_API_KEY": API_KEY,
        "HF_TOKEN": HF_TOKEN,
        "OPENAI_BASE_URL": judge_url,
        "OPENAI_API_KEY": JUDGE_KEY,
    }
    print(f"$ python run.py llm_judge --task_ids 1 {' '.join(run_args(count))} ...", flush=True)
    show = functools.partial(print_results, sim, None, "llm_judge", state, scores)
    if serving():  # its state is kept
        try:
            return serve_until_stopped(command, env, sim, count, show, state)
        finally:
            remove_volumes(f"{volumes}-hf")
    try:
        code = run_checking_log(command, REPO_ROOT, env)
        shown = print_results(sim, code, "llm_judge", state, scores)
        code = code or expect_reasons(shown, {"mallory/pickle": "cannot_load"})
        return where_to_look("llm_judge", state) or code
    finally:
        remove_volumes(state, f"{volumes}-hf")


if __name__ == "__main__":
    sys.exit(main())
