"""The rl module end to end in this process: policies served by a local Hub through the real
huggingface_hub code, validation sets over HTTP, scores against a plain float32 computation,
and every hostile case with its intended outcome."""

from __future__ import annotations

import io
import json
import logging
import re
import zipfile

import numpy as np
import onnx
import pytest

from devkit.tiny_policies import (
    linear_policy,
    nan_policy,
    npz_bytes,
    padded_policy,
    point_external_data,
    save_external,
    to_bytes,
    validation_arrays,
    weights,
)
from devkit.validator_cli import REPO_ROOT, run_validator, validator_env
from modules.rl import RlConfig, RlModule
from tests.helpers.assignment_log import check_assignment_lines, run_assignments
from tests.helpers.hostile_listings import HOSTILE_LISTINGS
from tests.helpers.served_hub import served_hub
from tests.rl.test_rl_reward import plain_reward
from validator.errors import SubmissionRejected, Verdict, classify
from validator.scoring import InvalidInput, score

FEATURES, VENUES, ROWS = 5, 4, 600


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rl")
    with served_hub(tmp) as hub:
        x, info = validation_arrays(ROWS, FEATURES, VENUES, seed=11)
        hub.add_repo("flock/sets", {"val.npz": npz_bytes(X=x, Info=info)})
        hub.add_repo("alice/policy", {"model.onnx": to_bytes(linear_policy(FEATURES, VENUES, 3))})
        yield hub


def set_url(hub) -> str:
    return f"{hub.endpoint}/flock/sets/resolve/main/val.npz"


def expected_average(seed: int) -> float:
    """The protocol computed here: actions x @ W + b, then the plain float32 reward per row."""
    x, info = validation_arrays(ROWS, FEATURES, VENUES, seed=11)
    w, b = weights(FEATURES, VENUES, seed)
    actions = (x @ w + b).astype(np.float32)
    row_rewards = np.array([plain_reward(a, i) for a, i in zip(actions, info, strict=True)])
    return float(np.mean(row_rewards.astype(np.float32)))


def module(**config) -> RlModule:
    return RlModule(RlConfig(**{"inference_threads": 1, **config}))


def scored(hub, repo: str, **fields) -> dict:
    rl = module(**fields.pop("config", {}))
    raw = {"hg_repo_id": repo, "validation_set_url": set_url(hub), "max_params": 10**6, **fields}
    try:
        return score(rl, raw)
    finally:
        rl.cleanup()


def test_the_score_equals_the_plain_float32_computation(hub, caplog):
    commit = hub.add_repo(
        "alice/policy", {"model.onnx": to_bytes(linear_policy(FEATURES, VENUES, 3))}
    )
    with caplog.at_level(logging.INFO):
        metrics = scored(hub, "alice/policy")
    assert metrics["average_reward"] == pytest.approx(expected_average(3), rel=1e-5)
    assert f"scoring alice/policy/model.onnx at commit {commit[:12]} (revision main)" in caplog.text


@pytest.mark.parametrize("batch", [1, 7, 512])
def test_the_batch_size_does_not_change_the_score(hub, batch):
    metrics = scored(hub, "alice/policy", config={"per_device_eval_batch_size": batch})
    assert metrics["average_reward"] == pytest.approx(expected_average(3), rel=1e-6)


def test_external_weights_are_fetched_and_scored(hub, tmp_path):
    path = save_external(linear_policy(FEATURES, VENUES, 3), tmp_path / "ext", "policy.onnx")
    hub.add_repo(
        "bob/external", {"policy.onnx": path, "policy.onnx.data": path.with_suffix(".onnx.data")}
    )
    metrics = scored(hub, "bob/external", model_filename="policy.onnx")
    assert metrics["average_reward"] == pytest.approx(expected_average(3), rel=1e-5)


def test_only_the_policy_files_are_downloaded(hub):
    files = {
        "model.onnx": to_bytes(linear_policy(FEATURES, VENUES, 3)),
        "other.onnx": b"not downloaded",
        "evil.py": b"import os; os.system('echo pwned')\n",
        "README.md": b"# a policy\n",
    }
    hub.add_repo("carol/extras", files)
    before = len(hub.file_requests())
    scored(hub, "carol/extras")
    fetched = set(hub.file_requests()[before:]) - {"val.npz"}  # the validation set's own repo
    assert fetched == {"model.onnx"}


