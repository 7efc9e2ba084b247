"""The bounded child that reads a submitted ONNX policy (docs/rl-scoring.md, "What is refused"):
`python -I policy_reader.py REQUEST.json`, started by `inspect_policy` in modules/rl/policy.py
through the kit's `inspect_in_child`, never imported by the validator's process (which never
imports onnx). It parses the file without its external data, checks that every external-data
location stays in the download folder and every operator is from a standard domain, counts the
parameters from the graph alone, and writes {"parameter_count", "external_files"} or
{"error": reason} to `request["result"]`. A standalone script: onnx only, nothing of the
validator.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto

# The operator sets onnxruntime ships: the default domain (also spelled ai.onnx), the ML
# operators and Microsoft's contrib operators. Anything else would need a custom-op library,
# and none is ever registered.
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})
# Where the parameter count stops: no runtime holds a tensor of 2^63 elements, and any task's
# max_params is far below it, so a count past it scores as over max_params, as upstream's
# unbounded one does.
COUNT_CAP = 2**63


class PolicyRefused(Exception):
    """The policy's own problem: the parent fails the assignment with this reason."""


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    try:
        answer = inspect(Path(request["model"]), Path(request["folder"]))
    except PolicyRefused as exc:
        answer = {"error": str(exc)}
    with open(request["result"], "w", encoding="utf-8") as handle:
        json.dump(answer, handle)


def inspect(model_path: Path, folder: Path) -> dict:
    model = _load_without_data(model_path)
    try:
        files = check_external_data(model, folder)
    except (ValueError, OSError) as exc:  # a location the file system refuses (a NUL in it)
        raise PolicyRefused(f"an external data location cannot be used: {exc}") from exc
    check_domains(model)
    return {"parameter_count": parameter_count(model), "external_files": list(files)}


def _load_without_data(model_path: Path) -> ModelProto:
    try:
        return onnx.load(str(model_path), load_external_data=False)
    except MemoryError:
        raise  # the child's memory limit: the parent words it
    except Exception as exc:  # protobuf's DecodeError and friends: the file is not ONNX
        if "alloc failed" in str(exc):
            # upb's parser reports the memory limit as a DecodeError ("Arena alloc failed").
            raise MemoryError(str(exc)) from exc
        raise PolicyRefused(f"not a readable ONNX model: {type(exc).__name__}: {exc}") from exc


def parameter_count(model: ModelProto) -> int:
    """The sum over the main graph's initializers of the product of their dims (upstream's
    count; a scalar counts 1), capped at COUNT_CAP. A negative dim is refused: upstream's plain
    sum would let an unused initializer of dims [-5000] cancel 5,000 real parameters, and
    onnxruntime drops unused initializers, so nothing else would ever notice it."""
    total = 0
    for tensor in model.graph.initializer:
        negative = next((dim for dim in tensor.dims if dim < 0), None)
        if negative is not None:
            raise PolicyRefused(
                f"initializer {_shown(tensor.name)} has a negative dim ({negative}): not a valid "
                "ONNX tensor, and its parameters cannot be counted"
            )
        total = min(total + _element_count(tensor.dims), COUNT_CAP)
    return total


def _element_count(dims: Sequence[int]) -> int:
    """The product of `dims`, stopping at COUNT_CAP: protobuf's dims are int64 each, but their
    product is unbounded, and a file of millions of huge dims would otherwise make the
    validator multiply ever larger integers."""
    if 0 in dims:
        return 0  # an empty tensor, whatever its other dims say (upstream's product too)
    count = 1
    for dim in dims:
        count *= dim
        if count >= COUNT_CAP:
            return COUNT_CAP
    return count


def _shown(name: str, limit: int = 80) -> str:
    return repr(name if len(name) <= limit else name[:limit] + "...")


def check_external_data(model: ModelProto, folder: Path) -> tuple[str, ...]:
    """Every external-data reference must name a file inside `folder`, read within its size;
    one that points elsewhere is refused before anything reads it."""
    root = folder.resolve()
    files: set[str] = set()
    for tensor in all_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        location = entries.get("location", "")
        where = f"tensor {tensor.name!r}: external data location {location!r}"
        target = (root / location).resolve()
        if not location or Path(location).is_absolute() or not target.is_relative_to(root):
            raise PolicyRefused(f"{where} is outside the submission's folder; never read")
        if not target.is_file():
            raise PolicyRefused(f"{where} is not a file of the submission")
        _check_extent(entries, target.stat().st_size, where)
        files.add(target.relative_to(root).as_posix())
    return tuple(sorted(files))


def _check_extent(entries: dict[str, str], size: int, where: str) -> None:
    try:
        offset = int(entries.get("offset") or 0)
        length = int(entries["length"]) if entries.get("length") else size - offset
    except ValueError:
        raise PolicyRefused(f"{where}: offset or length is not a number") from None
    if offset < 0 or length < 0 or offset + length > size:
        raise PolicyRefused(f"{where}: bytes {offset}..{offset + length} outside its {size}")


def check_domains(model: ModelProto) -> None:
    """Only operators of the standard domains, in the graph, its subgraphs and its functions."""
    declared = sorted({opset.domain for opset in model.opset_import} - STANDARD_DOMAINS)
    if declared:
        raise PolicyRefused(
            f"imports operator set(s) {', '.join(map(repr, declared))}: only standard "
            "domains run (custom operators are never loaded)"
        )
    for node in all_nodes(model):
        if node.domain not in STANDARD_DOMAINS:
            raise PolicyRefused(
                f"node {node.name or node.op_type!r} uses operator {node.op_type!r} of domain "
                f"{node.domain!r}: only the standard domains run here"
            )


def all_nodes(model: ModelProto) -> Iterator[onnx.NodeProto]:
    for graph in _all_graphs(model):
        yield from graph.node
    for function in model.functions:
        yield from function.node


def all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every tensor that can carry external data: initializers (dense and sparse) and tensor
    attributes, in the graph, its subgraphs and its functions."""
    for graph in _all_graphs(model):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in graph.node:
            yield from _attribute_tensors(node)
    for function in model.functions:
        for node in function.node:
            yield from _attribute_tensors(node)


def _attribute_tensors(node: onnx.NodeProto) -> Iterator[TensorProto]:
    for attribute in node.attribute:
        if attribute.type == AttributeProto.TENSOR:
            yield attribute.t
        elif attribute.type == AttributeProto.TENSORS:
            yield from attribute.tensors
        elif attribute.type == AttributeProto.SPARSE_TENSOR:
            yield attribute.sparse_tensor.values
            yield attribute.sparse_tensor.indices


def _all_graphs(model: ModelProto) -> Iterator[GraphProto]:
    yield from _graphs_in(model.graph)
    for function in model.functions:
        for node in function.node:
            for sub in _subgraphs(node):
                yield from _graphs_in(sub)


def _graphs_in(graph: GraphProto) -> Iterator[GraphProto]:
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _graphs_in(sub)


def _subgraphs(node: onnx.NodeProto) -> Iterator[GraphProto]:
    for attribute in node.attribute:
        if attribute.type == AttributeProto.GRAPH:
            yield attribute.g
        elif attribute.type == AttributeProto.GRAPHS:
            yield from attribute.graphs


if __name__ == "__main__":
    main(sys.argv[1])
