"""A validation line as the network reads it: chat messages, reference and transcript
(docs/llm-judge-scoring.md, "Prompts and references"), against values written out by hand from
the network's behaviour."""

from __future__ import annotations

import json

import pytest

from devkit import DATA_DIR
from modules.llm_judge.conversation import (
    MAX_TEXT_CHARS,
    Prompt,
    read_prompts,
    render_reference,
    to_prompt,
)

DATA = DATA_DIR


def turn(role, content):
    return {"role": role, "content": content}


def call(name, arguments):
    return json.dumps({"name": name, "arguments": arguments})


def tool_call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def write(tmp_path, *lines):
    path = tmp_path / "set.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


SYSTEM_NONE = {"role": "system", "content": None}


# --- chat lines -------------------------------------------------------------------------------


def test_a_chat_line_loses_its_last_answer_to_the_reference():
    got = to_prompt(
        {
            "system": " Be brief. ",
            "conversations": [
                turn("user", " Hi "),
                turn("assistant", "Hello!"),
                turn("user", "2+2?"),
                turn("assistant", " 4 "),
            ],
        }
    )
    assert got == Prompt(
        # The system text as given (not stripped); turns stripped.
        messages=[
            {"role": "system", "content": " Be brief. "},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "2+2?"},
        ],
        tools=None,
        tools_text=None,
        reference=" 4 ",  # the last turn's content as the line gives it
        transcript="System:  Be brief. \n\nUser: Hi\n\nAssistant: Hello!\n\nUser: 2+2?",
    )


@pytest.mark.parametrize(
    ("system", "message", "block"),
    [
        ("absent", SYSTEM_NONE, "System: None"),
        (None, SYSTEM_NONE, "System: None"),
        ("", {"role": "system", "content": ""}, "System: "),
        ("  ", {"role": "system", "content": "  "}, "System:   "),
    ],
)
def test_the_system_message_is_always_there(system, message, block):
    line = {"conversations": [turn("user", "Q")]}
    if system != "absent":
        line["system"] = system
    got = to_prompt(line)
    assert got.messages == [message, {"role": "user", "content": "Q"}]
    assert got.transcript == f"{block}\n\nUser: Q"
    assert got.reference is None  # a line ending with a user turn has none


def test_blank_turns_and_unknown_roles_are_dropped():
    got = to_prompt(
        {
            "conversations": [
                turn("user", "A"),
                turn("assistant", "   "),
                turn("system", "ignored"),
                {"content": "no role"},
                {"role": "user"},
                turn("user", "B"),
            ]
        }
    )
    assert got.messages == [
        SYSTEM_NONE,
        {"role": "user", "content": "A"},
        {"role": "user", "content": "B"},
    ]


def test_a_blank_last_answer_still_takes_the_last_message_out():
    # The reference is decided by the last turn as written: a blank assistant turn gives a blank
    # reference, and the message before it leaves the prompt.
    got = to_prompt(
        {"conversations": [turn("user", "Q1"), turn("assistant", "A1"), turn("assistant", " ")]}
    )
    assert got.messages == [SYSTEM_NONE, {"role": "user", "content": "Q1"}]
    assert got.reference == " "


# --- function calls ---------------------------------------------------------------------------


def test_calls_become_tool_calls_numbered_by_turn_and_observations_answer_the_oldest():
    got = to_prompt(
        {
            "tools": '[{"name": "f"}]',
            "conversations": [
                turn("user", "U"),
                turn("function_call", call("f", {"a": 1})),
                turn("function_call", "not json"),  # a plain assistant turn; takes a number
                turn("function_call", json.dumps({"name": "g"})),  # no arguments: {}
                turn("observation", "O1"),
                turn("observation", "O2"),
                turn("observation", "O3"),  # no call open
                turn("user", "thanks"),
            ],
        }
    )
    assert got.messages == [
        SYSTEM_NONE,
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("call_1", "f", {"a": 1})]},
        {"role": "assistant", "content": "not json"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("call_3", "g", {})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "O1"},
        {"role": "tool", "tool_call_id": "call_3", "content": "O2"},
        {"role": "tool", "tool_call_id": "call_unknown", "content": "O3"},
        {"role": "user", "content": "thanks"},
    ]
    # Calls are empty Assistant blocks, observations are left out.
    assert got.transcript == (
        "System: None\n\nUser: U\n\nAssistant: \n\nAssistant: not json\n\nAssistant: \n\n"
        "User: thanks"
    )
    assert (got.tools, got.tools_text) == ([{"name": "f"}], '[{"name": "f"}]')


def test_a_line_ending_with_a_call_has_it_rendered_as_the_reference():
    arguments = {"flag": False, "mode": {"round": "half-up"}, "text": "a b", "n": 1.0, "x": None}
    got = to_prompt(
        {"conversations": [turn("user", "U"), turn("function_call", call("calc", arguments))]}
    )
    assert got.messages == [SYSTEM_NONE, {"role": "user", "content": "U"}]
    assert got.reference == (
        "\n\n<tool_call>\n<function=calc>\n<parameter=flag>False</parameter>\n"
        "<parameter=mode>{'round': 'half-up'}</parameter>\n<parameter=text>a b</parameter>\n"
        "<parameter=n>1.0</parameter>\n<parameter=x>None</parameter>\n</function>\n"
        "</tool_call>\n\n"
    )


