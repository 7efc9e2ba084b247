"""Tiny ONNX allocation policies and validation sets for the rl module's tests, bench and demo,
built on the spot with the `onnx` helper API: honest ones, and each kind of hostile one the
module must refuse (docs/rl-scoring.md, "What is refused")."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = [helper.make_opsetid("", 17)]


def _model(nodes, inputs, outputs, initializers, opsets=OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "policy", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8  # what onnxruntime releases of the last years all read
    return model


def _io(features: int | str, venues: int | str, rows: str = "rows"):
    return (
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [rows, features])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, [rows, venues])],
    )


def weights(features: int, venues: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1, (features, venues)).astype(np.float32)
    b = rng.normal(0, 0.5, (venues,)).astype(np.float32)
    return w, b


def linear_policy(features: int, venues: int, seed: int = 0) -> onnx.ModelProto:
    """action = obs @ W + b: the policy a test can compute by hand."""
    w, b = weights(features, venues, seed)
    inputs, outputs = _io(features, venues)
    nodes = [
        helper.make_node("MatMul", ["obs", "W"], ["scores"]),
        helper.make_node("Add", ["scores", "b"], ["action"]),
    ]
    return _model(
        nodes, inputs, outputs, [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")]
    )


def padded_policy(features: int, venues: int, extra_params: int, seed: int = 0) -> onnx.ModelProto:
    """A linear policy with an unused initializer of `extra_params` values, to pass max_params."""
    model = linear_policy(features, venues, seed)
    padding = np.zeros((extra_params,), dtype=np.float32)
    model.graph.initializer.append(numpy_helper.from_array(padding, "unused_padding"))
    return model


def nan_policy(features: int, venues: int) -> onnx.ModelProto:
    """Every action NaN (0/0)."""
    inputs, outputs = _io(features, venues)
    zeros = numpy_helper.from_array(np.zeros((features, venues), np.float32), "Z")
    nodes = [
        helper.make_node("MatMul", ["obs", "Z"], ["zero"]),
        helper.make_node("Div", ["zero", "zero"], ["action"]),
    ]
    return _model(nodes, inputs, outputs, [zeros])


def wrong_output_policy(features: int, venues: int) -> onnx.ModelProto:
    """One action per row instead of one per venue: output (rows, 1)."""
    w, _ = weights(features, 1, 0)
    inputs, _ = _io(features, venues)
    outputs = [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["rows", 1])]
    nodes = [helper.make_node("MatMul", ["obs", "W"], ["action"])]
    return _model(nodes, inputs, outputs, [numpy_helper.from_array(w, "W")])


def custom_domain_policy(features: int, venues: int) -> onnx.ModelProto:
    """Calls an operator of a domain only a custom-op library could provide."""
    inputs, outputs = _io(features, venues)
    nodes = [helper.make_node("Allocate", ["obs"], ["action"], domain="com.evil.ops")]
    opsets = [*OPSET, helper.make_opsetid("com.evil.ops", 1)]
    return _model(nodes, inputs, outputs, [], opsets)


def slow_policy(features: int, venues: int, iterations: int = 10**9) -> onnx.ModelProto:
    """A Loop of `iterations` matrix products before answering: runs for hours if let."""
    inputs, outputs = _io(features, venues)
    eye = numpy_helper.from_array(np.eye(features, dtype=np.float32), "I")
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["state_in", "I"], ["state_out"]),
        ],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_out", TensorProto.FLOAT, None),
        ],
    )
    w, _ = weights(features, venues, 0)
    nodes = [
        helper.make_node("Loop", ["trips", "go", "obs"], ["spun"], body=body),
        helper.make_node("MatMul", ["spun", "W"], ["action"]),
    ]
    initializers = [
        eye,
        numpy_helper.from_array(np.array(iterations, dtype=np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "go"),
        numpy_helper.from_array(w, "W"),
    ]
    return _model(nodes, inputs, outputs, initializers)


def save_external(model: onnx.ModelProto, folder: Path, name: str = "model.onnx") -> Path:
    """Saves `model` with its initializers in `name + ".data"` beside it (ONNX external data)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=name + ".data",
        size_threshold=0,
    )
    return path


def point_external_data(model: onnx.ModelProto, location: str) -> onnx.ModelProto:
    """A copy of `model` whose first initializer says its bytes are at `location`."""
    hostile = onnx.ModelProto()
    hostile.CopyFrom(model)
    tensor = hostile.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return hostile


def to_bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


def validation_arrays(
    rows: int, features: int, venues: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """X (rows, features) and Info (rows, 3 + 4 * venues) with plausible orders and venues."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, (rows, features)).astype(np.float32)
    qty = rng.uniform(1, 500, (rows, 1))
    duration = rng.uniform(0, 4, (rows, 1))
    unused = rng.normal(0, 1, (rows, 1))
    fill_rate = rng.uniform(-0.2, 1.2, (rows, venues))  # outside [0, 1] too: clipped
    rebate = rng.uniform(-5, 30, (rows, venues))
    punish = rng.uniform(-0.05, 0, (rows, venues))
    latest_vol = rng.uniform(-10, 300, (rows, venues))  # negative too: floored at 0
    per_venue = np.stack([fill_rate, rebate, punish, latest_vol], axis=2).reshape(rows, -1)
    info = np.concatenate([qty, duration, unused, per_venue], axis=1).astype(np.float32)
    return x, info


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return buffer.getvalue()


def greedy_policy(features: int, venues: int, elements: int = 10**10) -> onnx.ModelProto:
    """Asks for a tensor of `elements` floats (40 GB by default) before answering."""
    inputs, outputs = _io(features, venues)
    w, _ = weights(features, venues, 0)
    nodes = [
        helper.make_node(
            "ConstantOfShape",
            ["huge_shape"],
            ["huge"],
            value=numpy_helper.from_array(np.array([1.0], np.float32)),
        ),
        helper.make_node("ReduceSum", ["huge"], ["total"], keepdims=0),
        helper.make_node("MatMul", ["obs", "W"], ["scores"]),
        helper.make_node("Add", ["scores", "total"], ["action"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array([elements], np.int64), "huge_shape"),
        numpy_helper.from_array(w, "W"),
    ]
    return _model(nodes, inputs, outputs, initializers)
