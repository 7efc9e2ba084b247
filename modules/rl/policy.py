"""What is checked in a submitted ONNX policy before anything runs it (docs/rl-scoring.md,
"What is refused"), read in a bounded child (modules/rl/policy_reader.py, through the kit's
`inspect_in_child`): the validator's process never parses the file, and never imports onnx. The
child's answer is two plain values, checked here by their model.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from validator.kit import SUBMISSION_LIMITS, ChildLimits, inspect_in_child

READER = Path(__file__).with_name("policy_reader.py")
# protobuf holds the file's bytes and the message it parses from them at once.
PARSE_COPIES = 2


class PolicyGraph(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    parameter_count: int = Field(ge=0, le=2**63)
    external_files: tuple[str, ...]  # the external-data files it reads, inside the folder


def reader_limits(max_model_bytes: int) -> ChildLimits:
    """The reader's limits: the kit's, with the one departure the protocol needs: a policy file
    of up to max_model_bytes is honest, and parsing it holds it twice."""
    return dataclasses.replace(
        SUBMISSION_LIMITS,
        memory_bytes=(SUBMISSION_LIMITS.memory_bytes or 0) + PARSE_COPIES * max_model_bytes,
    )


def inspect_policy(model_path: Path, folder: Path, work: Path, max_model_bytes: int) -> PolicyGraph:
    """The checks every policy passes before a session is created; raises SubmissionRejected
    naming the file and the first problem, or the child's limit it met."""
    limits = reader_limits(max_model_bytes)
    return inspect_in_child(
        READER,
        {"model": str(model_path), "folder": str(folder)},
        work=work,
        what=model_path.name,
        answer=PolicyGraph,
        preload=("onnx",),
        limits=limits,
    )
