"""A validation line as chat messages, reference and transcript (docs/llm-judge-scoring.md,
"Prompts and references"), against messages and texts written out by hand."""

from __future__ import annotations

import json

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from devkit.validator_cli import REPO_ROOT
from modules.llm_judge.conversation import MAX_TEXT_CHARS, Prompt, read_prompts, to_prompt

DATA = REPO_ROOT / "tests" / "fixtures" / "data"


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


# --- chat lines -------------------------------------------------------------------------------


def test_a_chat_line_loses_its_last_answer_to_the_reference():
    got = to_prompt(
        {
            "system": "Be brief.",
            "conversations": [
                turn("user", "Hi"),
                turn("assistant", "Hello!"),
                turn("user", "2+2?"),
                turn("assistant", "4"),
            ],
        }
    )
    assert got == Prompt(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "2+2?"},
        ],
        tools=None,
        tools_text="",
        reference="4",
        reference_kind="answer",
        transcript="System: Be brief.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser: 2+2?",
    )


def test_a_line_ending_with_a_user_turn_has_no_reference():
    got = to_prompt(
        {"conversations": [turn("user", "Hi"), turn("assistant", "Hello!"), turn("user", "Joke?")]}
    )
    assert got.messages == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Joke?"},
    ]
    assert (got.reference, got.reference_kind) == (None, None)
    assert got.transcript == "User: Hi\n\nAssistant: Hello!\n\nUser: Joke?"


@pytest.mark.parametrize(
    ("line", "first"),
    [
        ({"system": "  Be kind.\n"}, {"role": "system", "content": "Be kind."}),
        ({}, {"role": "user", "content": "Hi"}),
        ({"system": None}, {"role": "user", "content": "Hi"}),
        ({"system": " \n"}, {"role": "user", "content": "Hi"}),
    ],
)
def test_the_system_text_comes_first_when_the_line_has_one(line, first):
    got = to_prompt({**line, "conversations": [turn("user", "  Hi\n"), turn("assistant", " Yo ")]})
    assert got.messages[0] == first
    assert len(got.messages) == (2 if first["role"] == "system" else 1)
    assert got.reference == "Yo"  # contents are stripped, the reference too
    assert got.transcript.startswith(
        "System: Be kind.\n\nUser: Hi" if len(got.messages) == 2 else "User: Hi"
    )


# --- calls and observations -------------------------------------------------------------------


def test_calls_become_tool_calls_numbered_from_one_across_the_conversation():
    got = to_prompt(
        {
            "conversations": [
                turn("user", "Weather in Paris and Rome, then the time?"),
                turn(
                    "function_call",
                    json.dumps(
                        [
                            {"name": "weather", "arguments": {"city": "Paris"}},
                            {"name": "weather", "arguments": {"city": "Rome"}},
                        ]
                    ),
                ),
                turn("observation", "Paris: 18C"),
                turn("observation", "Rome: 24C"),
                turn("function_call", call("time", {})),
                turn("observation", "12:00"),
                turn("assistant", "18C, 24C, noon."),
            ]
        }
    )
    assert got.messages == [
        {"role": "user", "content": "Weather in Paris and Rome, then the time?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                tool_call("call_1", "weather", {"city": "Paris"}),
                tool_call("call_2", "weather", {"city": "Rome"}),
            ],
        },
        {"role": "tool", "content": "Paris: 18C", "tool_call_id": "call_1"},
        {"role": "tool", "content": "Rome: 24C", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("call_3", "time", {})]},
        {"role": "tool", "content": "12:00", "tool_call_id": "call_3"},
    ]
    assert (got.reference, got.reference_kind) == ("18C, 24C, noon.", "answer")


def test_observations_answer_the_oldest_open_call_across_turns():
    got = to_prompt(
        {
            "conversations": [
                turn("user", "Two things"),
                turn("function_call", call("a", {"x": 1})),
                turn("function_call", call("b", {"y": 2})),
                turn("observation", "from a"),
                turn("observation", "from b"),
                turn("observation", "from nobody"),
            ]
        }
    )
    assert got.messages[1:] == [
        {"role": "assistant", "content": "", "tool_calls": [tool_call("call_1", "a", {"x": 1})]},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("call_2", "b", {"y": 2})]},
        {"role": "tool", "content": "from a", "tool_call_id": "call_1"},
        {"role": "tool", "content": "from b", "tool_call_id": "call_2"},
        {"role": "tool", "content": "from nobody"},  # no call is open: it answers none
    ]
    assert (got.reference, got.reference_kind) == (None, None)


