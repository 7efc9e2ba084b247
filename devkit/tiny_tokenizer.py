"""A small byte-level BPE tokenizer for the lora tests, trained on the sample validation sets.

It behaves like the real base-model tokenizers where the protocol cares: the template markers are
special tokens (one id each, dropped by `skip_special_tokens`), and the llama3 and gemma kinds
insert a BOS with `add_special_tokens=True`, so tests can prove the encoder never asks for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from devkit import DATA_DIR

SAMPLE_FILES = ("chat_sample.jsonl", "function_calling_sample.jsonl")
VOCAB_SIZE = 600


@dataclass(frozen=True)
class Kind:
    eos: str
    bos: str | None
    extra: tuple[str, ...]  # further special tokens, beyond bos and eos


KINDS = {
    "qwen": Kind(eos="<|endoftext|>", bos=None, extra=("<|im_start|>", "<|im_end|>")),
    "llama3": Kind(
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
        extra=("<|start_header_id|>", "<|end_header_id|>"),
    ),
    "gemma": Kind(eos="<eos>", bos="<bos>", extra=("<start_of_turn>", "<end_of_turn>")),
    "default": Kind(eos="</s>", bos=None, extra=()),
}


def _corpus() -> list[str]:
    """Every text field of both sample files, in file order (training must be deterministic)."""
    texts = []
    for name in SAMPLE_FILES:
        for raw in (DATA_DIR / name).read_text(encoding="utf-8").splitlines():
            line = json.loads(raw)
            texts += [line.get("system") or "", line.get("tools") or ""]
            texts += [turn["content"] for turn in line["conversations"]]
    return [text for text in texts if text]


@lru_cache(maxsize=1)
def _trained_core() -> str:
    """The trained BPE (no special tokens), serialized; shared by every kind."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    return tokenizer.to_str()


def _wrap(kind: Kind) -> PreTrainedTokenizerFast:
    core = Tokenizer.from_str(_trained_core())
    specials = [t for t in (kind.bos, kind.eos, *kind.extra) if t is not None]
    core.add_special_tokens(specials)
    if kind.bos is not None:
        bos_id = core.token_to_id(kind.bos)
        core.post_processor = processors.TemplateProcessing(
            single=f"{kind.bos} $A", pair=f"{kind.bos} $A $B", special_tokens=[(kind.bos, bos_id)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=kind.eos,
        bos_token=kind.bos,
        additional_special_tokens=list(kind.extra),
        clean_up_tokenization_spaces=False,
    )


def build_tokenizer(dest: Path, kind: str = "qwen") -> Path:
    """Save the tiny tokenizer of `kind` (qwen, llama3, gemma, default) to `dest`; return it.

    An unknown kind gets the default one (`</s>` as eos), like the templates without markers.
    """
    tokenizer = _wrap(KINDS.get(kind, KINDS["default"]))
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(dest))
    return dest
