"""The trust boundary for rl (docs/rl-scoring.md, "Reading the policy"): the validator's process
never parses a submitted policy. onnx reads it in a bounded child; a file that costs the parser
more than the child's limits is the submission's failure, and nothing of it outlives the
assignment."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from devkit.tiny_policies import linear_policy, npz_bytes, to_bytes, validation_arrays
from devkit.validator_cli import REPO_ROOT
from modules.rl import RlConfig, RlModule
from modules.rl.schemas import RlInput
from tests.helpers.served_hub import served_hub
from validator.errors import SubmissionRejected, Verdict, classify
from validator.kit import SUBMISSION_LIMITS
from validator.scoring import score

FEATURES, VENUES = 5, 4
MIB = 1024**2
# A scoring run in a fresh interpreter, which reports the parsers its own process imported.
SCORE_AND_LIST_PARSERS = """
import json, sys
from modules.rl import RlConfig, RlModule
from modules.rl.schemas import RlInput
from validator.scoring import score
rl = RlModule(RlConfig(inference_threads=1))
metrics = score(rl, json.loads(sys.argv[1]))
rl.cleanup()
parsers = ("onnx", "onnxruntime", "google.protobuf")
print(json.dumps({"metrics": metrics, "imported": [m for m in parsers if m in sys.modules]}))
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rl-boundary")
    with served_hub(tmp) as hub:
        x, info = validation_arrays(50, FEATURES, VENUES, seed=3)
        hub.add_repo("flock/sets", {"val.npz": npz_bytes(X=x, Info=info)})
        hub.add_repo("alice/policy", {"model.onnx": to_bytes(linear_policy(FEATURES, VENUES))})
        yield hub


def request(hub, repo: str) -> dict:
    url = f"{hub.endpoint}/flock/sets/resolve/main/val.npz"
    return {"hg_repo_id": repo, "validation_set_url": url, "max_params": 10**6}


def many_empty_nodes(count: int) -> bytes:
    """A ModelProto (ir_version 8) whose graph holds `count` empty nodes: two bytes each in the
    file, about 150 bytes each once protobuf has parsed them."""
    graph = b"\x0a\x00" * count
    size, length = len(graph), b""
    while size > 0x7F:
        length += bytes([size & 0x7F | 0x80])
        size >>= 7
    return b"\x08\x08" + b"\x3a" + length + bytes([size]) + graph


def test_the_validators_process_never_imports_a_parser_of_the_policy(hub, tmp_path):
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
    }
    env.pop("HF_TOKEN", None)
    ran = subprocess.run(
        [sys.executable, "-c", SCORE_AND_LIST_PARSERS, json.dumps(request(hub, "alice/policy"))],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout.strip().splitlines()[-1])
    assert np.isfinite(report["metrics"]["average_reward"])  # scored, by the children
    assert report["imported"] == []


def test_a_policy_that_costs_the_parser_its_memory_meets_the_childs_limit(
    hub, tmp_path, monkeypatch, caplog
):
    # 4 MB of empty nodes parse into about 300 MB; the child may take 64 MiB (the kit's limit,
    # shrunk for the test) plus twice the largest policy file the config accepts (8 MiB).
    small = dataclasses.replace(SUBMISSION_LIMITS, memory_bytes=64 * MIB)
    monkeypatch.setattr("modules.rl.policy.SUBMISSION_LIMITS", small, raising=False)
    hub.add_repo("mallory/nodes", {"model.onnx": many_empty_nodes(2_000_000)})
    config = RlConfig(inference_threads=1, max_model_bytes=8 * MIB, work_dir=str(tmp_path))
    rl = RlModule(config)
    with pytest.raises(SubmissionRejected) as refused:
        score(rl, request(hub, "mallory/nodes"))
    assert str(refused.value).startswith("model.onnx: reading it exceeded its memory limit")
    assert classify(refused.value) is Verdict.REJECTED
    assert [r.getMessage() for r in caplog.records if "bounded child" in r.getMessage()] == [
        "model.onnx: the bounded child reading it exceeded its memory limit "
        f"({small.memory_bytes + 2 * config.max_model_bytes} bytes)"
    ]
    assert not list(tmp_path.glob("*/rl-*/inference"))  # never run
    rl.cleanup()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_nothing_of_the_submission_reaches_the_hf_cache_or_outlives_the_assignment(hub, tmp_path):
    rl = RlModule(RlConfig(inference_threads=1, work_dir=str(tmp_path / "work")))
    metrics = rl.validate(RlInput.model_validate(request(hub, "alice/policy")))
    assert np.isfinite(metrics.average_reward)
    assert list((tmp_path / "work").rglob("model.onnx"))  # downloaded into the work area
    hf_home = Path(os.environ["HF_HOME"])  # the shared cache: never the submission's files
    assert [p for p in hf_home.rglob("*") if "policy" in str(p) or p.suffix == ".onnx"] == []
    rl.cleanup()
    assert [p for p in (tmp_path / "work").rglob("*") if p.is_file()] == []