def test_references_of_other_messages_render_by_role():
    assert render_reference({"role": "assistant", "content": "hi\n"}) == (
        "\n\n<assistant>\nhi\n\n</assistant>\n\n"
    )
    assert render_reference({"role": "user", "content": "u"}) == "\n<user>\nu\n</user>\n\n\n"
    assert render_reference({"role": "tool", "tool_call_id": "x", "content": "t"}) == (
        "\n<tool_response>\nt\n</tool_response>\n\n\n"
    )
    calls = {"role": "assistant", "content": "", "tool_calls": [tool_call("c", "f", {})]}
    assert render_reference(calls) == "\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>\n\n"


def test_a_last_call_that_is_not_json_is_rendered_as_assistant_text():
    got = to_prompt({"conversations": [turn("user", "U"), turn("function_call", "call f now")]})
    assert got.reference == "\n\n<assistant>\ncall f now\n</assistant>\n\n"


def test_several_calls_in_one_turn_are_read_call_by_call():
    # The network raises for the whole set here; this module keeps each call (doc's table).
    content = json.dumps([{"name": "f", "arguments": {}}, {"name": "g", "arguments": '{"b": 2}'}])
    got = to_prompt({"conversations": [turn("user", "U"), turn("function_call", content)]})
    assert got.reference == (
        "\n\n<tool_call>\n<function=f>\n</function>\n<function=g>\n<parameter=b>2</parameter>\n"
        "</function>\n</tool_call>\n\n"
    )


def arguments_of(messages):
    return [c["function"]["arguments"] for m in messages for c in m.get("tool_calls", [])]


@pytest.mark.parametrize(
    ("arguments", "as_object"),
    [('{"a": 1}', {"a": 1}), (None, {}), ("", {}), (" ", {}), ('{"\\u00e9": 1}', {"\u00e9": 1})],
)
def test_arguments_reach_the_template_as_given_and_as_an_object_after(arguments, as_object):
    # The network hands the template a call's arguments as the line gives them: a template that
    # prints text as text renders them so there, and scores. Qwen3.5's iterates them and raises
    # (no network score): the fallback, with the arguments read as an object, renders then.
    got = to_prompt(
        {"conversations": [turn("function_call", call("f", arguments)), turn("user", "U")]}
    )
    assert arguments_of(got.messages) == [arguments]
    assert arguments_of(got.fallback) == [as_object]
    assert [m for m in got.fallback if "tool_calls" not in m] == [
        m for m in got.messages if "tool_calls" not in m
    ]


def test_object_arguments_need_no_fallback_and_unreadable_ones_have_none():
    fine = to_prompt(
        {"conversations": [turn("function_call", call("f", {"a": 1})), turn("user", "U")]}
    )
    assert arguments_of(fine.messages) == [{"a": 1}] and fine.fallback is None
    odd = to_prompt({"conversations": [turn("function_call", call("f", [1])), turn("user", "U")]})
    assert arguments_of(odd.messages) == [[1]] and odd.fallback is None  # as given, only


# --- lines with nothing to prompt with, and lines the network cannot read ---------------------


def test_a_line_left_empty_is_skipped_unless_it_has_a_user_field():
    assert to_prompt({"conversations": [turn("assistant", "only a reference")]}) is None
    assert to_prompt({"conversations": []}) is None
    got = to_prompt({"user": " Hi ", "conversations": [turn("assistant", "ref")]})
    assert got.messages == [SYSTEM_NONE, {"role": "user", "content": "Hi"}]
    assert got.reference == "ref"  # taken before the line fell back to its user field


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ([1], "not a JSON object"),
        ({"conversations": [turn("user", 5)]}, "conversations.0.content: must be text"),
        ({"conversations": ["hi"]}, "conversations.0: not an object"),
        ({"conversations": [turn("user", "U"), {"content": "x"}]}, "conversations.1: no role"),
        ({"conversations": [turn("function_call", '"text"')]}, "a call must be a JSON object"),
        ({"conversations": [turn("function_call", call("f", [1]))]}, "must be a JSON object"),
        ({"conversations": [turn("user", "x" * (MAX_TEXT_CHARS + 1))]}, "over 1048576"),
        ({"tools": '{"name": "f"}', "conversations": [turn("user", "U")]}, "list of tool objects"),
        ({"tools": "[oops", "conversations": [turn("user", "U")]}, "not valid JSON"),
    ],
)
def test_lines_the_network_cannot_read_are_refused(line, message):
    with pytest.raises(ValueError, match=message):
        to_prompt(line)