def test_over_max_params_scores_minus_999_without_running_it(hub, caplog):
    hub.add_repo("dave/big", {"model.onnx": to_bytes(padded_policy(FEATURES, VENUES, 5000))})
    before = len(hub.file_requests())
    with caplog.at_level(logging.WARNING):
        metrics = scored(hub, "dave/big", max_params=5000)
    assert metrics == {"average_reward": -999.0}
    assert "dave/big has 5024 parameters, over max_params 5000" in caplog.text
    assert [p for p in hub.file_requests()[before:] if "val.npz" in p] == []  # never needed


def test_a_negative_dim_cannot_pull_the_count_under_max_params(hub):
    # Beside 5,024 real parameters, an unused initializer of dims [-5000] makes upstream's sum
    # 24, and the policy would score -0.4905 at max_params 5000.
    model = padded_policy(FEATURES, VENUES, 5000)
    ghost = onnx.TensorProto(name="ghost", data_type=onnx.TensorProto.FLOAT, dims=[-5000])
    model.graph.initializer.append(ghost)
    hub.add_repo("dave/ghost", {"model.onnx": to_bytes(model)})
    before = len(hub.file_requests())
    with pytest.raises(SubmissionRejected, match="initializer 'ghost' has a negative dim"):
        scored(hub, "dave/ghost", max_params=5000)
    assert [p for p in hub.file_requests()[before:] if "val.npz" in p] == []  # never run


def test_absurd_dims_score_minus_999_as_over_max_params(hub, caplog):
    model = linear_policy(FEATURES, VENUES)
    ghost = onnx.TensorProto(name="ghost", data_type=onnx.TensorProto.FLOAT, dims=[2**62] * 64)
    model.graph.initializer.append(ghost)
    hub.add_repo("dave/absurd", {"model.onnx": to_bytes(model)})
    with caplog.at_level(logging.WARNING):
        assert scored(hub, "dave/absurd", max_params=10**9) == {"average_reward": -999.0}
    assert f"dave/absurd has {2**63} parameters, over max_params" in caplog.text


def test_a_set_declaring_ten_trillion_elements_fails_the_assignment(hub):
    _, info = validation_arrays(ROWS, FEATURES, VENUES, seed=11)
    claim = io.BytesIO()
    header = {"descr": "<f4", "fortran_order": False, "shape": (10**13,)}
    np.lib.format.write_array_header_1_0(claim, header)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as npz:
        npz.writestr("X.npy", claim.getvalue() + b"\0" * 64)
        np.save(buffer := io.BytesIO(), info)
        npz.writestr("Info.npy", buffer.getvalue())
    hub.add_repo("flock/claims", {"val.npz": archive.getvalue()})
    url = f"{hub.endpoint}/flock/claims/resolve/main/val.npz"
    with pytest.raises(ValueError, match=r"declares shape \(10000000000000,\) of float32") as no:
        scored(hub, "alice/policy", validation_set_url=url)
    assert classify(no.value) is Verdict.REJECTED


def test_nan_actions_score_minus_999_with_a_log_line(hub, caplog):
    hub.add_repo("erin/nan", {"model.onnx": to_bytes(nan_policy(FEATURES, VENUES))})
    with caplog.at_level(logging.WARNING):
        assert scored(hub, "erin/nan") == {"average_reward": -999.0}
    assert "penalty (no_score): the average reward is nan: average_reward -999" in caplog.text


@pytest.mark.parametrize(
    "name",
    ["../model.onnx", "/etc/model.onnx", "sub/model.onnx", "model.bin", ".onnx", "a\\b.onnx"],
)
def test_a_model_filename_outside_the_repo_root_is_refused(hub, name):
    with pytest.raises(InvalidInput, match="must be a plain .onnx file name in the repo root"):
        scored(hub, "alice/policy", model_filename=name)


