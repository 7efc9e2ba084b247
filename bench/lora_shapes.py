"""Model shapes, parameter and FLOP arithmetic, and GPU peaks for the lora benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    Qwen2Config,
)

# --- shapes and FLOP arithmetic ----------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A Qwen2-architecture model shape (q/k/v biases, no o_proj bias, gated MLP)."""

    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def config_values(self) -> dict[str, Any]:
        # sliding_window=None: unused at these lengths (use_sliding_window is off in the real
        # configs too), and transformers warns about it with sdpa otherwise.
        return {
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "tie_word_embeddings": self.tied,
            "max_position_embeddings": 32768,
            "rope_theta": 1_000_000.0,
            "rms_norm_eps": 1e-6,
            "sliding_window": None,
            "use_cache": False,
        }

    def config(self) -> Qwen2Config:
        return Qwen2Config(**self.config_values())


# Public configs of the Qwen2.5 family (config.json of each repo), typed in, not downloaded.
GPU_SHAPES = {
    "0.5b": Shape("Qwen2.5-0.5B", 151936, 896, 4864, 24, 14, 2, tied=True),
    "1.5b": Shape("Qwen2.5-1.5B", 151936, 1536, 8960, 28, 12, 2, tied=True),
    "7b": Shape("Qwen2.5-7B", 152064, 3584, 18944, 28, 28, 4, tied=False),
}
# The CPU model-work bench's shapes (`make bench-model-work`): what a CPU validator loads.
MODEL_WORK_SHAPES = {
    "1.5b": GPU_SHAPES["1.5b"],
    "3b": Shape("Qwen2.5-3B", 151936, 2048, 11008, 36, 16, 2, tied=True),
}
# Small enough for 2 CPU cores, with a real vocabulary so the lm_head costs what it would.
CPU_SHAPE = Shape("bench-qwen2-40M", 32000, 512, 1536, 8, 8, 2, tied=True)

# Dense (no sparsity) bf16/fp16 tensor-core peaks in TFLOP/s, from the vendor data sheets;
# matched in order against torch.cuda.get_device_name().
PEAK_TFLOPS = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM (HBM3)
    ("A100", 312.0),
)


def layer_params(shape: Shape) -> int:
    kv = shape.kv_heads * shape.head_dim
    attention = (shape.hidden + 1) * shape.hidden + 2 * (shape.hidden + 1) * kv
    attention += shape.hidden * shape.hidden  # o_proj, no bias
    mlp = 3 * shape.hidden * shape.intermediate
    return attention + mlp + 2 * shape.hidden  # two RMSNorm weights


def body_params(shape: Shape) -> int:
    """Everything but the embedding and the lm_head: what every token goes through."""
    return shape.layers * layer_params(shape) + shape.hidden


def head_params(shape: Shape) -> int:
    return shape.vocab * shape.hidden


def total_params(shape: Shape) -> int:
    embeddings = shape.vocab * shape.hidden
    return embeddings + body_params(shape) + (0 if shape.tied else head_params(shape))


def forward_flops(shape: Shape, lengths: Sequence[int], head_rows: int) -> float:
    """FLOPs of a forward pass over sequences of `lengths` (no padding) whose lm_head is applied
    to `head_rows` positions: 2 x body parameters x tokens, plus 2 x lm_head parameters x rows,
    plus causal attention (QK^T and AV, 2 x 2 x L^2 x d per layer, halved by the mask)."""
    tokens = sum(lengths)
    attention = sum(2 * shape.layers * length * length * shape.hidden for length in lengths)
    return 2.0 * body_params(shape) * tokens + 2.0 * head_params(shape) * head_rows + attention


def meta_param_count(shape: Shape) -> int:
    """Parameters of the HF model built on the meta device (no memory); tied weights once."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape.config(), torch_dtype=torch.bfloat16)
    return sum(p.numel() for p in model.parameters())


def peak_tflops_for(device_name: str) -> float | None:
    for key, peak in PEAK_TFLOPS:
        if key.lower() in device_name.lower():
            return peak
    return None
