"""A submitted ONNX policy: the checks before any session exists (external data, operator
domains, parameter count) and the child process that runs it (shapes, batch sizes, time and
memory limits)."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest

from devkit.tiny_policies import (
    custom_domain_policy,
    greedy_policy,
    linear_policy,
    padded_policy,
    point_external_data,
    save_external,
    slow_policy,
    validation_arrays,
    weights,
    wrong_output_policy,
)
from modules.rl.inference import run_policy
from modules.rl.policy import inspect_policy
from validator.errors import SubmissionRejected
from validator.kit import ChildLimits

FEATURES, VENUES = 4, 3
LIMITS = ChildLimits(wall_seconds=60, memory_bytes=4 * 1024**3)


def inspect(path, folder):
    """The module's check, in its bounded child (work files beside the policy's)."""
    return inspect_policy(path, folder, folder / ".inspect", 2**30)


def saved(tmp_path, model, name="model.onnx"):
    folder = tmp_path / "policy"
    folder.mkdir(exist_ok=True)
    onnx.save_model(model, str(folder / name))
    return folder / name


def test_the_parameter_count_is_the_initializers_dims_product(tmp_path):
    assert inspect(saved(tmp_path, linear_policy(4, 3)), tmp_path).parameter_count == 15
    padded = saved(tmp_path, padded_policy(4, 3, 1000))
    assert inspect(padded, padded.parent).parameter_count == 1015


def test_external_weights_beside_the_file_are_read(tmp_path):
    model = linear_policy(FEATURES, VENUES, seed=5)
    path = save_external(model, tmp_path / "policy")
    graph = inspect(path, path.parent)
    assert graph.external_files == ("model.onnx.data",)
    assert graph.parameter_count == 15
    x, _ = validation_arrays(20, FEATURES, VENUES)
    w, b = weights(FEATURES, VENUES, 5)
    actions = run_policy(path, x, VENUES, 8, LIMITS, tmp_path / "run")
    np.testing.assert_allclose(actions, x @ w + b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "location", ["../../etc/passwd", "/etc/passwd", "../outside.bin", "sub/../../outside.bin"]
)
def test_external_data_outside_the_folder_is_refused_unread(tmp_path, location):
    (tmp_path / "outside.bin").write_bytes(b"\0" * 64)
    hostile = point_external_data(linear_policy(FEATURES, VENUES), location)
    path = saved(tmp_path, hostile)
    with pytest.raises(SubmissionRejected, match="outside the submission's folder; never read"):
        inspect(path, path.parent)


def test_a_link_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "outside.bin").write_bytes(b"\0" * 64)
    path = saved(tmp_path, point_external_data(linear_policy(FEATURES, VENUES), "weights.bin"))
    (path.parent / "weights.bin").symlink_to(tmp_path / "outside.bin")
    with pytest.raises(SubmissionRejected, match="outside the submission's folder"):
        inspect(path, path.parent)


@pytest.mark.parametrize(
    ("location", "size", "message"),
    [("missing.bin", None, "is not a file of the submission"), ("short.bin", 8, "outside its 8")],
)
def test_external_data_that_is_missing_or_short_is_refused(tmp_path, location, size, message):
    path = saved(tmp_path, point_external_data(linear_policy(FEATURES, VENUES), location))
    if size is not None:
        (path.parent / location).write_bytes(b"\0" * size)
    with pytest.raises(SubmissionRejected, match=message):
        inspect(path, path.parent)


def test_custom_operator_domains_are_refused(tmp_path):
    path = saved(tmp_path, custom_domain_policy(FEATURES, VENUES))
    with pytest.raises(SubmissionRejected, match="'com.evil.ops'.*custom operators are never"):
        inspect(path, path.parent)
    undeclared = custom_domain_policy(FEATURES, VENUES)
    del undeclared.opset_import[1:]  # the node alone names the domain
    path = saved(tmp_path, undeclared)
    with pytest.raises(SubmissionRejected, match="operator 'Allocate' of domain 'com.evil.ops'"):
        inspect(path, path.parent)


def test_a_file_that_is_not_onnx_is_refused(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"\x80\x04 this is a pickle, not a protobuf")
    with pytest.raises(SubmissionRejected, match="model.onnx: not a readable ONNX model"):
        inspect(path, tmp_path)


def test_batch_sizes_agree_and_equal_the_plain_product(tmp_path):
    path = saved(tmp_path, linear_policy(FEATURES, VENUES, seed=2))
    x, _ = validation_arrays(1030, FEATURES, VENUES)
    w, b = weights(FEATURES, VENUES, 2)
    runs = {
        size: run_policy(path, x, VENUES, size, LIMITS, tmp_path / f"run{size}")
        for size in (1, 7, 512)
    }
    for actions in runs.values():
        assert actions.dtype == np.float32 and actions.shape == (1030, VENUES)
        np.testing.assert_allclose(actions, x @ w + b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(runs[1], runs[512], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(runs[7], runs[512], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("model", "features", "message"),
    [
        (wrong_output_policy(FEATURES, VENUES), FEATURES, "shape (7, 1) for 7 rows"),
        (linear_policy(FEATURES + 1, VENUES), FEATURES, "takes 5 features; the validation set"),
    ],
    ids=["output", "input"],
)
def test_a_policy_that_does_not_fit_fails_with_the_reason(tmp_path, model, features, message):
    x, _ = validation_arrays(7, features, VENUES)
    with pytest.raises(SubmissionRejected, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_policy(saved(tmp_path, model), x, VENUES, 512, LIMITS, tmp_path / "run")


def test_a_slow_policy_is_stopped_at_the_time_limit(tmp_path):
    x, _ = validation_arrays(4, FEATURES, VENUES)
    began = time.monotonic()
    with pytest.raises(SubmissionRejected, match="did not finish within 2 s"):
        limits = ChildLimits(wall_seconds=2, memory_bytes=4 * 1024**3)
        run_policy(saved(tmp_path, slow_policy(FEATURES, VENUES)), x, VENUES, 512, limits, tmp_path)
    assert time.monotonic() - began < 10


def test_a_greedy_policy_fails_at_its_memory_limit(tmp_path):
    x, _ = validation_arrays(4, FEATURES, VENUES)
    limits = ChildLimits(wall_seconds=60, memory_bytes=2 * 1024**3)
    path = saved(tmp_path, greedy_policy(FEATURES, VENUES))
    with pytest.raises(SubmissionRejected) as refused:
        run_policy(path, x, VENUES, 512, limits, tmp_path / "run")
    assert "memory" in str(refused.value) or "alloc" in str(refused.value).lower()


def test_a_location_the_file_system_refuses_is_the_policys_failure(tmp_path):
    # A NUL in the location: os refuses the path (ValueError); read in the child, that is the
    # submission's failure, never the module-bug path.
    path = saved(tmp_path, point_external_data(linear_policy(FEATURES, VENUES), "a\0b.bin"))
    with pytest.raises(SubmissionRejected, match="external data location cannot be used"):
        inspect(path, path.parent)
