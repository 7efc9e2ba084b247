"""Judging through the real openai client against the local OpenAI-compatible judge: what each
request carries, how replies count, retries, deadlines and failure outcomes
(docs/llm-judge-scoring.md, "Judging")."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from devkit.judge_server import LocalJudge
from devkit.validator_cli import wait_for
from modules.llm_judge import judging
from modules.llm_judge.grading import NO_SCORE, Grade
from modules.llm_judge.judging import Judge
from modules.llm_judge.schemas import LlmJudgeConfig
from validator.errors import ConfigError, OperatorError, TransientError
from validator.outbound.deadline import CallAbandoned, set_stop_event

KEY = "sk-judge-TEST-1234567890"
MODELS = ["judge-a", "judge-b", "kimi-k2.5"]
ABC = Grade(4.0, 1.0)  # the local judge's grade of "abc": 1 + 3, confidence 1


@pytest.fixture(scope="module")
def server():
    with LocalJudge(MODELS, KEY) as judge:
        yield judge


@pytest.fixture
def judge(server):
    server.fail_next(0)
    return Judge(server.endpoint, KEY, timeout=5, retries=3, concurrency=4, backoff_seconds=0.01)


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr(judging, "BACKOFF_SECONDS", 0.01)


def request(answer: str, system: str = "Be a fair judge.") -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Grade this.\n<answer>\n{answer}\n</answer>\nJSON, please."},
        {"role": "system", "content": system},
    ]


def since(server: LocalJudge, start: int) -> list[dict]:
    return server.requests[start:]


# --- what is sent -----------------------------------------------------------------------------


def test_each_request_carries_what_the_network_sends(server, judge):
    start = len(server.requests)
    grades = judge.ask_all(
        [
            (request("abc"), "judge-a"),
            (request("abc"), "judge-b-low"),
            (request("ab"), "kimi-k2.5"),
        ],
        0.1,
    )
    assert grades == [ABC, Grade(4.0, 0.5), Grade(3.0, 1.0)]
    calls = sorted(since(server, start), key=lambda c: c["model"])
    # The rubric as a user message, then the judge system message.
    assert all(c["messages"] == request(c["answer"]) for c in calls)
    assert [(c["model"], c["temperature"], c["reasoning_effort"]) for c in calls] == [
        ("judge-a", 0.1, None),
        ("judge-b", 0.1, "low"),  # the suffix taken off the name, sent as an effort
        ("kimi-k2.5", 0.6, None),
    ]
    assert [c["extra_body"] for c in calls] == [None, None, {"thinking": {"type": "disabled"}}]
    assert all(isinstance(c["seed"], int) and 0 <= c["seed"] <= 10_000 for c in calls)


def test_the_listing_resolves_the_tasks_names(judge):
    assert judge.models == MODELS  # as the endpoint lists them
    assert judge.resolve_models(["judge-a-high", "nope"]) == ["judge-a-high"]
    assert judge.resolve_models(["nope"]) == MODELS


# --- replies ----------------------------------------------------------------------------------


def test_a_reply_without_a_score_counts_five_times_zero_at_once(server, judge):
    server.reply_next(1, "I would rather not say.")
    start = len(server.requests)
    assert judge.ask(request("abc"), "judge-a", 0.1) == NO_SCORE
    assert len(since(server, start)) == 1  # not retried: the network does not retry it


def test_grades_are_not_clamped(server, judge):
    server.reply_next(1, '{"score": 14, "confidence": 2}')
    assert judge.ask(request("abc"), "judge-a", 0.1) == Grade(14.0, 2.0)


@pytest.mark.parametrize(
    "fault",
    [
        lambda s: s.fail_next(2, 500),
        lambda s: s.fail_next(1, 503),
        lambda s: s.fail_next(1, 408),
        lambda s: s.fail_next(3, 429),
        lambda s: s.raw_next(2, 200, "text/html", b"<html><body>Bad gateway</body></html>"),
        lambda s: s.raw_next(1, 200, "application/json", b'{"object": "chat.completion"}'),
        lambda s: s.raw_next(1, 200, "application/json", b'{"choices": []}'),
        lambda s: s.raw_next(
            1, 200, "application/json", b'{"choices": [{"message": {"content": null}}]}'
        ),
        lambda s: s.reply_next(2, '{"score": NaN, "confidence": 1}'),
    ],
    ids=["500", "503", "408", "429", "html", "not-a-completion", "no-choices",
         "null-content", "nan"],
)  # fmt: skip
def test_a_judge_that_gives_no_usable_completion_is_retried(server, judge, fault):
    fault(server)
    start = len(server.requests)
    assert judge.ask(request("abc"), "judge-a", 0.1) == ABC
    assert since(server, start)[-1]["status"] == 200


@pytest.mark.parametrize(
    "fault",
    [
        lambda s: s.raw_next(9, 200, "text/html", b"<html>maintenance</html>"),
        lambda s: s.raw_next(9, 200, "application/json", b'{"choices": []}'),
        lambda s: s.fail_next(9, 503),
    ],
    ids=["html", "no-choices", "503"],
)
def test_a_judge_that_never_gives_one_keeps_the_assignment(server, judge, fault):
    # Never 5 x 0 for the submission, never a module bug: the operator's problem, recoverable.
    fault(server)
    try:
        with pytest.raises(OperatorError, match=f"judge endpoint {server.endpoint}") as e:
            judge.ask(request("abc"), "judge-a", 0.1)
    finally:
        server.fail_next(0)
    assert "failed 4 times" in str(e.value) and KEY not in str(e.value)


def test_a_score_that_stays_not_finite_counts_as_no_score_unless_the_judge_gives_nothing_else(
    server,
):
    """A submission's answer can talk a judge into NaN or Infinity: once
    the retries give nothing else, that reply counts as one without a usable score, unless the
    judge gave no finite score in the whole assignment (then it is the judge failing)."""
    serial = Judge(server.endpoint, KEY, timeout=5, retries=3, concurrency=1, backoff_seconds=0)
    jobs = [(request("abc"), "judge-a"), (request("ab"), "judge-a")]
    server.reply_next(4, '{"score": Infinity, "confidence": 1}')
    start = len(server.requests)
    assert serial.ask_all(jobs, 0.1) == [NO_SCORE, Grade(3.0, 1.0)]
    assert len(since(server, start)) == 5  # the first retried three times, then counted
    server.reply_next(8, '{"score": NaN, "confidence": 1}')
    try:
        with pytest.raises(OperatorError, match="judge-a gave no finite score in any"):
            serial.ask_all(jobs, 0.1)
    finally:
        server.fail_next(0)


def test_a_trickling_judge_ends_at_the_deadline(server):
    judge = Judge(server.endpoint, KEY, timeout=1.0, retries=1, concurrency=1, backoff_seconds=0)
    server.trickle_next(2, 0.2)  # a byte every 0.2 s: no read ever times out
    left = server.trickles_left
    began = time.monotonic()
    with pytest.raises(OperatorError, match="no complete answer within 1 s"):
        judge.ask(request("abc"), "judge-a", 0.1)
    assert time.monotonic() - began < 30  # two attempts of 1 s, not the trickle's minute
    # Both attempts' connections were closed, not left reading in an abandoned thread.
    wait_for(lambda: server.trickles_left == left + 2, 30, "the judge to see both attempts leave")


@pytest.fixture
def stop():
    """The process's stop event, as the validator's signal handlers set it."""
    event = threading.Event()
    set_stop_event(event)
    yield event
    set_stop_event(None)


def test_a_stop_signal_ends_a_trickling_judge_call_and_keeps_the_assignment(server, stop):
    judge = Judge(server.endpoint, KEY, timeout=30, retries=3, concurrency=1, backoff_seconds=0)
    server.trickle_next(1, 0.2)
    start, left = len(server.requests), server.trickles_left
    threading.Timer(0.5, stop.set).start()
    with pytest.raises(CallAbandoned, match="abandoned: stopping") as raised:
        judge.ask_all([(request("abc"), "judge-a")], 0.1)
    # A TransientError, not the operator's OperatorError: the runner keeps the assignment.
    assert raised.value.stopped and isinstance(raised.value, TransientError)
    assert len(since(server, start)) == 1  # not tried again once stopping
    wait_for(lambda: server.trickles_left == left + 1, 30, "the judge to see the call leave")


def test_a_stop_signal_ends_the_wait_before_a_retry(server, stop):
    judge = Judge(server.endpoint, KEY, timeout=30, retries=3, concurrency=1, backoff_seconds=0)
    server.fail_next(1, 503, retry_after=30)
    start = len(server.requests)
    threading.Timer(0.5, stop.set).start()
    try:
        with pytest.raises(CallAbandoned, match="not tried again: stopping"):
            judge.ask(request("abc"), "judge-a", 0.1)
    finally:
        server.fail_next(0)
    assert [entry["status"] for entry in since(server, start)] == [503]


def test_retry_after_is_honoured_and_capped(server, judge, monkeypatch):
    server.fail_next(1, 429, retry_after=0.4)
    began = time.monotonic()
    assert judge.ask(request("abc"), "judge-a", 0.1) == ABC
    assert time.monotonic() - began >= 0.4  # the backoff alone would be 0.01 s
    monkeypatch.setattr(judging, "MAX_WAIT_SECONDS", 0.05)
    server.fail_next(1, 429, retry_after=30)
    assert judge.ask(request("abc"), "judge-a", 0.1) == ABC
    server.fail_next(1, 429, retry_after=-3)  # nonsense: no wait, no crash
    assert judge.ask(request("abc"), "judge-a", 0.1) == ABC


def test_a_refused_request_costs_its_conversation_unless_every_one_is_refused(server):
    serial = Judge(server.endpoint, KEY, timeout=5, retries=3, concurrency=1, backoff_seconds=0)
    server.fail_next(1, 400)
    start = len(server.requests)
    assert serial.ask_all([(request("abc"), "judge-a"), (request("ab"), "judge-a")], 0.1) == [
        None,  # refused: the caller counts the conversation once as 5 x 0.5
        Grade(3.0, 1.0),
    ]
    assert len(since(server, start)) == 2  # the refusal is not retried
    server.fail_next(2, 400)
    with pytest.raises(OperatorError, match="model judge-a refused every request"):
        serial.ask_all([(request("abc"), "judge-a"), (request("ab"), "judge-a")], 0.1)
    # A model the endpoint does not serve: 404 on every request.
    with pytest.raises(OperatorError, match="model gone refused every request"):
        serial.ask_all([(request("abc"), "gone")], 0.1)


def test_a_key_refused_while_grading_stops_at_once(server, judge):
    server.fail_next(1, 403)
    start = len(server.requests)
    with pytest.raises(OperatorError, match=r"refused the key \(HTTP 403\)") as error:
        judge.ask_all([(request("abc"), "judge-a")], 0.1)
    assert server.endpoint in str(error.value) and KEY not in str(error.value)
    assert len(since(server, start)) == 1


def test_a_failing_judge_stops_the_other_calls(server):
    judge = Judge(server.endpoint, KEY, timeout=5, retries=0, concurrency=2, backoff_seconds=0)
    server.fail_next(1000, 503)
    start = len(server.requests)
    try:
        with pytest.raises(OperatorError, match="last: HTTP 503"):
            judge.ask_all([(request(str(i)), "judge-a") for i in range(150)], 0.1)
    finally:
        server.fail_next(0)
    assert len(since(server, start)) <= 10  # not 150


def test_concurrency_is_capped():
    with LocalJudge(["judge-a"], KEY) as fresh:
        judge = Judge(fresh.endpoint, KEY, timeout=5, retries=0, concurrency=3)
        fresh.slow_next(9, 0.2)
        grades = judge.ask_all([(request(str(i)), "judge-a") for i in range(9)], 0.1)
        assert len(grades) == 9 and all(isinstance(g, Grade) for g in grades)
        assert fresh.peak_in_flight == 3


# --- start-up ---------------------------------------------------------------------------------


def test_a_wrong_key_or_no_endpoint_stops_at_start_up(server, monkeypatch, fast_backoff):
    config = LlmJudgeConfig(supported_base_models=["b"])
    wrong = "sk-wrong-key-000000"
    monkeypatch.setenv("OPENAI_BASE_URL", server.endpoint)
    monkeypatch.setenv("OPENAI_API_KEY", wrong)
    with pytest.raises(OperatorError, match="refused the key") as refused:
        Judge.from_environment(config)
    assert server.endpoint in str(refused.value) and wrong not in str(refused.value)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", closed)
    with pytest.raises(OperatorError, match=f"judge endpoint {closed}: cannot list") as gone:
        Judge.from_environment(config)
    assert "APIConnectionError" in str(gone.value) and wrong not in str(gone.value)
    monkeypatch.setenv("OPENAI_API_KEY", " ")
    with pytest.raises(ConfigError, match="missing OPENAI_API_KEY"):
        Judge.from_environment(config)
    monkeypatch.delenv("OPENAI_BASE_URL")
    with pytest.raises(ConfigError, match="missing OPENAI_BASE_URL"):
        Judge.from_environment(config)


def test_listing_the_models_at_start_up(server, monkeypatch, fast_backoff):
    monkeypatch.setenv("OPENAI_BASE_URL", server.endpoint + "/")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    config = LlmJudgeConfig(supported_base_models=["b"], judge_retries=2)
    server.fail_next(2, 502, models=True)
    judge = Judge.from_environment(config)
    assert judge.models == MODELS and judge.base_url == server.endpoint
    server.fail_next(3, 502, models=True)
    with pytest.raises(OperatorError, match=r"cannot list its models \(HTTP 502\)"):
        Judge.from_environment(config)
    # An endpoint that does not implement the listing: the network's one fallback model.
    server.fail_next(1, 404, models=True)
    assert Judge.from_environment(config).models == ["gpt-4o"]
    with LocalJudge([], KEY) as empty:
        monkeypatch.setenv("OPENAI_BASE_URL", empty.endpoint)
        with pytest.raises(OperatorError, match="lists no models"):
            Judge.from_environment(config)


def test_the_local_judge_wants_the_key(server):
    import openai

    client = openai.OpenAI(base_url=server.endpoint, api_key="sk-other", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_a_tasks_temperature_reaches_the_judge_with_its_json_type(server, judge):
    # The network sends eval_args' temperature as given: an int stays an int, text stays text.
    start = len(server.requests)
    judge.ask_all([(request("abc"), "judge-a")], 2)
    judge.ask_all([(request("abc"), "judge-a")], "0.5")
    sent = [call["temperature"] for call in since(server, start)]
    assert sent == [2, "0.5"] and type(sent[0]) is int


@pytest.mark.parametrize("given", ["2", 2.0, 2.5, [1]])
def test_an_eval_require_the_network_cannot_count_scores_each_conversation_5_x_half(
    server, judge, given
):
    # Its range(eval_require) raises in every conversation's task: each counts once 5 x 0.5,
    # so 0.25 whatever the answers, and no judge is asked.
    from modules.llm_judge.conversation import to_prompt
    from modules.llm_judge.judge_texts import builtin_texts
    from modules.llm_judge.schemas import EvalArgs

    prompts = [to_prompt({"conversations": [{"role": "user", "content": q}]}) for q in "QR"]
    answers = {(0, 0): "abc", (1, 0): "ab"}
    args = EvalArgs.model_validate({"eval_require": given})
    start = len(server.requests)
    score = judging.score_answers(judge, builtin_texts(), args, prompts, answers, ["judge-a"])
    assert score == pytest.approx(0.25)
    assert since(server, start) == []
    graded = EvalArgs.model_validate({"eval_require": 2})  # an int: graded as usual
    assert judging.score_answers(judge, builtin_texts(), graded, prompts, answers, ["judge-a"])
    assert len(since(server, start)) == 4
