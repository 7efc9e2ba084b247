"""The assignment's tokenizer runs in the bounded child too (modules/llm_judge/templating.py,
tokenizer_child.py): the ids and special ids are the in-process tokenizer's, so the move changes
no score; a full model's hostile tokenizer.json (a backtracking regex
normalizer, a regex that panics the engine, a decoder that blows the answers up) is rejected at
a limit or on the line it fails, never run in the validator's process; a template that renders
nothing, a text the tokenizer refuses, or an id past the model's embeddings fails naming the
prompt."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from devkit import DATA_DIR
from devkit.tiny_chat_models import CHAT_TEMPLATE, build_chat_base
from devkit.tiny_tokenizer import build_tokenizer
from modules.llm_judge import _check_ids
from modules.llm_judge.conversation import read_prompts
from modules.llm_judge.generation import EndTokens, render
from modules.llm_judge.loading import read_model
from modules.llm_judge.templating import (
    TemplateLimits,
    TokenizerCannotLoad,
    decode_answers,
    encode_prompts,
)
from validator.errors import OperatorError, SubmissionRejected

LIMITS = TemplateLimits(
    cpu_seconds=5, memory_bytes=1024**3, wall_seconds=240, max_output_bytes=64 * 1024**2
)
HI = [([{"role": "user", "content": "hi"}], None)]
# A normalizer whose regex backtracks: ~0.1 s per block of 28 a's and a c on this machine,
# linear in the blocks; 60 a's in one run make the regex engine panic (a BaseException).
BACKTRACKS = {"type": "Replace", "pattern": {"Regex": "(a|aa)+$"}, "content": "b"}
BLOCK = "a" * 28 + "c"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_chat_base(tmp_path_factory.mktemp("tokenizer") / "base")


def hostile(base: Path, folder: Path, template: str | None = None, **parts) -> Path:
    """A copy of `base` with its tokenizer.json's `parts` (normalizer, decoder) replaced."""
    shutil.copytree(base, folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**spec, **parts}))
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


def sample_items() -> list:
    prompts = read_prompts(DATA_DIR / "chat_sample.jsonl")
    prompts += read_prompts(DATA_DIR / "function_calling_sample.jsonl")
    return [(p.messages, p.tools) for p in prompts]


