"""`python run.py llm_judge` in its image against the Fed Ledger simulator, the local Hub and the
local judge: the judge key reaches the container as an env var only, and never a log."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from devkit import DATA_DIR
from devkit.docker_env import launcher_env, run_py_command
from devkit.hf_hub import LocalHub
from devkit.judge_prompts import JudgeSourceServer, write_judge_source
from devkit.judge_server import LocalJudge
from devkit.simulator.process import Simulator, task
from devkit.tiny_chat_models import build_chat_adapter, build_chat_base
from devkit.tiny_repos import files_of
from devkit.validator_cli import REPO_ROOT
from tests.helpers.docker_env import require_engine

BASE = "Qwen/Qwen3.5-0.8B"
KEY = "sk-judge-TEST-1234567890"


@pytest.fixture(scope="module")
def engine():
    return require_engine()


def test_run_py_llm_judge_validates_assignments_in_its_image(engine, tmp_path):
    base = build_chat_base(tmp_path / "base")
    adapter = build_chat_adapter(base, tmp_path / "adapter", BASE, seed=2)
    lines = (DATA_DIR / "chat_sample.jsonl").read_text()
    source = write_judge_source(tmp_path / "judge-source")  # synthetic texts: no GitHub
    with (
        LocalHub(tmp_path / "hub") as hub,
        LocalJudge(["judge-a"], KEY) as judge,
        JudgeSourceServer(source) as texts,
    ):
        hub.add_repo(BASE, files_of(base))
        hub.add_repo("alice/lora", files_of(adapter))
        hub.add_repo("mallory/pickle", {"adapter_config.json": b"{}", "adapter_model.bin": b"\x80"})
        hub.add_repo("flock/sets", {"chat.jsonl": "".join(lines.splitlines(True)[:3]).encode()})
        data = {
            "validation_set_url": f"{hub.endpoint}/flock/sets/resolve/main/chat.jsonl",
            "base_model": "qwen1.5", "context_length": 512, "max_params": 10**9,
            "eval_args": {"eval_require": 1},
        }  # fmt: skip
        repos = ["alice/lora", "mallory/pickle"]
        configs = tmp_path / "configs"
        configs.mkdir()
        (configs / "llm_judge.json").write_text(
            f'{{"supported_base_models": ["{BASE}"], "max_new_tokens": 8, '
            f'"prompt_source": "{texts.url}"}}'
        )
        with Simulator({"tasks": [task(9, repos, task_type="llm_judge", **data)]}, tmp_path) as sim:
            state = f"fv-test-lj-state-{uuid.uuid4().hex[:8]}"
            cache = f"fv-test-lj-hf-{uuid.uuid4().hex[:8]}"
            env = launcher_env(
                HF_ENDPOINT=hub.endpoint, OPENAI_BASE_URL=judge.endpoint, OPENAI_API_KEY=KEY
            )
            try:
                result = subprocess.run(
                    run_py_command(
                        REPO_ROOT, "llm_judge", "--gpus", "none", "--task_ids", "9",
                        "--api-url", sim.api_url, "--max-assignments", "2",
                        "--assignment-lookup-interval", "0.2", "--time-sleep", "0.5",
                        "--state-volume", state, "--hf-cache-volume", cache,
                        "--config-dir", str(configs), "--debug",
                    ),
                    env=env, capture_output=True, text=True, timeout=900,
                )  # fmt: skip
            finally:
                for volume in (state, cache):
                    subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True)
            assert result.returncode == 0, result.stderr[-4000:]
            results = sim.results_by_repo()
    assert results["alice/lora"]["status"] == "completed"
    assert 0 < results["alice/lora"]["data"]["score"] <= 1
    # A submission we cannot load: -999, as the network scores a model it cannot load.
    assert results["mallory/pickle"]["status"] == "completed"
    assert results["mallory/pickle"]["data"]["score"] == -999
    assert len([r for r in judge.requests if r["status"] == 200]) == 3  # 3 prompts, 1 judge
    assert any(path.endswith("/prompt.py") for path in texts.requests)  # fetched at start-up
    assert KEY not in result.stdout + result.stderr
