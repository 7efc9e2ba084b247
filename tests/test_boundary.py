"""validator/kit/boundary.py with real children: an answer comes back checked, the submission's
error and a limit met are SubmissionRejected naming the file, the script's own failure is not."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from validator.errors import SubmissionRejected
from validator.kit.boundary import SUBMISSION_LIMITS, inspect_in_child
from validator.sandbox.child_process import ChildLimits

READ_REQUEST = "import json, sys\nrequest = json.load(open(sys.argv[1]))\n"


class Count(BaseModel):
    count: int


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "reader.py"
    path.write_text(READ_REQUEST + body)
    return path


def inspect(tmp_path: Path, body: str, **kwargs) -> Count:
    return inspect_in_child(
        script(tmp_path, body),
        {"n": 7},
        work=tmp_path / "work",
        what="config.json",
        answer=Count,
        **kwargs,
    )


def test_the_answer_comes_back_validated_and_no_file_is_left(tmp_path):
    body = "json.dump({'count': request['n'] * 6}, open(request['result'], 'w'))\n"
    assert inspect(tmp_path, body) == Count(count=42)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == []


def test_an_error_answer_is_the_submissions_and_names_the_file(tmp_path):
    body = "json.dump({'error': 'no model_type\\nhere'}, open(request['result'], 'w'))\n"
    with pytest.raises(SubmissionRejected, match=r"^config\.json: no model_type\\nhere$"):
        inspect(tmp_path, body)


def test_a_limit_met_is_the_submissions(tmp_path):
    body = "blob = bytearray(512 * 1024 * 1024)\n"
    limits = ChildLimits(wall_seconds=60, memory_bytes=64 * 1024 * 1024)
    with pytest.raises(SubmissionRejected, match="config.json: reading it exceeded its memory"):
        inspect(tmp_path, body, limits=limits)


def test_a_traceback_without_an_answer_is_the_scripts_own_bug(tmp_path):
    with pytest.raises(RuntimeError, match="reader crashed"):
        inspect(tmp_path, "raise KeyError('ours')\n")


def test_an_answer_of_the_wrong_shape_is_the_scripts_own_bug(tmp_path):
    body = "json.dump({'count': 'many'}, open(request['result'], 'w'))\n"
    with pytest.raises(RuntimeError, match="unexpected shape"):
        inspect(tmp_path, body)


def test_the_default_limits_bound_every_resource():
    assert None not in (
        SUBMISSION_LIMITS.cpu_seconds,
        SUBMISSION_LIMITS.memory_bytes,
        SUBMISSION_LIMITS.file_bytes,
    )
