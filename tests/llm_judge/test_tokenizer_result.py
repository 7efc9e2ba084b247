"""The tokenizer child's result is read as untrusted (the child ran the submission's template
and tokenizer): a TokenizerResult, bounded in size and depth, or the submission is rejected."""

from __future__ import annotations

import json

import pytest

from modules.llm_judge.templating import ItemAt, TemplateLimits, TokenizerResult, _read_result
from validator.kit import SubmissionRejected

LIMITS = TemplateLimits(cpu_seconds=1, memory_bytes=1 << 30, wall_seconds=1, max_output_bytes=4096)


def test_each_result_of_the_child_is_read_as_its_definition(tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"texts": ["a", "\ud800b"]}), errors="surrogatepass")
    assert _read_result(path, LIMITS) == TokenizerResult(texts=["a", "\ud800b"])
    path.write_text(json.dumps({"failed": {"index": 2, "stage": "render", "error": "boom"}}))
    assert _read_result(path, LIMITS).failed == ItemAt(index=2, stage="render", error="boom")


@pytest.mark.parametrize(
    "text",
    [
        "[" * 2_000 + "]" * 2_000,
        '{"texts": ["a", 1]}',
        '{"failed": {"index": "2", "stage": "render", "error": "x"}}',
        '{"empty": {"index": -1}}',
        '{"eos_token_id": 1.5}',
        '{"texts": []}, "more": 1}',
        '{"text": ["a"]}',
    ],
)
def test_a_result_that_is_not_the_definition_rejects_the_submission(tmp_path, text):
    (tmp_path / "result.json").write_text(text)
    with pytest.raises(SubmissionRejected, match="the tokenizer child's result is not one"):
        _read_result(tmp_path / "result.json", LIMITS)
