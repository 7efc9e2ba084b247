"""Parameter bounds before any allocation: a full model's config is
counted on the meta device in a bounded child before any weight is downloaded or built, and a
safetensors header that the Hub library refuses (over 25 MB) is a clean rejection (-999), not a
module bug. Real parts: the local Hub, the local judge, the module end to end in a child
process whose peak memory is measured."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from devkit.tiny_chat_models import build_chat_base
from devkit.tiny_repos import files_of
from devkit.validator_cli import REPO_ROOT
from modules.llm_judge.inspection import inspect_headers, inspect_model
from modules.llm_judge.submission import fetch_submission
from tests.helpers.served_hub import served_hub
from validator.errors import SubmissionRejected

BASE = "Qwen/Qwen3.5-0.8B"
# 32 layers at hidden 2048: about 2.1e9 parameters, 8.5 GB as float32, described by a config
# beside the tiny base's weights (tens of kB).
BIG = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "layer_types": ["linear_attention", "full_attention"] * 16,
}
# Generous: the module's own growth while it refuses the model. Building it takes gigabytes.
MAX_GROWTH_KB = 500 * 1024
MAX_COUNTER_KB = 1536 * 1024  # the counting child: torch and transformers, the meta model

SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    from pathlib import Path
    from devkit.judge_prompts import write_judge_source
    from devkit.judge_server import LocalJudge
    from devkit.tiny_repos import files_of
    from devkit.hf_hub import LocalHub
    from modules.llm_judge import LlmJudgeConfig, LlmJudgeModule
    from validator.scoring import score
    import os

    tmp, base, big_config = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    write_judge_source(tmp / "judge-source")
    with LocalHub(tmp / "hub") as hub, LocalJudge(["judge-a"], "sk-test-1") as judge:
        os.environ.update(
            HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp / "hf"), OPENAI_BASE_URL=judge.endpoint,
            OPENAI_API_KEY="sk-test-1",
        )
        os.environ.pop("HF_TOKEN", None)
        hub.add_repo("mallory/big", {**files_of(base), "config.json": big_config.encode()})
        hub.add_repo("flock/sets", {"chat.jsonl": b'{"messages": []}'})
        module = LlmJudgeModule(LlmJudgeConfig(
            supported_base_models=["Qwen/Qwen3.5-0.8B"], prompt_source=str(tmp / "judge-source"),
            work_dir=str(tmp / "work"),
        ))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scores = []
        for max_params in (10**12, 10**9):  # headers far below the config; the config over
            raw = {
                "hg_repo_id": "mallory/big",
                "validation_set_url": f"{hub.endpoint}/flock/sets/resolve/main/chat.jsonl",
                "base_model": "qwen1.5", "context_length": 512, "max_params": max_params,
                "eval_args": {"eval_require": 1, "eval_model_list": ["judge-a"]},
            }
            scores.append(score(module, raw)["score"])
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        counter = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"scores": scores, "growth_kb": after - before, "counter_kb": counter}))
    """
)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_chat_base(tmp_path_factory.mktemp("bounds") / "base")


def test_a_config_far_beyond_its_weights_scores_minus_999_without_being_built(base, tmp_path):
    config = {**json.loads((base / "config.json").read_text()), **BIG}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(base), json.dumps(config)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Weights missing for the config (max_params 1e12), then a config over max_params (1e9).
    assert result["scores"] == [-999.0, -999.0], result
    assert result["growth_kb"] < MAX_GROWTH_KB, result
    assert result["counter_kb"] < MAX_COUNTER_KB, result
    assert "the weights are missing" in done.stderr and "over 1000000000" in done.stderr


def test_a_config_of_a_million_layers_meets_the_childs_limits(base, tmp_path, monkeypatch):
    from modules.llm_judge import inspection
    from validator.kit import boundary
    from validator.sandbox.child_process import ChildLimits

    # Shrunk limits: the module objects of 10**6 layers alone would take tens of GB. (Its
    # list of layer types alone is over the re-read bound, which the build is checked past.)
    monkeypatch.setattr(inspection, "MAX_REREAD_BYTES", 1024**3)
    limits = ChildLimits(wall_seconds=300.0, memory_bytes=256 * 1024**2)
    monkeypatch.setattr(boundary.inspect_in_child, "__kwdefaults__", {
        **boundary.inspect_in_child.__kwdefaults__, "limits": limits
    })  # fmt: skip
    config = {**json.loads((base / "config.json").read_text()), "num_hidden_layers": 10**6}
    config["layer_types"] = ["full_attention"] * 10**6
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(SubmissionRejected, match="reading it exceeded its memory limit"):
        inspect_model(folder, tmp_path / "work")


def test_a_safetensors_header_over_25_mb_is_a_clean_rejection(base, tmp_path):
    # The header's length says 30 MB: huggingface_hub's metadata reader refused it (its limit
    # is 25 MB), which took the module-bug path (3 attempts, tracebacks) before; the child
    # reading the downloaded file's first bytes finds it longer than the file.
    weights = (30_000_000).to_bytes(8, "little") + b"{" + b" " * 200_000
    with served_hub(tmp_path) as hub:
        hub.add_repo("mallory/header", {**files_of(base), "model.safetensors": weights})
        with pytest.raises(SubmissionRejected, match="a header of 30000000 bytes in a file of"):
            fetch_submission(
                "mallory/header", "main", tmp_path / "dest", [BASE], 10**9, 10**10, 10**9
            )


def test_a_header_whose_dtype_is_a_list_is_a_clean_rejection(tmp_path):
    # `dtype not in DTYPE_BITS` raised TypeError (a list is unhashable) outside the child's
    # refusals: exit 1 and a traceback, the module-bug path (3 attempts) for the file's fault.
    folder = tmp_path / "submission"
    folder.mkdir()
    header = json.dumps({"x": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"0000")
    with pytest.raises(SubmissionRejected, match="tensor 'x' has no known dtype"):
        inspect_headers(folder, ["model.safetensors"], tmp_path / "work")
