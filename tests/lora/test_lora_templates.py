"""Chat templates and validation-set encoding of the LoRA protocol (docs/lora-scoring.md,
"Tokenizer", "Chat templates", "Encoding and masking").

Every expected string here was written out by hand from `chat_templates.json`, not produced by the
code under test: if the rendering drifts from the table, these tests say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

import modules.lora.dataset as lora_dataset
from devkit import DATA_DIR
from devkit.tiny_tokenizer import build_tokenizer
from modules.lora.dataset import (
    ChatLine,
    EncodedSetCache,
    encode_example,
    encode_set,
    load_tokenizer,
    read_jsonl,
    render_pieces,
)
from modules.lora.templates import DEFAULT_TABLE_PATH, UnknownTemplate, load_templates

DATA = DATA_DIR

CHAT = {
    "system": "  Be brief.  ",
    "conversations": [
        {"role": "user", "content": "  Hi  "},
        {"role": "assistant", "content": " Hello! "},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "See you"},
        {"role": "user", "content": "dropped?"},
    ],
}

CHAT_PIECES = {
    "qwen1.5": [
        ("<|im_start|>system\nBe brief.<|im_end|>\n", 0),
        ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", 0),
        ("Hello!<|im_end|>\n", 1),
        ("<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n", 0),
        ("See you<|im_end|>\n", 1),
    ],
    "llama3": [
        ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>", 0),
        (
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            0,
        ),
        ("Hello!<|eot_id|>", 1),
        (
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            0,
        ),
        ("See you<|eot_id|>", 1),
    ],
    # gemma's system format has no {content}: any system text renders as a bare <bos>.
    "gemma": [
        ("<bos>", 0),
        ("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", 0),
        ("Hello!<eos>\n", 1),
        ("<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n", 0),
        ("See you<eos>\n", 1),
    ],
    # default fills {stop_token} with the tokenizer's eos token (here "</s>").
    "default": [
        ("System: Be brief.\n\n", 0),
        ("User: Hi\nAssistant: ", 0),
        ("Hello! </s>", 1),
        ("User: Bye\nAssistant: ", 0),
        ("See you </s>", 1),
    ],
    # phi3 has no system format: the line's system text is skipped.
    "phi3": [
        ("<|user|>\nHi<|end|>\n<|assistant|>", 0),
        ("Hello!<|end|>\n", 1),
        ("<|user|>\nBye<|end|>\n<|assistant|>", 0),
        ("See you<|end|>\n", 1),
    ],
    "zephyr": [
        ("<|system|>\nBe brief.</s>", 0),
        ("<|user|>\nHi</s>\n<|assistant|>\n", 0),
        ("Hello!</s>\n", 1),
        ("<|user|>\nBye</s>\n<|assistant|>\n", 0),
        ("See you</s>\n", 1),
    ],
}
EOS = {"qwen1.5": "<|endoftext|>", "llama3": "<|eot_id|>", "gemma": "<eos>"}

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


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return {
        kind: AutoTokenizer.from_pretrained(build_tokenizer(root / kind, kind))
        for kind in ("qwen", "llama3", "gemma", "default")
    }


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "set.jsonl"
    path.write_text(text, encoding="utf-8")
    return path


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


# --- tokens -----------------------------------------------------------------------------------


def _expected(tokenizer, pieces):
    ids, mask = [], []
    for text, value in pieces:
        piece_ids = tokenizer.encode(text, add_special_tokens=False)
        ids += piece_ids
        mask += [value] * len(piece_ids)
    return ids, mask


def test_mask_layout(templates, tokenizers):
    tok = tokenizers["qwen"]
    example = encode_example(CHAT, templates.get("qwen1.5"), tok, 4096)
    ids, mask = _expected(tok, CHAT_PIECES["qwen1.5"])
    assert (example.input_ids, example.target_mask) == (ids, mask)
    # Each template marker is one special token, so the layout is easy to read off.
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert example.input_ids.count(im_end) == 5
    assert example.target_mask[0] == 0 and example.target_mask[-1] == 1
    assert example.target_count == sum(
        len(tok.encode(t, add_special_tokens=False))
        for t in ("Hello!<|im_end|>\n", "See you<|im_end|>\n")
    )


def test_truncation(templates, tokenizers):
    tok = tokenizers["qwen"]
    full = encode_example(CHAT, templates.get("qwen1.5"), tok, 4096)
    cut = encode_example(CHAT, templates.get("qwen1.5"), tok, 12)
    assert cut.input_ids == full.input_ids[:12] and cut.target_mask == full.target_mask[:12]
    with pytest.raises(ValueError):
        encode_example(CHAT, templates.get("qwen1.5"), tok, 0)


def test_no_bos_is_inserted(templates, tokenizers):
    tok = tokenizers["llama3"]
    assert tok.encode("Hi")[0] == tok.bos_token_id  # the tokenizer would add one if asked
    line = {"conversations": CHAT["conversations"]}  # llama3 has no default system text
    example = encode_example(line, templates.get("llama3"), tok, 4096)
    assert tok.bos_token_id not in example.input_ids
    assert example.input_ids == _expected(tok, CHAT_PIECES["llama3"][1:])[0]


def test_totals_on_a_small_set(templates, tokenizers):
    tok = tokenizers["qwen"]
    lines = [
        {
            "conversations": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "café ✓"},
            ]
        },
        {
            "conversations": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "Yes"},
                {"role": "assistant", "content": "No"},
            ]
        },
        {"conversations": [{"role": "user", "content": "no reply"}]},
    ]
    encoded = encode_set(lines, templates.get("qwen1.5"), tok, 4096)
    targets = ["café ✓<|im_end|>\n", "Yes<|im_end|>\n", "No<|im_end|>\n"]
    assert encoded.total_target_tokens == sum(
        len(tok.encode(t, add_special_tokens=False)) for t in targets
    )
    # Targets decoded without special tokens: "café ✓\n" is 10 bytes, "Yes\nNo\n" is 7.
    assert encoded.total_bytes == 17
    assert encoded.examples[2].target_count == 0


def test_bytes_keep_the_space_before_the_stop_token(templates, tokenizers):
    line = {
        "conversations": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "Hello"},
        ]
    }
    encoded = encode_set([line], templates.get("default"), tokenizers["default"], 4096)
    assert encoded.total_bytes == len(b"Hello ")


@pytest.mark.parametrize(
    ("name", "count"), [("chat_sample.jsonl", 10), ("function_calling_sample.jsonl", 299)]
)
def test_sample_sets_encode(templates, tokenizers, name, count):
    lines = read_jsonl(DATA / name)
    assert len(lines) == count
    encoded = encode_set(lines, templates.get("qwen1.5"), tokenizers["qwen"], 2048)
    assert len(encoded.examples) == count
    assert all(0 < len(e.input_ids) <= 2048 for e in encoded.examples)
    assert all(e.target_count > 0 for e in encoded.examples)
    assert encoded.total_target_tokens == sum(e.target_count for e in encoded.examples)
    # A byte-level BPE of ~600 entries yields between 1 and 5 bytes per target token.
    assert encoded.total_target_tokens < encoded.total_bytes < 5 * encoded.total_target_tokens


# --- reading ----------------------------------------------------------------------------------

GOOD = (
    '{"conversations": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}'
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD + "\n{not json\n", "line 2: not valid JSON"),
        (GOOD + "\n" + GOOD + '\n{"conversations": [{"role": "bot", "content": "b"}]}\n', "line 3"),
        (GOOD + "\n\n" + GOOD + "\n", "line 2"),
        ('{"system": 3, "conversations": []}\n', "line 1: system"),
        ('{"tools": [], "conversations": []}\n', "line 1: tools"),
        ('{"conversations": [{"role": "user"}]}\n', "line 1: conversations.0.content"),
        ("[1, 2]\n", "line 1: must be a JSON object"),
    ],
)
def test_malformed_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        read_jsonl(_write(tmp_path, text))


def test_empty_set(tmp_path):
    with pytest.raises(ValueError, match="validation set is empty"):
        read_jsonl(_write(tmp_path, ""))


def test_each_line_is_decoded_and_validated_once(tmp_path, tokenizers, monkeypatch):
    decoded: list[str] = []
    validated: list[object] = []
    loads, validate = lora_dataset.loads_bounded, ChatLine.model_validate

    def counting_loads(text: str, what: str) -> object:
        decoded.append(what)
        return loads(text, what)

    def counting_validate(cls: type[ChatLine], obj: object, **kwargs: object) -> ChatLine:
        validated.append(obj)
        return validate(obj, **kwargs)

    monkeypatch.setattr(lora_dataset, "loads_bounded", counting_loads)
    monkeypatch.setattr(ChatLine, "model_validate", classmethod(counting_validate))
    path = _write(tmp_path, "\n".join([GOOD] * 3) + "\n")
    encoded = EncodedSetCache().get(path, "qwen1.5", "qwen", tokenizers["qwen"], 4096)
    assert len(encoded.examples) == 3
    # Read, hashed for the cache, rendered and tokenized: each line decoded and validated once.
    assert decoded == ["line 1", "line 2", "line 3"]
    assert len(validated) == 3


def test_lines_split_only_at_newlines(tmp_path):
    # U+2028 is legal raw inside a JSON string; str.splitlines() would break the line there.
    line = GOOD.replace('"content": "b"', '"content": "b\u2028c"')
    lines = read_jsonl(_write(tmp_path, line + "\n" + GOOD))
    assert len(lines) == 2 and lines[0]["conversations"][1]["content"] == "b\u2028c"


# --- tokenizer loading ------------------------------------------------------------------------


def test_load_tokenizer_pad_and_gemma_tokens(tmp_path):
    path = build_tokenizer(tmp_path / "plain", "default")
    plain = load_tokenizer(path, "mistralai/Mistral-7B-v0.1")
    assert plain.pad_token == plain.eos_token == "</s>"
    assert "<start_of_turn>" not in plain.all_special_tokens
    gemma = load_tokenizer(path, "google/Gemma-2B")
    assert {"<start_of_turn>", "<end_of_turn>"} <= set(gemma.all_special_tokens)
    assert len(gemma.encode("<start_of_turn>", add_special_tokens=False)) == 1


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