def test_a_line_ending_with_a_call_has_the_rendered_call_as_reference():
    arguments = {
        "to": "EUR",
        "amount": 100,
        "rate": 0.92,
        "exact": True,
        "note": None,
        "options": {"round": "half-up", "digits": 2},
        "via": ["USD", "GBP"],
        "label": "café",
    }
    got = to_prompt(
        {
            "conversations": [
                turn("user", "100 USD in EUR?"),
                turn("function_call", call("convert", arguments)),
            ]
        }
    )
    assert got.reference_kind == "function_call"
    assert got.reference == (
        "<tool_call><function=convert>"
        "<parameter=to>EUR</parameter>"
        "<parameter=amount>100</parameter>"
        "<parameter=rate>0.92</parameter>"
        "<parameter=exact>true</parameter>"
        "<parameter=note>null</parameter>"
        '<parameter=options>{"round": "half-up", "digits": 2}</parameter>'
        '<parameter=via>["USD", "GBP"]</parameter>'
        "<parameter=label>café</parameter>"
        "</function></tool_call>"
    )
    assert got.messages == [{"role": "user", "content": "100 USD in EUR?"}]
    assert got.transcript == "User: 100 USD in EUR?"


def test_a_final_turn_of_several_calls_renders_one_per_line():
    calls = [
        {"name": "f", "arguments": '{"a": "1"}'},
        {"name": "g"},
        {"name": "h", "arguments": ""},
    ]
    got = to_prompt(
        {"conversations": [turn("user", "go"), turn("function_call", json.dumps(calls))]}
    )
    assert got.reference == (
        "<tool_call><function=f><parameter=a>1</parameter></function></tool_call>\n"
        "<tool_call><function=g></function></tool_call>\n"
        "<tool_call><function=h></function></tool_call>"
    )


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"city": "Paris", "days": 3}, {"city": "Paris", "days": 3}),
        ('{"city": "Paris", "days": 3}', {"city": "Paris", "days": 3}),
        (' {"city": "Paris", "days": 3} ', {"city": "Paris", "days": 3}),
        ({}, {}),
        ("", {}),
        (None, {}),
    ],
)
def test_arguments_reach_the_template_as_an_object_whether_given_as_text_or_not(
    arguments, expected
):
    line = {
        "conversations": [
            turn("user", "Weather?"),
            turn("function_call", call("weather", arguments)),
            turn("observation", "sunny"),
        ]
    }
    got = to_prompt(line)
    assert got.messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [tool_call("call_1", "weather", expected)],
    }
    # The transcript shows the call as the line gives it.
    assert got.transcript == (
        f"User: Weather?\n\nFunction Call: {call('weather', arguments)}\n\nObservation: sunny"
    )
    # As a final turn, both forms give the same reference.
    ending = to_prompt({"conversations": line["conversations"][:2]})
    params = "".join(f"<parameter={k}>{v}</parameter>" for k, v in expected.items())
    assert ending.reference == f"<tool_call><function=weather>{params}</function></tool_call>"


def test_the_transcript_writes_every_turn_with_its_label():
    got = to_prompt(
        {
            "system": "Tools help.",
            "tools": '[{"name": "lookup"}]',
            "conversations": [
                turn("user", "Look up X"),
                turn("assistant", "Sure."),
                turn("function_call", '{"name": "lookup", "arguments": {"q": "X"}}'),
                turn("observation", '{"found": true}'),
                turn("user", "Thanks"),
                turn("assistant", "You're welcome."),
            ],
        }
    )
    assert got.transcript == (
        "System: Tools help.\n\n"
        "User: Look up X\n\n"
        "Assistant: Sure.\n\n"
        'Function Call: {"name": "lookup", "arguments": {"q": "X"}}\n\n'
        'Observation: {"found": true}\n\n'
        "User: Thanks"
    )


# --- tools ------------------------------------------------------------------------------------


def test_tools_given_as_a_json_list_are_parsed_and_kept_as_text():
    text = '[{"name": "lookup", "parameters": {"type": "object", "properties": {"q": {}}}}]'
    got = to_prompt({"tools": f" {text}\n", "conversations": [turn("user", "hi")]})
    assert got.tools == [
        {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {}}}}
    ]
    assert got.tools_text == text


