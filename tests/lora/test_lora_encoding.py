"""Validation-set encoding of the LoRA protocol (docs/lora-scoring.md, "Tokenizer", "Encoding
and masking"): token ids and loss masks from the hand-written pieces of each template, truncation,
reading a set's lines, and loading the tokenizer. The templates' strings: test_lora_templates.py.
"""

from __future__ import annotations

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
)
from modules.lora.templates import load_templates
from tests.helpers.lora_chat import CHAT, CHAT_PIECES

DATA = DATA_DIR


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
