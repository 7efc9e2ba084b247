"""Tiny base-model and adapter repos, built locally, in the file layout HuggingFace serves."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from devkit.tiny_models import build_model, make_lora, save_base
from devkit.tiny_tokenizer import build_tokenizer

# (model architecture, tokenizer kind, a supported base-model name, a chat-template key)
KINDS = {
    "qwen": ("qwen2", "qwen", "Qwen/Qwen2.5-0.5B", "qwen1.5"),
    "llama": ("llama", "llama3", "meta-llama/Meta-Llama-3-8B", "llama3"),
    "gemma": ("gemma2", "gemma", "google/gemma-2-2b", "gemma"),
}


def files_of(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def build_base(tmp: Path, kind: str = "qwen", seed: int = 0) -> Path:
    """A base-model folder: config, safetensors weights and tokenizer files."""
    architecture, tokenizer_kind, _, _ = KINDS[kind]
    tokenizer_dir = build_tokenizer(tmp / f"tokenizer-{kind}", kind=tokenizer_kind)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = -(-len(tokenizer) // 64) * 64
    model = build_model(architecture, vocab_size=vocab, seed=seed)
    folder = tmp / f"base-{kind}-{seed}"
    save_base(model, folder)
    for path in Path(tokenizer_dir).iterdir():
        shutil.copy2(path, folder / path.name)
    return folder


def build_adapter(base_dir: Path, dest: Path, seed: int, base_name: str, r: int = 4) -> Path:
    """An adapter folder (adapter_config.json, adapter_model.safetensors) for `base_dir`."""
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    adapted = make_lora(copy.deepcopy(model), seed=seed, r=r)
    for config in adapted.peft_config.values():
        config.base_model_name_or_path = base_name
    # False: otherwise peft looks the base model up on the real hub to compare vocabularies.
    adapted.save_pretrained(dest, save_embedding_layers=False)
    return dest