def test_external_data_escaping_the_folder_fails_before_any_session(hub, tmp_path):
    hostile = point_external_data(linear_policy(FEATURES, VENUES), "../../../../etc/passwd")
    hub.add_repo("mallory/escape", {"model.onnx": to_bytes(hostile)})
    rl = module(work_dir=str(tmp_path))
    with pytest.raises(SubmissionRejected, match="outside the submission's folder; never read"):
        score(
            rl,
            {"hg_repo_id": "mallory/escape", "validation_set_url": set_url(hub), "max_params": 99},
        )
    assert not list(tmp_path.glob("*/rl-*/inference"))  # the sandbox never started
    rl.cleanup()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize(
    ("repo", "files", "fields", "message"),
    [
        (
            "frank/none",
            {"policy.onnx": b"x"},
            {},
            r"model.onnx is not in the repo \(its .onnx files: policy.onnx\)",
        ),
        (
            "grace/huge",
            {"model.onnx": b"\0" * 4096},
            {"config": {"max_model_bytes": 1024}},
            "model.onnx is 4096 bytes, over the limit of 1024",
        ),
    ],
    ids=["missing", "oversized"],
)
def test_missing_and_oversized_files_are_refused_before_download(hub, repo, files, fields, message):
    hub.add_repo(repo, files)
    before = len(hub.file_requests())
    with pytest.raises(SubmissionRejected, match=message):
        scored(hub, repo, **fields)
    assert hub.file_requests()[before:] == []


@pytest.mark.parametrize("hostile", sorted(HOSTILE_LISTINGS))
def test_a_listing_no_real_hub_sends_is_refused_before_any_download(hub, hostile):
    # The listing's count, names and sizes, checked before any file is requested.
    repo = f"mallory/listing-{hostile}"
    hub.add_repo(repo, {"model.onnx": to_bytes(linear_policy(FEATURES, VENUES, 3))})
    make, message = HOSTILE_LISTINGS[hostile]
    make(hub, repo)
    before = len(hub.file_requests())
    with pytest.raises(SubmissionRejected, match=message):
        scored(hub, repo)
    assert hub.file_requests()[before:] == []


def test_a_broken_validation_set_fails_the_assignment(hub):
    hub.add_repo("flock/broken", {"val.npz": npz_bytes(X=np.zeros((3, FEATURES), np.float32))})
    url = f"{hub.endpoint}/flock/broken/resolve/main/val.npz"
    with pytest.raises(ValueError, match="no Info array"):
        scored(hub, "alice/policy", validation_set_url=url)


def test_check_prints_the_metrics_as_a_subprocess(hub, tmp_path):
    path = tmp_path / "input.json"
    path.write_text(
        json.dumps(
            {"hg_repo_id": "alice/policy", "validation_set_url": set_url(hub), "max_params": 1000}
        )
    )
    env = validator_env(tmp_path, HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf"))
    del env["HF_TOKEN"]  # rl declares no secret
    result = run_validator(["rl", "--check", str(path)], env, timeout=120)
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout.strip().splitlines()[-1])
    assert metrics["average_reward"] == pytest.approx(expected_average(3), rel=1e-5)


def test_the_repo_config_keeps_upstreams_keys_and_loads():
    config = RlConfig.model_validate(json.loads((REPO_ROOT / "configs" / "rl.json").read_text()))
    assert (config.per_device_eval_batch_size, config.seed) == (512, 42)


def test_the_policy_file_is_parsed_without_its_external_data(hub, tmp_path):
    # inspect reads only the graph: a 0-byte external file still has its dims counted
    model = linear_policy(FEATURES, VENUES)
    path = save_external(model, tmp_path / "p")
    loaded = onnx.load(str(path), load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)


def test_an_assignment_is_a_few_short_lines_at_info(hub, tmp_path):
    """Through the loop: at most 6 lines an assignment, none over 300 characters; a
    policy over max_params says its -999 is the network's penalty, and why."""
    hub.add_repo("dave/big-log", {"model.onnx": to_bytes(padded_policy(FEATURES, VENUES, 5000))})
    env = validator_env(tmp_path, HF_ENDPOINT=hub.endpoint, HF_HOME=str(tmp_path / "hf"))
    del env["HF_TOKEN"]  # rl declares no secret
    repos = ["alice/policy", "dave/big-log"]
    data = {"validation_set_url": set_url(hub), "max_params": 5000}
    outcomes, log = run_assignments(tmp_path, "rl", repos, env, **data)
    assert outcomes == {"alice/policy": "completed", "dave/big-log": "completed"}
    scored_line, penalty = check_assignment_lines(log, 2)
    assert re.search(r"submitted as completed: average_reward -?\d\.\d+ \(commit ", scored_line[-1])
    assert (
        "submitted as completed: average_reward -999, the network's penalty (over_max_params): "
        "dave/big-log has 5024 parameters, over max_params 5000" in penalty[-1]
    )