def test_tools_given_as_a_list_are_taken_too():
    got = to_prompt({"tools": [{"name": "é"}], "conversations": [turn("user", "hi")]})
    assert (got.tools, got.tools_text) == ([{"name": "é"}], '[{"name": "é"}]')


@pytest.mark.parametrize("tools", ["absent", None, "", "  ", "[]", []])
def test_absent_or_empty_tools_are_none(tools):
    line = {"conversations": [turn("user", "hi")]}
    if tools != "absent":
        line["tools"] = tools
    got = to_prompt(line)
    assert (got.tools, got.tools_text) == (None, "")


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ("{not json", "tools: not valid JSON"),
        ('{"name": "a"}', "tools: must be a JSON list of tool objects"),
        ('["a"]', "tools: must be a JSON list of tool objects"),
        (7, "tools: must be a JSON list of tool objects"),
        ("x" * (MAX_TEXT_CHARS + 1), "tools: "),
    ],
)
def test_bad_tools_are_refused(tools, message):
    with pytest.raises(ValueError) as refused:
        to_prompt({"tools": tools, "conversations": [turn("user", "hi")]})
    assert str(refused.value).startswith(message)


# --- the messages reach a chat template -------------------------------------------------------

# Written for this test in the manner of Qwen3.5's template: it walks a call's arguments with
# `|items` (a JSON string would make it fail) and writes non-string values with tojson.
TEMPLATE = """\
{%- for m in messages -%}
{%- if m.tool_calls -%}
[{{ m.role }}]{% for c in m.tool_calls %}{{ c.id }}:{{ c.function.name }}(
{%- for k, v in c.function.arguments|items %}{{ k }}={{ v if v is string else v|tojson }};
{%- endfor %}){% endfor %}
{%- elif m.role == "tool" -%}
[tool {{ m.tool_call_id }}]{{ m.content }}
{%- else -%}
[{{ m.role }}]{{ m.content }}
{%- endif %}{{ "\\n" }}
{%- endfor -%}
{%- if tools %}[tools]{{ tools|map(attribute="name")|join(",") }}{% endif -%}"""


def test_the_messages_render_through_a_template_that_walks_the_arguments():
    got = to_prompt(
        {
            "system": "S",
            "tools": '[{"name": "f"}, {"name": "g"}]',
            "conversations": [
                turn("user", "U"),
                turn("function_call", '[{"name": "f", "arguments": "{\\"a\\": [1]}"}, '
                                      '{"name": "g", "arguments": {"b": "x"}}]'),
                turn("observation", "O1"),
                turn("observation", "O2"),
                turn("assistant", "A"),
            ],
        }
    )  # fmt: skip
    rendered, _ = render_jinja_template([got.messages], tools=got.tools, chat_template=TEMPLATE)
    assert rendered[0] == (
        "[system]S\n[user]U\n[assistant]call_1:f(a=[1];)call_2:g(b=x;)\n"
        "[tool call_1]O1\n[tool call_2]O2\n[tools]f,g"
    )


# --- reading a set ----------------------------------------------------------------------------

FINE = json.dumps({"conversations": [turn("user", "fine")]})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "validation set line 3: not valid JSON"),
        ("[1, 2]", "validation set line 3: not a JSON object"),
        (json.dumps({"conversations": [turn("robot", "x")]}), "line 3: conversations.0.role:"),
        (json.dumps({"system": "x"}), "validation set line 3: conversations: Field required"),
        (json.dumps({"conversations": []}), "validation set line 3: conversations: List should"),
        (json.dumps({"conversations": [{"role": "user"}]}), "line 3: conversations.0.content:"),
        (json.dumps({"conversations": [turn("user", 5)]}), "line 3: conversations.0.content:"),
        (json.dumps({"system": 1, "conversations": [turn("user", "x")]}), "line 3: system:"),
        (
            json.dumps({"conversations": [turn("assistant", "x")]}),
            "validation set line 3: conversations: nothing is left to prompt with",
        ),
        (
            json.dumps({"conversations": [turn("user", "x"), turn("function_call", "nope")]}),
            "validation set line 3: conversations.1.content: not valid JSON",
        ),
        (
            json.dumps({"conversations": [turn("user", "x"), turn("function_call", "[]")]}),
            "validation set line 3: conversations.1: a function call turn holds 1 to",
        ),
        (
            json.dumps(
                {"conversations": [turn("function_call", '[{"arguments": {}}]'), turn("user", "x")]}
            ),
            "validation set line 3: conversations.0.content[0].name: Field required",
        ),
        (
            json.dumps(
                {"conversations": [turn("user", "x"), turn("function_call", call("f", "[1]"))]}
            ),
            "validation set line 3: conversations.1.content.arguments: must be a JSON object",
        ),
        (
            json.dumps({"conversations": [turn("user", "x"), turn("function_call", call("f", 3))]}),
            "validation set line 3: conversations.1.content.arguments: must be a JSON object",
        ),
        (
            json.dumps({"conversations": [turn("user", "x" * (MAX_TEXT_CHARS + 1))]}),
            "validation set line 3: conversations.0.content: String should have at most",
        ),
    ],
)
def test_a_malformed_line_is_refused_naming_its_number(tmp_path, text, message):
    path = write(tmp_path, FINE, "", text, FINE)  # the blank line 2 is skipped, yet counted
    with pytest.raises(ValueError) as refused:
        read_prompts(path)
    assert message in str(refused.value)


