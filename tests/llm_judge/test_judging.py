"""Judging through the real openai client against the local OpenAI-compatible judge: model
resolution, per-name parameters, retries, failure outcomes and the aggregate."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest

from devkit.judge_server import LocalJudge, answer_in
from modules.llm_judge import judging
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


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr(judging, "BACKOFF_SECONDS", 0.01)


def graded(text: str) -> str:
    return f"Grade this.\n<answer>\n{text}\n</answer>\nReply in JSON."


def calls_since(server: LocalJudge, since: int) -> list[dict]:
    return server.requests[since:]


def test_the_aggregate_is_the_mean_of_score_times_confidence_over_ten(server, judge):
    answers = ["ok", "a longer answer", "x" * 27]
    since = len(server.requests)
    replies = judge.grade_all([graded(a) for a in answers], ["judge-a", "judge-b-low"], 2, 0.1)
    # "ok": 1 + 2 = 3; "a longer answer": 1 + 15 % 10 = 6; 27 x: 1 + 7 = 8; a low model at 0.5;
    # ordered by answer, then model, then repeat.
    expected = [(3, 1), (3, 1), (3, 0.5), (3, 0.5), (6, 1), (6, 1), (6, 0.5), (6, 0.5)]
    expected += [(8, 1), (8, 1), (8, 0.5), (8, 0.5)]
    assert [(r.score, r.confidence) for r in replies] == expected
    assert aggregate(replies) == pytest.approx((6 + 3 + 12 + 6 + 16 + 8) / 12 / 10)
    calls = calls_since(server, since)
    assert len(calls) == 3 * 2 * 2  # answers x models x eval_require
    assert sorted(c["answer"] for c in calls if c["model"] == "judge-b-low") == sorted(answers * 2)
    assert {c["temperature"] for c in calls} == {0.1}


def test_aggregate_needs_replies():
    assert aggregate([Reply(10, 1, True), Reply(5, 0, False)]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no judge replies"):
        aggregate([])


def test_models_are_the_tasks_list_filtered_by_the_endpoint_or_all(judge):
    assert judge.resolve_models(["nope", "judge-b-low", "judge-a"]) == ["judge-b-low", "judge-a"]
    assert judge.resolve_models(["nope"]) == sorted(MODELS)
    assert judge.resolve_models([]) == sorted(MODELS)


def test_an_endpoint_with_no_models_is_unusable():
    with LocalJudge([], KEY) as empty:
        judge = Judge(empty.endpoint, KEY, timeout=2, retries=0, concurrency=1)
        with pytest.raises(RecoverableException, match=f"{empty.endpoint}: lists no models"):
            judge.resolve_models(["judge-a"])


def test_name_parts_are_sent_as_the_api_expects(server, judge):
    assert request_options("judge-a") == {}
    assert request_options("Judge-HIGH") == {"reasoning_effort": "high"}
    assert request_options("lowly-model") == {}  # whole parts only
    since = len(server.requests)
    judge.grade(graded("hi"), "judge-c-high-thinking", 0.1)
    judge.grade(graded("hi"), "judge-b-low", 0.3)
    judge.grade(graded("hi"), "judge-a", 0.7)
    thinking, low, plain = calls_since(server, since)
    assert thinking["reasoning_effort"] == "high"
    assert thinking["chat_template_kwargs"] == {"enable_thinking": True}
    assert (low["reasoning_effort"], low["chat_template_kwargs"], low["temperature"]) == (
        "low",
        None,
        0.3,
    )
    assert (plain["reasoning_effort"], plain["chat_template_kwargs"]) == (None, None)


@pytest.mark.parametrize(
    ("fault", "tries"),
    [
        (lambda s: s.fail_next(2, 500), 3),
        (lambda s: s.fail_next(1, 503), 2),
        (lambda s: s.fail_next(1, 408), 2),
        (lambda s: s.fail_next(3, 429), 4),
        (lambda s: s.malformed_next(2), 3),
        (lambda s: s.reply_next(1, ""), 2),
    ],
    ids=["500", "503", "408", "429", "malformed", "empty"],
)
def test_faults_are_retried_until_a_grade_comes(server, judge, fault, tries):
    fault(server)
    since = len(server.requests)
    assert judge.grade(graded("abc"), "judge-a", 0.1) == Reply(4, 1.0, True)
    calls = calls_since(server, since)
    assert len(calls) == tries
    assert [c["status"] for c in calls][-1] == 200


def test_retry_after_is_honoured_and_capped(server, judge, monkeypatch):
    server.fail_next(1, 429, retry_after=0.4)
    began = time.monotonic()
    assert judge.grade(graded("abc"), "judge-a", 0.1) == Reply(4, 1.0, True)
    assert time.monotonic() - began >= 0.4  # the backoff alone would be 0.01 s
    monkeypatch.setattr(judging, "MAX_WAIT_SECONDS", 0.05)
    server.fail_next(1, 429, retry_after=30)
    began = time.monotonic()
    assert judge.grade(graded("abc"), "judge-a", 0.1) == Reply(4, 1.0, True)
    assert time.monotonic() - began < 5
    server.fail_next(1, 429, retry_after=-3)  # nonsense: no wait, no crash
    assert judge.grade(graded("abc"), "judge-a", 0.1) == Reply(4, 1.0, True)


def test_the_backoff_doubles(server):
    judge = Judge(server.endpoint, KEY, timeout=2, retries=3, concurrency=1, backoff_seconds=0.1)
    server.fail_next(3, 500)
    began = time.monotonic()
    assert judge.grade(graded("abc"), "judge-a", 0.1).parsed
    assert time.monotonic() - began >= 0.1 + 0.2 + 0.4


def test_a_slow_reply_times_out_and_is_retried(server):
    judge = Judge(server.endpoint, KEY, timeout=0.3, retries=1, concurrency=1, backoff_seconds=0)
    server.fail_next(0)
    server.slow_next(1, 1.5)
    since = len(server.requests)
    began = time.monotonic()
    assert judge.grade(graded("abc"), "judge-a", 0.1) == Reply(4, 1.0, True)
    assert time.monotonic() - began < 1.4  # did not wait for the slow reply
    time.sleep(1.3)  # the slow request ends and is logged
    assert len(calls_since(server, since)) == 2
    server.slow_next(2, 1.0)
    with pytest.raises(RecoverableException, match="APITimeoutError"):
        judge.grade(graded("abc"), "judge-a", 0.1)
    time.sleep(1.0)


def test_a_reply_never_parsable_counts_as_five_with_no_weight(server, judge):
    server.malformed_next(4)  # 1 try + 3 retries
    since = len(server.requests)
    assert judge.grade(graded("abc"), "judge-a", 0.1) == Reply(5, 0, False)
    assert len(calls_since(server, since)) == 4
    server.malformed_next(2)
    replies = judge.grade_all([graded("abc")], ["judge-a"], 2, 0.1)  # 1st: 3 tries, 2nd: 1
    assert sorted(r.parsed for r in replies) == [True, True]
    judge.concurrency = 1  # so that the first answer's 4 tries take the first 4 faults
    server.malformed_next(4 + 1)
    replies = judge.grade_all([graded("abc"), graded("abcd")], ["judge-a"], 1, 0.1)
    # "abc": 5 x 0; "abcd" (1 malformed reply, then 1 + 4 = 5 at confidence 1)
    assert aggregate(replies) == pytest.approx((5 * 0 + 5 * 1) / 2 / 10)


def test_grades_are_clamped(server, judge):
    server.reply_next(1, '```json\n{"score": 42, "confidence": 3, "reasoning": "!"}\n```')
    assert judge.grade(graded("abc"), "judge-a", 0.1) == Reply(10, 1, True)
    server.reply_next(1, 'Here: {"score": -2, "confidence": -0.5, "reasoning": "bad"}.')
    assert judge.grade(graded("abc"), "judge-a", 0.1) == Reply(1, 0, True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('Sure. {"score": -3, "confidence": -1}', (1, 0)),
        ('{"score": "7", "confidence": "0.5"}', (7, 0.5)),
        ('{"score": 8, "confidence": 0.9, "reasoning": "prints {x} and }"}', (8, 0.9)),
        ('{"verdict": {"score": 6, "confidence": 1}}', (6, 1)),
        ('<think>maybe {"score": 2, "confidence": 1}</think>{"score": 9, "confidence": 1}', (9, 1)),
        ('{"score": 7}', None),
        ('{"score": true, "confidence": 1}', None),
        ('{"score": NaN, "confidence": 1}', None),
        ('{"score": "high", "confidence": 1}', None),
        ("[" * 5000 + "{" * 5000, None),
        ("no json here", None),
        (None, None),
    ],
)
def test_replies_are_parsed_tolerantly(text, expected):
    assert parse_reply(text) == expected


def test_a_judge_that_keeps_failing_keeps_the_assignment(server, judge):
    server.fail_next(4, 503)
    since = len(server.requests)
    began = time.monotonic()
    with pytest.raises(RecoverableException, match=f"judge endpoint {server.endpoint}") as error:
        judge.grade(graded("abc"), "judge-a", 0.1)
    assert "4 times (last: HTTP 503)" in str(error.value) and KEY not in str(error.value)
    assert len(calls_since(server, since)) == 4
    assert time.monotonic() - began < 5


def test_a_failing_judge_stops_the_other_calls(server):
    judge = Judge(server.endpoint, KEY, timeout=2, retries=0, concurrency=2, backoff_seconds=0)
    server.fail_next(1000, 503)
    since = len(server.requests)
    try:
        with pytest.raises(RecoverableException, match="last: HTTP 503"):
            judge.grade_all([graded(str(i)) for i in range(50)], ["judge-a"], 3, 0.1)
    finally:
        server.fail_next(0)
    assert len(calls_since(server, since)) <= 10  # not 150


def test_concurrency_is_capped():
    with LocalJudge(["judge-a"], KEY) as fresh:
        judge = Judge(fresh.endpoint, KEY, timeout=5, retries=0, concurrency=3)
        fresh.slow_next(9, 0.2)
        replies = judge.grade_all([graded(str(i)) for i in range(9)], ["judge-a"], 1, 0.1)
        assert len(replies) == 9 and all(r.parsed for r in replies)
        assert fresh.peak_in_flight == 3


def test_a_refused_request_counts_as_five_with_no_weight_unless_all_are(server, judge):
    server.fail_next(1, 400)
    since = len(server.requests)
    reply = judge.grade(graded("abc"), "judge-a", 0.1)
    assert reply == Reply(5, 0, False, refused="HTTP 400: injected fault")
    assert len(calls_since(server, since)) == 1  # not retried
    server.fail_next(1, 422)
    # One call at a time, so that the injected fault meets the first text, not whichever of
    # two concurrent calls reaches the server first.
    serial = Judge(server.endpoint, KEY, timeout=2, retries=3, concurrency=1, backoff_seconds=0.01)
    replies = serial.grade_all([graded("abc"), graded("ab")], ["judge-a"], 1, 0.1)
    assert [(r.score, r.confidence) for r in replies] == [(5, 0), (3, 1)]
    server.fail_next(2, 400)
    with pytest.raises(RecoverableException, match="model judge-a refused every request"):
        judge.grade_all([graded("abc"), graded("ab")], ["judge-a"], 1, 0.1)
    # A model the endpoint does not serve: 404 on every request.
    with pytest.raises(RecoverableException, match="model gone refused every request.*404"):
        judge.grade_all([graded("abc")], ["gone"], 2, 0.1)


def test_a_key_refused_while_grading_stops_at_once(server, judge):
    server.fail_next(1, 403)
    since = len(server.requests)
    with pytest.raises(RecoverableException, match=r"refused the key \(HTTP 403\)") as error:
        judge.grade_all([graded("abc")], ["judge-a"], 1, 0.1)
    assert server.endpoint in str(error.value) and KEY not in str(error.value)
    assert len(calls_since(server, since)) == 1


def test_a_wrong_key_or_no_endpoint_stops_at_start_up(server, monkeypatch, fast_backoff):
    config = LlmJudgeConfig(supported_base_models=["b"])
    wrong = "sk-wrong-key-000000"
    monkeypatch.setenv("OPENAI_BASE_URL", server.endpoint)
    monkeypatch.setenv("OPENAI_API_KEY", wrong)
    with pytest.raises(RecoverableException, match="refused the key") as refused:
        Judge.from_environment(config)
    assert server.endpoint in str(refused.value) and wrong not in str(refused.value)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", closed)
    with pytest.raises(RecoverableException, match=f"judge endpoint {closed}: cannot list") as gone:
        Judge.from_environment(config)
    assert "APIConnectionError" in str(gone.value) and wrong not in str(gone.value)
    monkeypatch.setenv("OPENAI_API_KEY", " ")
    with pytest.raises(ConfigError, match="missing OPENAI_API_KEY"):
        Judge.from_environment(config)
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(ConfigError, match="missing OPENAI_BASE_URL"):
        Judge.from_environment(config)


def test_listing_the_models_is_retried_at_start_up(server, monkeypatch, fast_backoff):
    monkeypatch.setenv("OPENAI_BASE_URL", server.endpoint + "/")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    config = LlmJudgeConfig(supported_base_models=["b"], judge_retries=2)
    server.fail_next(2, 502, models=True)
    judge = Judge.from_environment(config)
    assert judge.models == sorted(MODELS) and judge.base_url == server.endpoint
    server.fail_next(3, 502, models=True)
    with pytest.raises(RecoverableException, match=r"cannot list its models \(HTTP 502\)"):
        Judge.from_environment(config)
    server.fail_next(1, 404, models=True)  # not retried
    with pytest.raises(RecoverableException, match="HTTP 404"):
        Judge.from_environment(config)


def test_prompt_ids_fall_back_to_direct_and_files_override(tmp_path):
    transcript = "User: 1+1? costs $5 {x} ${answer}"
    prompt = SimpleNamespace(transcript=transcript, reference="2", tools_text="")
    rubrics = load_rubrics({})
    direct = rubric_prompt(rubrics, 1, prompt, "two")
    assert rubric_prompt(rubrics, 99, prompt, "two") == direct
    assert transcript in direct and "<answer>\ntwo\n</answer>" in direct
    assert "<reference>\n2\n</reference>" in rubric_prompt(rubrics, 2, prompt, "two")
    assert answer_in(direct) == "two"
    custom = tmp_path / "mine.txt"
    custom.write_text("Q: $conversation A: $answer R: $reference")
    mine = load_rubrics({2: str(custom)})
    assert rubric_prompt(mine, 2, prompt, "two") == f"Q: {transcript} A: two R: 2"
    assert rubric_prompt(mine, 1, prompt, "two") == direct  # the others stay the module's
    with pytest.raises(ConfigError, match="rubric prompt 3: /no/such.txt cannot be read"):
        load_rubrics({3: "/no/such.txt"})
    custom.write_bytes(b"x" * (judging.MAX_RUBRIC_BYTES + 1))
    with pytest.raises(ConfigError, match="rubric prompt 1: .* is over"):
        load_rubrics({1: str(custom)})


def test_the_modules_rubrics_fill_every_placeholder_and_ask_for_the_json():
    prompt = SimpleNamespace(
        transcript="User: weather in Paris?", reference="<tool_call>...", tools_text='[{"n": 1}]'
    )
    rubrics = load_rubrics({})
    criteria = ("factuality", "user satisfaction", "logical coherence", "richness", "clarity")
    direct = rubric_prompt(rubrics, 1, prompt, "sunny")
    assert all(c in direct for c in (*criteria, "instruction following"))
    call = rubric_prompt(rubrics, 3, prompt, "sunny")
    assert '[{"n": 1}]' in call and "<tool_call>..." in call
    for prompt_id in (1, 2, 3):
        text = rubric_prompt(rubrics, prompt_id, prompt, "sunny")
        assert "$" not in text and answer_in(text) == "sunny"
        assert '{"score": <integer 1-10>, "confidence": <number 0-1>' in text
    no_reference = SimpleNamespace(transcript="User: hi", reference=None, tools_text="")
    assert "<reference>\n(none)\n</reference>" in rubric_prompt(rubrics, 2, no_reference, "a")


def test_the_local_judge_wants_the_key(server):
    import openai

    client = openai.OpenAI(base_url=server.endpoint, api_key="sk-other", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        client.models.list()
    assert refused.value.status_code == 401 and "sk-other" not in str(refused.value)
    good = openai.OpenAI(base_url=server.endpoint, api_key=KEY, max_retries=0)
    assert sorted(m.id for m in good.models.list()) == sorted(MODELS)
