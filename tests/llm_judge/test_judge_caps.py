"""Answers past the kit's caps in llm_judge's stack: a judge's completion or model
listing of megabytes of JSON values, plain or gzip-encoded (the `openai` client on httpx2, its
`http_client` given the kit's capping hooks), and a hostile Hub's listing under huggingface_hub
1.x (httpx, its `set_client_factory`). Each is read no further than its cap and never parsed:
the judge's a failed attempt (retried, then the operator's), the Hub's the submission's."""

from __future__ import annotations

import pytest

from devkit.judge_server import LocalJudge
from devkit.validator_cli import wait_for
from modules.llm_judge.judging import Judge
from tests.helpers.hostile_listing import hostile_listing_is_capped
from tests.helpers.peak_rss import peak_bytes, reset_peak
from validator.errors import OperatorError
from validator.outbound.answer_caps import ANSWER_CAPS

KEY = "sk-judge-TEST-1234567890"
MIB = 1 << 20
IN_FLIGHT = 12 * MIB
ABC = (4.0, 1.0)  # the local judge's grade of "abc"
COMPLETION = ANSWER_CAPS["judge.completion"].max_bytes


def request(answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Grade this.\n<answer>\n{answer}\n</answer>\n"}]


@pytest.fixture
def server():
    with LocalJudge(["judge-a"], KEY) as judge:
        yield judge


def judge_of(server: LocalJudge, retries: int = 3) -> Judge:
    return Judge(server.endpoint, KEY, timeout=30, retries=retries, concurrency=1,
                 backoff_seconds=0)  # fmt: skip


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
def test_an_oversized_completion_is_a_failed_attempt_read_to_its_cap(server, gzip):
    judge = judge_of(server)
    server.oversize_next(1, 40 * MIB, gzip=gzip)
    start = len(server.requests)
    grade = judge.ask(request("abc"), "judge-a", 0.1)
    assert (grade.score, grade.confidence) == ABC  # the retry's
    assert len(server.requests) == start + 2  # the oversized answer was not taken
    ((length, sent),) = wait_for(lambda: server.padded, 30, "the judge's record")
    assert sent <= COMPLETION + IN_FLIGHT
    assert gzip or length > 40 * MIB


def test_a_judge_that_only_sends_oversized_answers_is_the_operators(server):
    judge = judge_of(server)
    server.oversize_next(4, 4 * MIB)
    with pytest.raises(OperatorError) as caught:
        judge.ask(request("abc"), "judge-a", 0.1)
    message = str(caught.value)
    assert "failed 4 times" in message and KEY not in message
    assert f"over the {COMPLETION} bytes a judge.completion answer may have" in message


def test_an_oversized_model_listing_stops_the_start(server):
    server.oversize_next(4, 8 * MIB, models=True)
    with pytest.raises(OperatorError, match="cannot list its models .*judge.models"):
        judge_of(server)
    assert [sent <= ANSWER_CAPS["judge.models"].max_bytes + IN_FLIGHT for _, sent in server.padded]


def test_the_validators_memory_stays_bounded_under_oversized_judge_answers(server):
    # Measured in this process (its peak reset between the two): a child would spend 20 s
    # importing the module's stack for the same figure.
    judge = judge_of(server)
    server.oversize_next(4, 40 * MIB, after=1)  # the honest call's answer first
    reset_peak()
    judge.ask(request("abc"), "judge-a", 0.1)
    honest = peak_bytes()
    reset_peak()
    with pytest.raises(OperatorError, match="judge.completion"):
        judge.ask(request("abc"), "judge-a", 0.1)
    assert peak_bytes() <= 1.5 * honest, (peak_bytes(), honest)


def test_a_hostile_hubs_huge_listing_is_capped_under_huggingface_hub_1(tmp_path):
    hostile_listing_is_capped(tmp_path)