def test_blank_lines_are_skipped(tmp_path):
    got = read_prompts(write(tmp_path, "", FINE, "  ", FINE, ""))
    assert [p.messages for p in got] == [[{"role": "user", "content": "fine"}]] * 2


def test_a_set_with_no_lines_is_refused(tmp_path):
    with pytest.raises(ValueError, match="validation set: no lines"):
        read_prompts(write(tmp_path, "", " "))


def test_a_set_over_max_lines_is_refused(tmp_path):
    path = write(tmp_path, FINE, FINE, FINE)
    assert len(read_prompts(path, max_lines=3)) == 3
    with pytest.raises(ValueError, match="more than 2 lines"):
        read_prompts(path, max_lines=2)


def test_lines_end_at_newlines_only(tmp_path):
    # U+2028 is a line separator to str.splitlines, and JSON allows it raw inside strings.
    line = json.dumps({"conversations": [turn("user", "a\u2028b")]}, ensure_ascii=False)
    (got,) = read_prompts(write(tmp_path, line))
    assert got.messages == [{"role": "user", "content": "a\u2028b"}]


# --- the sample sets --------------------------------------------------------------------------


def raw_lines(name):
    return [json.loads(t) for t in (DATA / name).read_text(encoding="utf-8").splitlines()]


def test_both_sample_sets_convert():
    chat = read_prompts(DATA / "chat_sample.jsonl")
    calls = read_prompts(DATA / "function_calling_sample.jsonl")
    raw = raw_lines("function_calling_sample.jsonl")
    assert (len(chat), len(calls), len(raw)) == (10, 299, 299)
    # Every sample line ends with an answer.
    assert all(p.reference_kind == "answer" and p.reference for p in chat + calls)
    with_tools = sum(bool(json.loads(line.get("tools") or "[]")) for line in raw)
    assert sum(p.tools is not None for p in calls) == with_tools > 0
    assert sum(len(p.tools_text) > 0 for p in calls) == with_tools
    with_calls = sum(
        any(t["role"] == "function_call" for t in line["conversations"]) for line in raw
    )
    assert sum(any("tool_calls" in m for m in p.messages) for p in calls) == with_calls > 0
    for prompt in chat + calls:
        assert prompt.messages[0]["role"] == "system"
        assert all(m.get("tool_call_id") for m in prompt.messages if m["role"] == "tool")
        assert prompt.transcript.startswith("System: ")


def test_sample_lines_cut_after_their_last_call_give_call_references(tmp_path):
    cut = []
    for line in raw_lines("function_calling_sample.jsonl"):
        roles = [t["role"] for t in line["conversations"]]
        if "function_call" in roles:
            last = len(roles) - 1 - roles[::-1].index("function_call")
            cut.append({**line, "conversations": line["conversations"][: last + 1]})
    got = read_prompts(write(tmp_path, *(json.dumps(line) for line in cut)))
    assert len(got) == len(cut) > 0
    assert all(p.reference_kind == "function_call" for p in got)
    for prompt, line in zip(got, cut, strict=True):
        final = json.loads(line["conversations"][-1]["content"])
        assert prompt.reference.startswith(f"<tool_call><function={final['name']}>")
        for key in final["arguments"]:
            assert f"<parameter={key}>" in prompt.reference
        assert len(prompt.messages) == len(line["conversations"])  # system in, the call out
