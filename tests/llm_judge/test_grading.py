"""The network's grading rules (modules/llm_judge/grading.py) against values worked out by hand
from its behaviour (docs/llm-judge-scoring.md, "Judging")."""

from __future__ import annotations

import math
import random
import re

import pytest

from modules.llm_judge.grading import (
    CONVERSATION_FAILED,
    NO_SCORE,
    Grade,
    aggregate,
    call_parameters,
    conversation_grades,
    first_score_object,
    parse_reply,
    resolve_models,
    rubric_id,
    split_name,
)

NETWORK_PATTERN = re.compile(r'\{[^}]*"score"[^}]*\}', re.DOTALL)
LISTED = ["judge-a", "judge-b", "kimi-k2.5", "o3-high"]


# --- judge names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (["judge-a-high"], ["judge-a-high"]),  # accepted through its name without the suffix
        (["judge-a", "judge-a-low", "judge-a"], ["judge-a", "judge-a-low"]),  # each once, in order
        (["judge-z", "judge-b-thinking"], ["judge-b-thinking"]),  # the unknown one skipped
        (["judge-z"], LISTED),  # nothing left: every listed model
        ([], LISTED),
        (["Judge-A-HIGH"], LISTED),  # case-sensitive: neither the name nor the suffix match
        (["o3-high"], ["o3-high"]),  # listed as it is
    ],
)
def test_a_tasks_judge_list_resolves_against_the_listing(requested, expected):
    assert resolve_models(requested, LISTED) == expected


@pytest.mark.parametrize(
    ("name", "model", "options"),
    [
        ("judge-a", "judge-a", {}),
        ("judge-a-high", "judge-a", {"reasoning_effort": "high"}),
        (
            "judge-a-low-thinking",
            "judge-a",
            {"reasoning_effort": "low", "thinking": {"type": "enabled"}},
        ),
        ("claude-high-4", "claude-4", {"reasoning_effort": "high"}),  # any part, not only the end
        ("judge-a-HIGH", "judge-a-HIGH", {}),
        ("low", "low", {"reasoning_effort": "low"}),  # nothing left: the name as it is
        ("kimi-k2.5", "kimi-k2.5", {"thinking": {"type": "disabled"}}),
        ("kimi-k2.6-thinking", "kimi-k2.6", {"thinking": {"type": "enabled"}}),
    ],
)
def test_a_judge_name_splits_into_model_and_options(name, model, options):
    assert split_name(name) == (model, options)


def test_what_a_call_sends_for_each_kind_of_name():
    assert call_parameters("judge-a", 0.1) == {"model": "judge-a", "temperature": 0.1}
    assert call_parameters("o3-high", 0.3) == {
        "model": "o3",
        "temperature": 0.3,
        "reasoning_effort": "high",
    }
    thinking_on = {"extra_body": {"thinking": {"type": "enabled"}}}
    assert call_parameters("judge-b-thinking", 0.1) == {
        "model": "judge-b",
        "temperature": 0.1,
        "extra_body": thinking_on,
    }
    # kimi: 0.6 with thinking off, 1 for its -thinking name, whatever the task's temperature.
    assert call_parameters("kimi-k2.5", 0.1) == {
        "model": "kimi-k2.5",
        "temperature": 0.6,
        "extra_body": {"extra_body": {"thinking": {"type": "disabled"}}},
    }
    assert call_parameters("kimi-k2.6-thinking", 0.1) == {
        "model": "kimi-k2.6",
        "temperature": 1.0,
        "extra_body": thinking_on,
    }
    # Only the exact kimi names get the fixed temperature; thinking stays off for the others.
    assert call_parameters("kimi-k2.5-high", 0.2)["temperature"] == 0.2
    # Sent as the network sends it: its 1 is an int, and a task's value keeps its JSON type.
    assert type(call_parameters("kimi-k2.6-thinking", 0.1)["temperature"]) is int
    assert call_parameters("judge-a", 2)["temperature"] == 2
    assert type(call_parameters("judge-a", 2)["temperature"]) is int
    assert call_parameters("judge-a", "0.5")["temperature"] == "0.5"