@pytest.mark.parametrize(
    ("tools", "template", "text"),
    [
        ("absent", None, None),
        (None, None, None),
        ("null", None, "null"),  # JSON null: no tools for the template, as the network's
        # Empty tools reach the template as [] (transformers lists any iterable it is given).
        ("", [], None),
        ("[]", [], "[]"),  # the rubric still gets the text: "[]" is not empty text
        ([], [], None),
        ({}, [], None),
        ("{}", [], "{}"),
        ('""', [], '""'),  # JSON text of an empty string: iterated, it is empty too
        ([{"name": "f"}], [{"name": "f"}], "[{'name': 'f'}]"),  # written with str()
    ],
)
def test_tools_for_the_template_and_for_the_rubric(tools, template, text):
    line = {"conversations": [turn("user", "U")]}
    if tools != "absent":
        line["tools"] = tools
    got = to_prompt(line)
    assert (got.tools, got.tools_text) == (template, text)


# --- reading a set ----------------------------------------------------------------------------

FINE = json.dumps({"conversations": [turn("user", "fine")]})


def test_a_malformed_line_is_refused_naming_its_number(tmp_path):
    with pytest.raises(ValueError, match="validation set line 3: "):
        read_prompts(write(tmp_path, FINE, "", "{oops"))


def test_blank_and_empty_lines_are_skipped(tmp_path):
    empty = json.dumps({"conversations": [turn("assistant", "x")]})
    assert len(read_prompts(write(tmp_path, FINE, "  ", empty, FINE))) == 2


def test_a_set_with_nothing_to_prompt_with_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no line with a conversation"):
        read_prompts(write(tmp_path, "", json.dumps({"conversations": []})))


def test_a_set_over_max_lines_is_refused(tmp_path):
    with pytest.raises(ValueError, match="more than 2 lines"):
        read_prompts(write(tmp_path, FINE, FINE, FINE), max_lines=2)


def test_lines_end_at_newlines_not_at_unicode_separators(tmp_path):
    text = json.dumps({"conversations": [turn("user", "a\u2028b")]}, ensure_ascii=False)
    assert read_prompts(write(tmp_path, text))[0].messages[1]["content"] == "a\u2028b"


@pytest.mark.parametrize("end", ["\r", "\r\n", "\n"])
def test_lines_end_where_the_networks_text_mode_ends_them(tmp_path, end):
    # The network reads the set as text with universal newlines: a bare CR ends a line too.
    first = json.dumps({"conversations": [turn("user", "one")]})
    second = json.dumps({"conversations": [turn("user", "two")]})
    path = tmp_path / "set.jsonl"
    path.write_bytes((first + end + second + end).encode())
    got = [p.messages[1]["content"] for p in read_prompts(path)]
    assert got == ["one", "two"]


def test_a_set_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_bytes(FINE.encode() + b"\n\xff\xfe\n")
    with pytest.raises(ValueError, match="validation set: not UTF-8"):
        read_prompts(path)


def test_a_call_text_of_brackets_that_is_not_json_is_what_the_assistant_said():
    # Not JSON however many brackets it holds: the network keeps it as a plain assistant turn.
    text = "{" * 70
    got = to_prompt({"conversations": [turn("user", "U"), turn("function_call", text)]})
    assert got.reference == render_reference({"role": "assistant", "content": text})


def test_both_sample_sets_convert():
    chat = read_prompts(DATA / "chat_sample.jsonl")
    calls = read_prompts(DATA / "function_calling_sample.jsonl")
    assert chat and calls
    assert all(p.messages[0]["role"] == "system" for p in chat + calls)
    assert any("tool_calls" in m for p in calls for m in p.messages)


def test_lines_of_unicode_whitespace_are_blank_as_the_network_skips_them(tmp_path):
    # The network strips each text line with str.strip(): U+00A0, U+2028, U+0085 and U+001C
    # are whitespace there, so these lines are skipped, not refused; line numbers still count.
    good = json.dumps({"conversations": [turn("user", "Q")]})
    path = tmp_path / "set.jsonl"
    path.write_bytes(
        "\n".join([good, "\u00a0", "\u2028 ", "\x85", "\x1c\t", good]).encode("utf-8") + b"\n"
    )
    assert [p.messages for p in read_prompts(path)] == [
        [SYSTEM_NONE, {"role": "user", "content": "Q"}]
    ] * 2


@pytest.mark.parametrize(
    ("system", "written"),
    [
        ([{"type": "text", "text": "S"}], "System: [{'type': 'text', 'text': 'S'}]"),
        ([], "System: []"),
        (5, "System: 5"),  # Qwen3.5's template raises on it: the line then fails there
    ],
)
def test_a_system_that_is_not_text_is_kept_as_given_for_the_template(system, written):
    # Qwen3.5's template renders a list of text parts (the network scores such a line); the
    # judges' transcript writes the value with str(), as the network's f-string does.
    got = to_prompt({"system": system, "conversations": [turn("user", "Q")]})
    assert got.messages[0] == {"role": "system", "content": system}
    assert got.transcript == written + "\n\nUser: Q"
