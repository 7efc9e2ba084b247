"""Chat templates of the LoRA protocol (docs/lora-scoring.md, "Chat templates"): the strings each
template renders, and the table's own checks. Encoding and masking: test_lora_encoding.py.

Every expected string here was written out by hand from `chat_templates.json`, not produced by the
code under test: if the rendering drifts from the table, these tests say so.
"""

from __future__ import annotations

import json

import pytest

from modules.lora.dataset import render_pieces
from modules.lora.templates import DEFAULT_TABLE_PATH, UnknownTemplate, load_templates
from tests.helpers.lora_chat import CHAT, CHAT_PIECES, EOS

TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "description": "Unit", "enum": ["celsius", "kelvin"]},
            },
            "required": ["city"],
        },
    },
    {
        "name": "sum_all",
        "parameters": {"properties": {"values": {"type": "array", "items": {"type": "number"}}}},
    },
]
TOOL_PROMPT = (
    "You have access to the following tools:\n"
    "> Tool Name: get_weather\nTool Description: Weather for a city\nTool Args:\n"
    "  - city (string, required): City name\n"
    "  - unit (string): Unit, should be one of [celsius, kelvin]\n"
    "\n"
    "> Tool Name: sum_all\nTool Description: \nTool Args:\n"
    "  - values (array): , where each item should be number\n"
    "\n"
    "Use the following format if using a tool:\n"
    "```\n"
    "Action: tool name (one of [get_weather, sum_all])\n"
    "Action Input: the input to the tool, in a JSON format representing the kwargs "
    '(e.g. ```{"input": "hello world", "num_beams": 5}```)\n'
    "```\n"
)
TOOL_LINE = {
    "tools": json.dumps(TOOLS),
    "conversations": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "function_call",
            "content": '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
        },
        {"role": "observation", "content": ' {"temp": 21} '},
        {"role": "assistant", "content": "It is 21°C."},
        {"role": "user", "content": "Two calls?"},
        {
            "role": "function_call",
            "content": '[{"name": "a", "arguments": {"x": "é"}}, {"name": "b", "arguments": {}}]',
        },
        {"role": "assistant", "content": "Done."},
    ],
}
CALL_1 = 'Action: get_weather\nAction Input: {"city": "Paris", "unit": "celsius"}\n\n'
CALL_2 = 'Action: a\nAction Input: {"x": "é"}\n\nAction: b\nAction Input: {}\n\n'


@pytest.fixture(scope="module")
def templates():
    return load_templates()


# --- strings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(CHAT_PIECES))
def test_chat_line_renders_per_template(templates, key):
    assert render_pieces(CHAT, templates.get(key), EOS.get(key, "</s>")) == CHAT_PIECES[key]


def test_system_template_default_and_null(templates):
    qwen = templates.get("qwen1.5")
    line = {"conversations": CHAT["conversations"][:2]}
    turn = [
        ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", 0),
        ("Hello!<|im_end|>\n", 1),
    ]
    default_system = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", 0)
    assert render_pieces(line, qwen, "<|endoftext|>") == [default_system, *turn]
    assert render_pieces({**line, "system": None}, qwen, "<|endoftext|>") == turn
    # Only null skips: an empty (or blank, once stripped) system text still renders.
    empty = ("<|im_start|>system\n<|im_end|>\n", 0)
    assert render_pieces({**line, "system": "  "}, qwen, "<|endoftext|>") == [empty, *turn]
    # default's own system text is null, so without a line system there is no system piece.
    assert render_pieces(line, templates.get("default"), "</s>")[0] == ("User: Hi\nAssistant: ", 0)
    # gemma's default system text is "" (not null): its <bos> is always there.
    assert render_pieces(line, templates.get("gemma"), "<eos>")[0] == ("<bos>", 0)


def test_tools_function_calls_and_observations(templates):
    pieces = render_pieces(TOOL_LINE, templates.get("qwen1.5"), "<|endoftext|>")
    assert pieces == [
        ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", 0),
        (TOOL_PROMPT, 0),
        (
            "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
            + CALL_1
            + '<|im_start|>tool\n{"temp": 21}<im_end>\n<|im_start|>assistant\n',
            0,
        ),
        ("It is 21°C.<|im_end|>\n", 1),
        ("<|im_start|>user\nTwo calls?<|im_end|>\n<|im_start|>assistant\n" + CALL_2, 0),
        ("Done.<|im_end|>\n", 1),
    ]