# --- the rubric -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt_id", "reference", "tools", "expected"),
    [
        (1, None, None, 1),
        (True, None, None, 1),  # True == 1
        (0, "r", "[...]", 1),  # the network's default when the task gives none
        (7, "r", "[...]", 1),
        ("2", "r", "[...]", 1),  # text is not 2
        (None, None, None, 1),
        (2, "r", None, 2),
        (2.0, "r", None, 2),
        (2, None, "[...]", None),  # no reference: the conversation cannot be graded
        (2, "", "[...]", None),  # a blank reference is none
        (3, "r", "[...]", 3),
        (3, "r", None, None),  # no tools
        (3, None, "[...]", None),
        ([1], "r", "[...]", None),  # not a key the network can look up
    ],
)
def test_the_rubric_a_conversation_gets(prompt_id, reference, tools, expected):
    assert rubric_id(prompt_id, reference, tools) == expected


# --- reading a reply --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"score": 8, "confidence": 0.9, "reasoning": "fine"}', Grade(8.0, 0.9)),
        ('Sure.\n```json\n{"score": "7", "confidence": "0.5"}\n```', Grade(7.0, 0.5)),
        ('{"score": 12, "confidence": 3}', Grade(12.0, 3.0)),  # not clamped
        ('{"score": -4, "confidence": 1}', Grade(-4.0, 1.0)),
        ('{"score": 9}', Grade(9.0, 0.0)),  # no confidence: 0
        ('{"score": true, "confidence": false}', Grade(1.0, 0.0)),
        # <think> blocks are read like any text: the first object wins.
        (
            '<think>{"score": 3, "confidence": 1}</think>{"score": 9, "confidence": 1}',
            Grade(3.0, 1.0),
        ),
        # A nested object ends the match at its first "}": not JSON, so 5 x 0.
        ('{"score": 8, "detail": {"a": 1}, "confidence": 1}', NO_SCORE),
        # The first flat object holding "score", after others that do not.
        ('{"note": 1} then {"score": 6, "confidence": 0.5}', Grade(6.0, 0.5)),
        # The leftmost "{" whose stretch to the next "}" holds "score" is the outer one here.
        ('{"confidence": 0.5} {"x": {"score": 4, "confidence": 1}}', NO_SCORE),
        ("no json here", NO_SCORE),
        ("{'score': 8, 'confidence': 1}", NO_SCORE),  # "score" must be in double quotes
        ('{"score": 8, "confidence": 1,}', NO_SCORE),  # not JSON
        ('{"score": "high", "confidence": 1}', NO_SCORE),  # float() refuses: defaults stand
        ('{"score": 7, "confidence": "sure"}', Grade(7.0, 0.0)),  # the score read so far stands
        ('{"label": "score", "confidence": 0.8}', Grade(5.0, 0.8)),  # "score" only as a value
        ('{"score": null, "confidence": 1}', CONVERSATION_FAILED),
        ('{"score": [8], "confidence": 1}', CONVERSATION_FAILED),
        ('{"score": 8, "confidence": null}', CONVERSATION_FAILED),
        ('{"score": 1' + "0" * 400 + ', "confidence": 1}', CONVERSATION_FAILED),
        # Nested past the decoder's depth: a RecursionError in the network's call.
        ('{"score": ' + "[" * 5000 + "]" * 5000 + ', "confidence": 1}', CONVERSATION_FAILED),
    ],
)
def test_a_reply_is_read_as_the_network_reads_it(text, expected):
    assert parse_reply(text) == expected


def test_a_non_finite_grade_is_read_as_such():
    # The judge client refuses these as unusable replies (test_judging); the reading keeps them.
    assert math.isnan(parse_reply('{"score": NaN, "confidence": 1}').score)


@pytest.mark.parametrize("seed", range(20))
def test_the_score_object_search_finds_what_the_networks_pattern_finds(seed):
    # The rule as the network states it, a backtracking pattern, is the oracle on short texts.
    rng = random.Random(seed)
    pieces = ["{", "}", '"score"', '"sc"', ": 1", ",", " ", "x", '"confidence": 0.5']
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        match = NETWORK_PATTERN.search(text)
        assert first_score_object(text) == (match.group(0) if match else None), text


