"""Small random-weight causal LMs of real architectures, for tests, benchmarks and demos that
need no downloads."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    Cohere2Config,
    CohereConfig,
    Gemma2Config,
    GemmaConfig,
    GraniteConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
)

# Shared by every kind: a few layers, hidden 64, grouped-query attention. A wider init than the
# default 0.02 makes the logits far from uniform, so losses differ between models and adapters.
_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "initializer_range": 0.1,
}

_KINDS: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    "qwen2": (Qwen2Config, {"tie_word_embeddings": True}),
    "llama": (LlamaConfig, {}),
    "mistral": (MistralConfig, {"sliding_window": None}),
    "phi3": (Phi3Config, {"pad_token_id": 0, "sliding_window": None}),
    # A small softcap so the tanh visibly changes the loss, and a short sliding window so
    # batched sequences cross it.
    "gemma2": (
        Gemma2Config,
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 16,
            "final_logit_softcapping": 2.0,
            "attn_logit_softcapping": 50.0,
            "sliding_window": 8,
        },
    ),
    "cohere": (CohereConfig, {"logit_scale": 0.5}),
    # Alternating sliding and global layers, as gemma2's, and a window short enough to bite.
    "cohere2": (
        Cohere2Config,
        {"logit_scale": 0.5, "sliding_window": 8, "sliding_window_pattern": 2},
    ),
    "gemma": (GemmaConfig, {"head_dim": 16}),
    "granite": (GraniteConfig, {"logits_scaling": 2.0}),
}

# Attention implementations as the reference's defaults would pick for these tiny models.
_ATTENTION = {"gemma2": "eager"}

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_model(
    kind: str = "qwen2", vocab_size: int = 640, seed: int = 0, **overrides: Any
) -> PreTrainedModel:
    """A tiny causal LM of `kind` in fp32 eval mode; `overrides` go to the config.

    `attn_implementation` among the overrides selects the attention kernel instead.
    """
    if kind not in _KINDS:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(sorted(_KINDS))}")
    config_class, defaults = _KINDS[kind]
    attention = overrides.pop("attn_implementation", _ATTENTION.get(kind, "sdpa"))
    config = config_class(**{**_COMMON, **defaults, "vocab_size": vocab_size, **overrides})
    # Forked so building a model leaves the caller's global RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=attention, torch_dtype=torch.float32
        )
    return model.eval()


def make_lora(model: PreTrainedModel, seed: int, r: int = 4) -> PeftModel:
    """A LoRA-wrapped deep copy of `model` whose adapter weights are random and non-zero.

    peft initialises lora_B to zero (the adapter starts as a no-op); that would hide any bug in
    how the adapter is applied, so both A and B are redrawn from a seeded generator.
    """
    # task_type as real submissions set it; without it peft also saves an auto_mapping entry.
    config = LoraConfig(
        r=r,
        lora_alpha=2 * r,
        lora_dropout=0.0,
        target_modules=LORA_TARGETS,
        task_type="CAUSAL_LM",
    )
    wrapped = get_peft_model(copy.deepcopy(model), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                noise = torch.randn(parameter.shape, generator=generator) * 0.1
                parameter.copy_(noise)
    return wrapped.eval()


def merged_copy(peft_model: PeftModel) -> PreTrainedModel:
    """The adapter merged into a copy of the base, as the reference scores it."""
    return copy.deepcopy(peft_model).merge_and_unload().eval()


def save_base(model: PreTrainedModel, dest: str | Path) -> Path:
    """Saves `model` as safetensors under `dest` (created if missing)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest, safe_serialization=True)
    return dest