def test_the_ids_and_special_ids_are_the_in_process_tokenizers_on_the_sample_sets(base, tmp_path):
    # The tiny base (ChatML, pad = eos), and a tokenizer that inserts a BOS with
    # add_special_tokens=True and has no pad token.
    with_bos = build_tokenizer(tmp_path / "bos", "llama3")
    (with_bos / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    items = sample_items()
    for folder in (base, with_bos):
        encoded = encode_prompts(folder, items, submitted=True, limits=LIMITS, work=tmp_path)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        assert [row.tolist() for row in encoded.ids] == [render(tokenizer, *i) for i in items]
        assert (encoded.eos_token_id, encoded.pad_token_id) == (
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
        )
    assert encoded.ids[0][0] == tokenizer.bos_token_id and encoded.pad_token_id is None
    assert list(tmp_path.glob("tokenizer-*")) == []  # nothing left behind


def test_decoding_is_the_in_process_tokenizers_special_tokens_skipped(base, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    rows = [render(tokenizer, *item) for item in sample_items()[:6]] + [[]]
    texts = decode_answers(base, rows, submitted=True, limits=LIMITS, work=tmp_path)
    assert texts == tokenizer.batch_decode(rows, skip_special_tokens=True)
    assert "<|im_start|>" not in texts[0] and texts[-1] == ""
    # Ids over the output limit go to several children, with the texts' limit across them.
    size = sum(len(json.dumps(text, ensure_ascii=False).encode()) + 2 for text in texts)
    assert 4 * sum(map(len, rows)) > size + 1000  # the premise: the ids alone are over it
    small = TemplateLimits(5, 1024**3, 240, max_output_bytes=size + 1000)
    assert decode_answers(base, rows, submitted=True, limits=small) == texts
    smaller = TemplateLimits(5, 1024**3, 240, max_output_bytes=size - 1000)
    with pytest.raises(SubmissionRejected, match="decoded answers exceed .* at generated answer"):
        decode_answers(base, rows, submitted=True, limits=smaller)


def test_a_backtracking_normalizer_is_rejected_at_the_cpu_limit(base, tmp_path):
    template = "{{ '" + BLOCK + "' * 2000 }}"  # 58 kB: minutes of backtracking
    folder = hostile(base, tmp_path / "model", template, normalizer=BACKTRACKS)
    with pytest.raises(SubmissionRejected) as refused:
        encode_prompts(folder, HI, submitted=True, limits=LIMITS, work=tmp_path / "work")
    assert str(refused.value) == (
        "the tokenizer exceeded its CPU time limit (5 s) while tokenizing the prompts"
    )
    # A LoRA's base's tokenizer past the same limit: the same verdict (the assignment fails).
    with pytest.raises(SubmissionRejected, match="CPU time limit"):
        encode_prompts(folder, HI, submitted=False, limits=LIMITS, work=tmp_path / "work")


def test_a_regex_engine_panic_rejects_the_submission_naming_the_prompt(base, tmp_path):
    template = "{{ messages[0].content }}"
    folder = hostile(base, tmp_path / "model", template, normalizer=BACKTRACKS)
    items = [([{"role": "user", "content": text}], None) for text in ("fine", "a" * 60 + "c")]
    # In this process, the panic is a BaseException that no `except Exception` stops.
    with pytest.raises(BaseException, match="retry-limit-in-match") as panic:
        AutoTokenizer.from_pretrained(str(folder))(items[1][0][0]["content"])
    assert not isinstance(panic.value, Exception)
    with pytest.raises(SubmissionRejected) as refused:
        encode_prompts(folder, items, submitted=True, limits=LIMITS, work=tmp_path / "work")
    message = str(refused.value)
    assert message.startswith("the tokenizer fails on validation set prompt 2: PanicException")


def test_a_decoder_that_blows_the_answers_up_is_rejected_at_the_output_limit(base, tmp_path):
    blow_up = {"type": "Replace", "pattern": {"String": "a"}, "content": "x" * 100_000}
    decoder = {"type": "Sequence", "decoders": [json.loads(base.joinpath("tokenizer.json")
               .read_text())["decoder"], blow_up]}  # fmt: skip
    folder = hostile(base, tmp_path / "model", decoder=decoder)
    ids = AutoTokenizer.from_pretrained(str(base))("a a a a a a a a a a a a a a a")["input_ids"]
    limits = TemplateLimits(5, 1024**3, 240, max_output_bytes=1_000_000)
    with pytest.raises(SubmissionRejected, match="the decoded answers exceed 1000000 bytes"):
        decode_answers(folder, [ids], submitted=True, limits=limits, work=tmp_path / "work")


def test_a_template_that_renders_only_whitespace_fails_naming_the_prompt(base, tmp_path):
    folder = hostile(base, tmp_path / "model", "{% if messages[0].content == 'x' %} \n\t {% "
                     "else %}<|im_start|>user\n{{ messages[0].content }}{% endif %}")  # fmt: skip
    items = [([{"role": "user", "content": text}], None) for text in ("hi", "x")]
    with pytest.raises(SubmissionRejected) as refused:
        encode_prompts(folder, items, submitted=True, limits=LIMITS, work=tmp_path / "work")
    assert "renders an empty text for validation set prompt 2" in str(refused.value)


def test_a_text_the_tokenizer_refuses_fails_naming_the_prompt(base, tmp_path):
    items = HI + [([{"role": "user", "content": "lone \ud800 surrogate"}], None)]
    with pytest.raises(SubmissionRejected) as refused:
        encode_prompts(base, items, submitted=False, limits=LIMITS, work=tmp_path / "work")
    assert str(refused.value).startswith(
        "the tokenizer fails on validation set prompt 2: TypeError"
    )


def test_a_tokenizer_that_does_not_load_is_the_networks_minus_999(base, tmp_path):
    folder = hostile(base, tmp_path / "model")
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerCannotLoad, match="the tokenizer does not load"):
        encode_prompts(folder, HI, submitted=True, limits=LIMITS, work=tmp_path / "work")
    # The base's: not the submission's, and not the set's either (a ValueError failed the
    # assignment): the host's (kept, exit 3).
    with pytest.raises(OperatorError, match="the base model's"):
        encode_prompts(folder, HI, submitted=False, limits=LIMITS, work=tmp_path / "work")


def test_an_id_past_the_models_embeddings_fails_naming_the_prompt(base, tmp_path):
    # A token added to tokenizer.json beyond the model's vocabulary: embedding it is an index
    # error on a CPU and a device-side assert (a restart, counted) on a GPU.
    spec = json.loads((base / "tokenizer.json").read_text())
    extra = {"id": 5000, "content": "<|big|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}  # fmt: skip
    folder = hostile(base, tmp_path / "model", "{{ messages[0].content }}",
                     added_tokens=[*spec["added_tokens"], extra])  # fmt: skip
    items = HI + [([{"role": "user", "content": "<|big|> hi"}], None)]
    encoded = encode_prompts(folder, items, submitted=True, limits=LIMITS, work=tmp_path / "work")
    model = read_model(base, torch.float32)
    rows = model.get_input_embeddings().num_embeddings
    assert int(encoded.ids[1].max()) >= rows  # the premise
    ends = EndTokens(encoded.eos_token_id, encoded.pad_token_id)
    with pytest.raises(SubmissionRejected, match=f"prompt 2 token id .* model's {rows} embed"):
        _check_ids(model, encoded.ids, ends)


CALL_LINE = {
    "conversations": [
        {"role": "user", "content": "Q"},
        {"role": "function_call", "content": json.dumps({"name": "f", "arguments": '{"a": 1}'})},
        {"role": "observation", "content": "done"},
        {"role": "user", "content": "and?"},
    ]
}
# Iterates a call's arguments as a mapping, as Qwen3.5's template does: raises on text.
ITERATES = (
    "{%- for m in messages %}{%- if m.tool_calls %}{%- for c in m.tool_calls %}"
    "{%- for k, v in c.function.arguments.items() %}<{{ k }}={{ v }}>{%- endfor %}"
    "{%- endfor %}{%- else %}{{ m.content }}{%- endif %}|{%- endfor %}"
)


def test_call_arguments_render_as_given_unless_the_template_raises_on_them(base, tmp_path):
    # The network hands the template a call's arguments as the line gives them (here JSON
    # text): a template that prints text renders them so, and the network scores that prompt;
    # one that iterates them raises there (no network score), and the fallback, the arguments
    # read as an object, renders instead.
    from modules.llm_judge.conversation import to_prompt

    prompt = to_prompt(CALL_LINE)
    assert prompt.fallback is not None
    item = [(prompt.messages, prompt.tools, prompt.fallback)]
    as_given = encode_prompts(base, item, submitted=True, limits=LIMITS, work=tmp_path / "a")
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    assert as_given.ids[0].tolist() == render(tokenizer, prompt.messages, prompt.tools)
    assert as_given.ids[0].tolist() != render(tokenizer, prompt.fallback, prompt.tools)

    folder = hostile(base, tmp_path / "iterates", ITERATES)
    fell_back = encode_prompts(folder, item, submitted=True, limits=LIMITS, work=tmp_path / "b")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert fell_back.ids[0].tolist() == render(tokenizer, prompt.fallback, prompt.tools)
    assert "<a=1>" in tokenizer.decode(fell_back.ids[0].tolist())
    with pytest.raises(SubmissionRejected, match="prompt 1"):  # no fallback: it fails
        encode_prompts(folder, [item[0][:2]], submitted=True, limits=LIMITS, work=tmp_path / "c")


def test_the_tokenizer_loads_with_left_padding_as_the_network_loads_it(base, tmp_path):
    # The network passes padding_side="left", which overrides the config's: a config naming
    # another side loads there, and must load here (it would not load on its own).
    folder = hostile(base, tmp_path / "model")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "padding_side": "middle"}))
    with pytest.raises((ValueError, ImportError)):  # transformers 5.3 blames protobuf for it
        AutoTokenizer.from_pretrained(str(folder))
    encoded = encode_prompts(folder, HI, submitted=True, limits=LIMITS, work=tmp_path / "work")
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    assert encoded.ids[0].tolist() == render(tokenizer, *HI[0])