def test_the_score_object_search_is_linear_on_a_hostile_reply():
    text = "{" * 200_000 + '"score": 1}'
    assert first_score_object(text) == text  # the leftmost "{" reaches the only "}"
    assert first_score_object("{" * 200_000) is None
    assert first_score_object("}" * 5 + '{"score": 2}') == '{"score": 2}'


# --- the score --------------------------------------------------------------------------------


def test_a_conversation_with_a_failed_grade_counts_once_as_five_times_a_half():
    assert conversation_grades([Grade(8, 1), CONVERSATION_FAILED, Grade(6, 1)]) == [
        CONVERSATION_FAILED
    ]
    assert conversation_grades([Grade(8, 1), None]) == [CONVERSATION_FAILED]  # a refused request
    assert conversation_grades([Grade(8, 1), NO_SCORE]) == [Grade(8, 1), NO_SCORE]


def test_the_score_is_the_mean_of_score_times_confidence_over_ten():
    conversations = [[Grade(8, 1), Grade(6, 0.5)], [CONVERSATION_FAILED], [NO_SCORE]]
    # (8 + 3 + 2.5 + 0) / 4 = 3.375 -> 0.3375
    assert aggregate(conversations) == pytest.approx(0.3375)
    assert aggregate([[Grade(12, 3)]]) == pytest.approx(3.6)  # not clamped: neither is the mean
    assert aggregate([]) == 0.5  # no grade at all: the network's 5.0


@pytest.mark.parametrize(
    ("given", "names"),
    [
        (None, []),  # the network: an empty value means every listed model
        ("", []),
        ({}, []),
        (0, []),
        (False, []),
        ("ab", ["a", "b"]),  # text is iterated: its characters are the names
        ({"judge-a": 1}, ["judge-a"]),  # an object: its keys
        (["judge-a-high"], ["judge-a-high"]),
    ],
)
def test_eval_model_list_is_read_as_the_network_iterates_it(given, names):
    from modules.llm_judge.schemas import EvalArgs

    assert EvalArgs.model_validate({"eval_model_list": given}).eval_model_list == names


@pytest.mark.parametrize("given", [5, True, [5], [None]])
def test_eval_model_list_values_the_network_raises_on_are_refused(given):
    from pydantic import ValidationError

    from modules.llm_judge.schemas import EvalArgs

    with pytest.raises(ValidationError):
        EvalArgs.model_validate({"eval_model_list": given})


@pytest.mark.parametrize(
    ("field", "given", "kept"),
    [
        ("gen_require", 2, 2),
        ("gen_require", True, 1),  # Python's range(True) is range(1)
        ("eval_require", 3, 3),
        ("eval_require", True, 1),
        ("eval_require", "2", 0),  # 0: every conversation 5 x 0.5 (the network's tasks raise)
        ("eval_require", 2.0, 0),
        ("eval_require", [2], 0),
        ("temperature", 2, 2),
        ("temperature", "0.5", "0.5"),
        ("temperature", None, None),
        ("temperature", 0.25, 0.25),
    ],
)
def test_eval_args_are_kept_as_the_network_reads_them(field, given, kept):
    from modules.llm_judge.schemas import EvalArgs

    value = getattr(EvalArgs.model_validate({field: given}), field)
    assert value == kept and type(value) is type(kept)


@pytest.mark.parametrize(
    ("field", "given"),
    [
        ("gen_require", "2"),  # the network's range("2") raises for the whole assignment
        ("gen_require", 2.0),
        ("gen_require", None),
        ("eval_require", None),  # its count of calls raises before any grading
        ("eval_require", {"n": 2}),
        ("eval_require", 0),  # outside 1..16: ours, bounded cost
        ("eval_require", 17),
        ("temperature", "warm"),
        ("temperature", True),
        ("temperature", 3),
    ],
)
def test_eval_args_the_network_raises_on_or_past_our_bounds_are_refused(field, given):
    from pydantic import ValidationError

    from modules.llm_judge.schemas import EvalArgs

    with pytest.raises(ValidationError):
        EvalArgs.model_validate({field: given})
