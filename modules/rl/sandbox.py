"""The child process that runs a submitted policy (docs/rl-scoring.md, "Running the policy").

`python -I sandbox.py REQUEST.json`: a standalone script (numpy and onnxruntime only, nothing of
the validator), started by `run_policy` in modules/rl/inference.py through the kit's `run_child`,
which arms its memory limit (after numpy is imported) and kills it at its wall-clock limit; no
secrets in its environment. It creates the
session with the CPU provider and no custom-op library, checks the policy's input and output
against the features, runs the rows in order in chunks, and saves the first output of every
chunk, as float32, to an .npy file. A problem of the policy is written to the result file as
{"rejected": reason}; anything else ends the process with a traceback.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import onnxruntime as ort


class PolicyDoesNotFit(Exception):
    pass


# onnxruntime's names of tensor types that hold no numbers.
NON_NUMERIC_TENSORS = frozenset({"tensor(string)"})


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    # The memory limit is armed before this runs: an allocation past it fails (MemoryError, or
    # onnxruntime's abort, which the parent words) instead of taking the host's memory.
    try:
        actions = run(request)
    except PolicyDoesNotFit as exc:
        _write_result(request, {"rejected": str(exc)})
        return
    except MemoryError:
        _write_result(request, {"rejected": "the policy ran out of its memory limit"})
        return
    np.save(request["actions"], actions, allow_pickle=False)
    _write_result(request, {"rows": int(actions.shape[0])})


def run(request: dict) -> np.ndarray:
    features = np.load(request["features"], allow_pickle=False)
    session = _session(request["model"], int(request["threads"]))
    name = _check_input(session, features.shape[1])
    _check_output(session)
    venues = int(request["venues"])
    batch = int(request["batch_size"])
    chunks = []
    for start in range(0, features.shape[0], batch):
        rows = features[start : start + batch]
        try:
            output = session.run(None, {name: rows})[0]
        except Exception as exc:  # onnxruntime's errors are one type for all causes
            raise PolicyDoesNotFit(f"inference failed on rows {start}..: {_short(exc)}") from exc
        if not isinstance(output, np.ndarray):
            # Declared a tensor yet not one (a sequence or map slipped past the check above):
            # np.asarray of a ragged list would raise here, outside any reason.
            raise PolicyDoesNotFit(
                f"the policy's first output is a {type(output).__name__}, not a tensor"
            )
        if output.shape != (rows.shape[0], venues):
            raise PolicyDoesNotFit(
                f"the policy's first output has shape {output.shape} for {rows.shape[0]} rows; "
                f"it must be (rows, {venues}), one action per venue"
            )
        if not np.issubdtype(output.dtype, np.number):
            raise PolicyDoesNotFit(f"the policy's first output is {output.dtype}, not numbers")
        chunks.append(output.astype(np.float32, copy=False))
    return np.concatenate(chunks)


def _session(model: str, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: a policy's warnings are not our log
    try:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise PolicyDoesNotFit(f"onnxruntime cannot load the policy: {_short(exc)}") from exc


def _check_input(session: ort.InferenceSession, width: int) -> str:
    inputs = session.get_inputs()
    if not inputs:
        raise PolicyDoesNotFit("the policy has no input")
    first = inputs[0]
    if first.type != "tensor(float)":
        raise PolicyDoesNotFit(f"the policy's first input is {first.type}, not tensor(float)")
    shape = first.shape
    if len(shape) != 2:
        raise PolicyDoesNotFit(
            f"the policy's first input has rank {len(shape)} ({shape}); it must be (rows, {width})"
        )
    if isinstance(shape[1], int) and shape[1] != width:
        raise PolicyDoesNotFit(
            f"the policy's first input takes {shape[1]} features; the validation set has {width}"
        )
    required = [i.name for i in inputs[1:]]
    if required:
        raise PolicyDoesNotFit(f"the policy has inputs besides the features: {required}")
    return first.name


def _check_output(session: ort.InferenceSession) -> None:
    """The first output must be a tensor: a sequence (seq(tensor(float)), ragged or not) or a
    map comes back as a Python list or dict, which is no (rows, venues) array."""
    outputs = session.get_outputs()
    if not outputs:
        raise PolicyDoesNotFit("the policy has no output")
    kind = outputs[0].type
    if not kind.startswith("tensor(") or kind in NON_NUMERIC_TENSORS:
        raise PolicyDoesNotFit(
            f"the policy's first output is {kind}; it must be a tensor of numbers (rows, venues)"
        )


def _short(exc: Exception, limit: int = 500) -> str:
    text = str(exc).strip().replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


def _write_result(request: dict, result: dict) -> None:
    with open(request["result"], "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(sys.argv[1])
