"""A validation line as chat messages, reference and transcript (docs/llm-judge-scoring.md),
against messages written out by hand."""

from __future__ import annotations

import json

import pytest

from devkit.validator_cli import REPO_ROOT
from modules.llm_judge.conversation import Line, read_prompts, render_calls, to_prompt

DATA = REPO_ROOT / "tests" / "fixtures" / "data"


def prompt(**line):
    return to_prompt(Line.model_validate(line))


def turn(role, content):
    return {"role": role, "content": content}


def test_a_chat_line_loses_its_last_answer_to_the_reference():
    got = prompt(
        system="Be brief.",
        conversations=[turn("user", "Hi"), turn("assistant", "Hello!"), turn("user", "2+2?"),
                       turn("assistant", "4")],
    )  # fmt: skip
    assert got.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ]
    assert (got.reference, got.reference_kind, got.tools) == ("4", "answer", None)
    assert got.transcript == "System: Be brief.\nUser: Hi\nAssistant: Hello!\nUser: 2+2?"


def test_a_line_ending_with_a_user_turn_has_no_reference_and_no_system():
    got = prompt(conversations=[turn("user", "Tell me a joke")])
    assert got.messages == [{"role": "user", "content": "Tell me a joke"}]
    assert (got.reference, got.reference_kind) == (None, None)


def test_calls_become_tool_calls_and_observations_answer_the_oldest_open_call():
    calls = [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": '{"y": "z"}'}]
    y_z = {"y": "z"}  # given as a JSON string, passed to the template as an object
    got = prompt(
        tools=json.dumps([{"name": "a"}, {"name": "b"}]),
        conversations=[
            turn("user", "do both"),
            turn("function_call", json.dumps(calls)),
            turn("observation", "A done"),
            turn("observation", "B done"),
            turn("function_call", json.dumps({"name": "a", "arguments": {"x": 2}})),
            turn("observation", "A again"),
            turn("assistant", "All done."),
        ],
    )
    assert got.messages == [
        {"role": "user", "content": "do both"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "a", "arguments": {"x": 1}}},
            {"id": "call_1", "type": "function", "function": {"name": "b", "arguments": y_z}},
        ]},
        {"role": "tool", "content": "A done", "tool_call_id": "call_0"},
        {"role": "tool", "content": "B done", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "a", "arguments": {"x": 2}}},
        ]},
        {"role": "tool", "content": "A again", "tool_call_id": "call_2"},
    ]  # fmt: skip
    assert got.tools == [{"name": "a"}, {"name": "b"}]
    assert json.loads(got.tools_text) == got.tools
    assert got.reference == "All done."
    assert "Function Call: " + json.dumps(calls) in got.transcript
    assert got.transcript.endswith("Observation: A again")


def test_a_line_ending_with_a_call_has_the_rendered_call_as_reference():
    call = {"name": "convert", "arguments": {"amount": 100, "to": "EUR", "opts": {"round": True}}}
    got = prompt(
        conversations=[turn("user", "100 USD in EUR?"), turn("function_call", json.dumps(call))]
    )
    assert got.reference_kind == "function_call"
    assert got.reference == (
        "<tool_call><function=convert><parameter=amount>100</parameter>"
        '<parameter=to>EUR</parameter><parameter=opts>{"round": true}</parameter>'
        "</function></tool_call>"
    )
    assert got.messages == [{"role": "user", "content": "100 USD in EUR?"}]


def test_several_calls_render_one_per_line():
    calls = [{"name": "f", "arguments": {"a": "1"}}, {"name": "g", "arguments": {}}]
    assert render_calls(calls) == (
        "<tool_call><function=f><parameter=a>1</parameter></function></tool_call>\n"
        "<tool_call><function=g></function></tool_call>"
    )


@pytest.mark.parametrize("tools", [None, "", "[]"])
def test_absent_or_empty_tools_are_none(tools):
    line = {"conversations": [turn("user", "hi")]}
    if tools is not None:
        line["tools"] = tools
    got = prompt(**line)
    assert (got.tools, got.tools_text) == (None, "")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ('{"conversations": [{"role": "robot", "content": "x"}]}', "line 2: conversations.0.role"),
        ('{"system": "x"}', "line 2: conversations: Field required"),
        ('{"conversations": [{"role": "assistant", "content": "x"}]}', "line 2: no prompt is left"),
        ('{"conversations": [{"role": "user", "content": "x"}, {"role": "function_call", '
         '"content": "nope"}]}', "line 2: "),
        ("[1, 2]", "line 2: must be a JSON object"),
    ],
)  # fmt: skip
def test_a_malformed_line_is_refused_naming_its_number(tmp_path, text, message):
    path = tmp_path / "set.jsonl"
    path.write_text('{"conversations": [{"role": "user", "content": "fine"}]}\n' + text + "\n")
    with pytest.raises(ValueError, match="validation set") as refused:
        read_prompts(path)
    assert message in str(refused.value)


def test_both_sample_sets_convert():
    chat = read_prompts(DATA / "chat_sample.jsonl")
    calls = read_prompts(DATA / "function_calling_sample.jsonl")
    raw = [json.loads(t) for t in (DATA / "function_calling_sample.jsonl").read_text().splitlines()]
    assert len(chat) == 10 and len(calls) == len(raw) == 299
    assert all(p.reference_kind == "answer" for p in chat)
    ends_with_call = sum(line["conversations"][-1]["role"] == "function_call" for line in raw)
    assert sum(p.reference_kind == "function_call" for p in calls) == ends_with_call
    with_tools = sum(bool(json.loads(line.get("tools") or "[]")) for line in raw)
    assert sum(p.tools is not None for p in calls) == with_tools > 0
    assert all(p.messages and p.transcript for p in chat + calls)
