"""Judging through the real openai client against the local OpenAI-compatible judge: model
resolution, per-name parameters, retries, failure outcomes and the aggregate."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest

from devkit.judge_server import LocalJudge
from modules.llm_judge.judging import (
    Judge,
    Reply,
    aggregate,
    load_rubrics,
    parse_reply,
    request_options,
    rubric_prompt,
)
from modules.llm_judge.schemas import LlmJudgeConfig
from validator.errors import ConfigError, RecoverableException

KEY = "sk-judge-TEST-1234567890"
MODELS = ["judge-a", "judge-b-low", "judge-c-high-thinking"]


@pytest.fixture(scope="module")
def server():
    with LocalJudge(MODELS, KEY) as judge:
        yield judge


@pytest.fixture
def judge(server):
    server.fail_next(0)
    return Judge(server.endpoint, KEY, timeout=2, retries=3, concurrency=4, backoff_seconds=0.01)


def graded(text: str) -> str:
    return f"Grade this.\n<answer>\n{text}\n</answer>\nReply in JSON."


def test_the_aggregate_is_the_mean_of_score_times_confidence_over_ten(server, judge):
    answers = ["ok", "a longer answer", "x" * 27]
    replies = judge.grade_all([graded(a) for a in answers], ["judge-a", "judge-b-low"], 2, 0.1)
    expected = [
        LocalJudge.grade_of(a, m)
        for a in answers
        for m in ("judge-a", "judge-b-low")
        for _ in (0, 1)
    ]
    assert [(r.score, r.confidence) for r in replies] == expected
    by_hand = sum(s * c for s, c in expected) / len(expected) / 10
    assert aggregate(replies) == pytest.approx(by_hand)
    # "ok": 1 + 2 = 3; "a longer answer": 1 + 15 % 10 = 6; 27 x: 1 + 7 = 8; low models at 0.5
    assert by_hand == pytest.approx((3 + 3 + 1.5 + 1.5 + 6 + 6 + 3 + 3 + 8 + 8 + 4 + 4) / 12 / 10)


def test_models_are_the_tasks_list_filtered_by_the_endpoint_or_all(judge):
    assert judge.resolve_models(["nope", "judge-b-low", "judge-a"]) == ["judge-b-low", "judge-a"]
    assert judge.resolve_models(["nope"]) == sorted(MODELS)
    assert judge.resolve_models([]) == sorted(MODELS)


def test_name_parts_are_sent_as_the_api_expects(server, judge):
    assert request_options("judge-a") == {}
    since = len(server.requests)
    judge.grade(graded("hi"), "judge-c-high-thinking", 0.1)
    judge.grade(graded("hi"), "judge-b-low", 0.3)
    thinking, low = server.requests[since:]
    assert thinking["reasoning_effort"] == "high"
    assert thinking["chat_template_kwargs"] == {"enable_thinking": True}
    assert (low["reasoning_effort"], low["chat_template_kwargs"], low["temperature"]) == (
        "low",
        None,
        0.3,
    )


@pytest.mark.parametrize(
    "fault",
    [
        lambda s: s.fail_next(1, 429, retry_after=0.05),
        lambda s: s.fail_next(2, 500),
        lambda s: s.malformed_next(2),
        lambda s: s.slow_next(1, 3),
    ],
    ids=["429-retry-after", "500", "malformed", "timeout"],
)
def test_faults_are_retried_until_a_grade_comes(server, judge, fault):
    fault(server)
    since = len(server.requests)
    reply = judge.grade(graded("abc"), "judge-a", 0.1)
    assert reply == Reply(4, 1.0, True)
    assert len(server.requests) - since >= 2 or server.requests[-1]["status"] == 200


def test_a_reply_never_parsable_counts_as_five_with_no_weight(server, judge):
    server.malformed_next(4)  # 1 try + 3 retries
    assert judge.grade(graded("abc"), "judge-a", 0.1) == Reply(5, 0, False)


def test_grades_are_clamped(server, judge):
    server.reply_next(1, '```json\n{"score": 42, "confidence": 3, "reasoning": "!"}\n```')
    assert judge.grade(graded("abc"), "judge-a", 0.1) == Reply(10, 1, True)
    assert parse_reply('Sure. {"score": -3, "confidence": -1}') == (1, 0)
    assert parse_reply('{"score": 7}') is None
    assert parse_reply("no json here") is None


def test_a_judge_that_keeps_failing_keeps_the_assignment(server, judge):
    server.fail_next(4, 503)
    began = time.monotonic()
    with pytest.raises(RecoverableException, match=f"judge endpoint {server.endpoint}"):
        judge.grade(graded("abc"), "judge-a", 0.1)
    assert time.monotonic() - began < 5


def test_a_wrong_key_or_no_endpoint_stops_at_start_up(server, monkeypatch):
    config = LlmJudgeConfig(supported_base_models=["b"])
    monkeypatch.setenv("OPENAI_BASE_URL", server.endpoint)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-000000")
    with pytest.raises(RecoverableException, match="refused the key") as refused:
        Judge.from_environment(config)
    assert server.endpoint in str(refused.value) and "sk-wrong" not in str(refused.value)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", closed)
    with pytest.raises(RecoverableException, match=f"judge endpoint {closed}: cannot list"):
        Judge.from_environment(config)
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(ConfigError, match="missing OPENAI_BASE_URL"):
        Judge.from_environment(config)


def test_prompt_ids_fall_back_to_direct_and_files_override(tmp_path):
    prompt = SimpleNamespace(transcript="User: 1+1? costs $5 {x}", reference="2", tools_text="")
    rubrics = load_rubrics({})
    direct = rubric_prompt(rubrics, 1, prompt, "two")
    assert rubric_prompt(rubrics, 99, prompt, "two") == direct
    assert "User: 1+1? costs $5 {x}" in direct and "<answer>\ntwo\n</answer>" in direct
    assert "<reference>\n2\n</reference>" in rubric_prompt(rubrics, 2, prompt, "two")
    custom = tmp_path / "mine.txt"
    custom.write_text("Q: $conversation A: $answer R: $reference")
    mine = load_rubrics({2: str(custom)})
    assert rubric_prompt(mine, 2, prompt, "two") == "Q: User: 1+1? costs $5 {x} A: two R: 2"
    with pytest.raises(ConfigError, match="rubric prompt 3: /no/such.txt cannot be read"):
        load_rubrics({3: "/no/such.txt"})
