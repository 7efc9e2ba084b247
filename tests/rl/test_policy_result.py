"""The policy sandbox's result is read as untrusted (the child ran the policy): a PolicyResult,
bounded in size and depth, or the submission is rejected; never a value used unchecked."""

from __future__ import annotations

import json

import pytest

from modules.rl.inference import PolicyResult, _read_result
from validator.kit import SubmissionRejected


@pytest.mark.parametrize(
    "written, read",
    [
        ({"rows": 3}, PolicyResult(rows=3)),
        ({"rejected": "the policy has no input"}, PolicyResult(rejected="the policy has no input")),
    ],
)
def test_the_sandbox_s_result_is_read_as_its_definition(tmp_path, written, read):
    (tmp_path / "result.json").write_text(json.dumps(written))
    assert _read_result(tmp_path / "result.json") == read


@pytest.mark.parametrize(
    "text",
    [
        "[" * 30_000 + "]" * 30_000,  # deeper than json.loads goes: RecursionError before
        '{"rows": 3, "score": 1}',
        '{"rows": "3"}',
        '{"rows": -1}',
        '{"rejected": ["x"]}',
        "[1]",
        "not json",
    ],
)
def test_a_result_that_is_not_the_definition_rejects_the_submission(tmp_path, text):
    (tmp_path / "result.json").write_text(text)
    with pytest.raises(SubmissionRejected, match="the policy sandbox's result is not one"):
        _read_result(tmp_path / "result.json")
