"""Hostile policies built on the spot: dims that would cancel or dwarf the parameter count, and
an output that is no tensor. Each ends in a reason (SubmissionRejected, failed at once) or in
upstream's -999, never in a score that slipped under max_params or in the module-bug path."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from devkit.tiny_policies import OPSET, linear_policy, padded_policy, validation_arrays, weights
from modules.rl.inference import run_policy
from modules.rl.policy import inspect_policy
from modules.rl.policy_reader import COUNT_CAP
from validator.errors import SubmissionRejected, Verdict, classify
from validator.kit import ChildLimits

FEATURES, VENUES = 4, 3
LIMITS = ChildLimits(wall_seconds=60, memory_bytes=4 * 1024**3)


def inspect(path, folder):
    """The module's check, in its bounded child (work files beside the policy's)."""
    return inspect_policy(path, folder, folder / ".inspect", 2**30)


def with_dims(model: onnx.ModelProto, dims: list[int], name: str = "ghost") -> onnx.ModelProto:
    """`model` plus an unused initializer that declares `dims` and holds no data: onnxruntime
    drops unused initializers, so only the count ever sees it."""
    model.graph.initializer.append(TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims))
    return model


def saved(tmp_path, model: onnx.ModelProto):
    folder = tmp_path / "policy"
    folder.mkdir(exist_ok=True)
    onnx.save_model(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


def ragged_policy(features: int, venues: int) -> onnx.ModelProto:
    """First output: a sequence of the (rows, venues) actions and a (2,) tensor, which
    onnxruntime returns as a Python list of two arrays of different shapes."""
    w, _ = weights(features, venues, 0)
    nodes = [
        helper.make_node("MatMul", ["obs", "W"], ["scores"]),
        helper.make_node("SequenceConstruct", ["scores", "tail"], ["action"]),
    ]
    initializers = [
        numpy_helper.from_array(w, "W"),
        numpy_helper.from_array(np.ones(2, np.float32), "tail"),
    ]
    graph = helper.make_graph(
        nodes,
        "ragged",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["rows", features])],
        [helper.make_tensor_sequence_value_info("action", TensorProto.FLOAT, None)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=OPSET)
    model.ir_version = 8
    return model


@pytest.mark.parametrize("dims", [[-5000], [5000, -1], [-1, -1], [0, -3]])
def test_a_negative_dim_is_refused_before_counting(tmp_path, dims):
    # 5,024 real parameters and a ghost of [-5000] count 24 under upstream's plain sum, and
    # would be scored at max_params 5000.
    path = saved(tmp_path, with_dims(padded_policy(FEATURES, VENUES, 5000), dims))
    with pytest.raises(SubmissionRejected, match=r"initializer 'ghost' has a negative dim") as no:
        inspect(path, path.parent)
    assert classify(no.value) is Verdict.REJECTED


@pytest.mark.parametrize(
    ("dims", "count"),
    [
        ([2**62, 2**62], COUNT_CAP),  # past int64: no runtime holds it
        ([2**62] * 20_000, COUNT_CAP),  # a product of 1.2 million bits, never computed
        ([2**31, 2**31], 2**62),
        ([0, 2**62, 2**62], 0),  # an empty tensor, as upstream's product says
    ],
    ids=["past-int64", "many-huge-dims", "large", "empty"],
)
def test_absurd_dims_stop_the_count_at_its_cap(tmp_path, dims, count):
    path = saved(tmp_path, with_dims(linear_policy(FEATURES, VENUES), dims))
    assert inspect(path, path.parent).parameter_count == min(15 + count, COUNT_CAP)


def test_many_absurd_initializers_stop_the_sum_at_the_cap(tmp_path):
    model = linear_policy(FEATURES, VENUES)
    for i in range(1000):
        with_dims(model, [2**62, 4], name=f"ghost{i}")
    path = saved(tmp_path, model)
    assert inspect(path, path.parent).parameter_count == COUNT_CAP


def test_a_ragged_output_is_refused_with_the_reason(tmp_path):
    x, _ = validation_arrays(7, FEATURES, VENUES)
    with pytest.raises(SubmissionRejected, match=r"first output is seq\(tensor\(float\)\)") as no:
        run_policy(
            saved(tmp_path, ragged_policy(FEATURES, VENUES)), x, VENUES, 512, LIMITS, tmp_path
        )
    assert "it must be a tensor of numbers (rows, venues)" in str(no.value)
    assert classify(no.value) is Verdict.REJECTED