def test_tool_and_function_formats_wrap(templates):
    pieces = render_pieces(TOOL_LINE, templates.get("phi4"), "<|endoftext|>")
    assert pieces[0] == ("<|tool|>" + TOOL_PROMPT + "<|/tool|>", 0)
    assert pieces[1][0] == (
        "<|user|>\nWeather in Paris?<|end|>\n<|assistant|>"
        f"<|tool_call|>{CALL_1}<|/tool_call|>"
        '<|tool|>\n{"temp": 21}<|end|>\n<|assistant|>'
    )


def test_empty_tools(templates):
    line = {"tools": "", "conversations": CHAT["conversations"][:2]}
    assert len(render_pieces(line, templates.get("default"), "</s>")) == 2
    # "[]" is a non-empty string: the reference renders the tool prompt with no tools.
    pieces = render_pieces({**line, "tools": "[]"}, templates.get("default"), "</s>")
    assert pieces[0] == (
        "You have access to the following tools:\n"
        "Use the following format if using a tool:\n```\n"
        "Action: tool name (one of [])\n"
        "Action Input: the input to the tool, in a JSON format representing the kwargs "
        '(e.g. ```{"input": "hello world", "num_beams": 5}```)\n```\n',
        0,
    )


def test_turns_after_last_assistant_are_dropped(templates):
    line = {
        "conversations": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": "A"},
            {"role": "user", "content": "Q2"},
            {"role": "function_call", "content": '{"name": "f", "arguments": {}}'},
            {"role": "observation", "content": "obs"},
        ]
    }
    assert render_pieces(line, templates.get("default"), "</s>") == [
        ("User: Q\nAssistant: ", 0),
        ("A </s>", 1),
    ]


@pytest.mark.parametrize(
    "content",
    ["not json", '{"name": "f"}', '[{"arguments": {}}]', '"just a string"'],
)
def test_bad_function_call_is_an_error(templates, content):
    line = {
        "conversations": [
            {"role": "function_call", "content": content},
            {"role": "assistant", "content": "x"},
        ]
    }
    with pytest.raises(ValueError):
        render_pieces(line, templates.get("default"), "</s>")


def test_unknown_template_key_is_refused_with_the_known_ones(templates):
    with pytest.raises(
        UnknownTemplate, match="'no-such-model' is not a chat-template key"
    ) as error:
        templates.get("no-such-model")
    assert "qwen1.5" in str(error.value) and "default" in str(error.value)


def _missing_key(table: dict) -> None:
    del table["templates"]["yi"]["user_format"]


def _extra_key(table: dict) -> None:
    table["templates"]["phi3"]["stop_wrd"] = "<|end|>"


def _mistyped(table: dict) -> None:
    table["tool_param"] = 3


def _null_where_required(table: dict) -> None:
    table["templates"]["gemma"]["user_format"] = None


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (_missing_key, r"templates\.yi\.user_format\n  Field required"),
        (_extra_key, r"templates\.phi3\.stop_wrd\n  Extra inputs are not permitted"),
        (_mistyped, r"tool_param\n  Input should be a valid string"),
        (_null_where_required, r"templates\.gemma\.user_format\n  Input should be a valid string"),
    ],
)
def test_malformed_table_fails_at_load_naming_the_key(tmp_path, change, where):
    table = json.loads(DEFAULT_TABLE_PATH.read_text(encoding="utf-8"))
    change(table)
    path = tmp_path / "chat_templates.json"
    path.write_text(json.dumps(table), encoding="utf-8")
    with pytest.raises(ValueError, match=where) as error:
        load_templates(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize(
    "tools",
    [
        "not json",
        '{"name": "f"}',
        '[{"name": "f"}]',
        '[{"name": 3, "parameters": {"properties": {}}}]',
    ],
)
def test_bad_tools_are_an_error(templates, tools):
    line = {"tools": tools, "conversations": CHAT["conversations"][:2]}
    with pytest.raises(ValueError):
        render_pieces(line, templates.get("default"), "</s>")
