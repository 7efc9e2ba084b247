"""Tiny Qwen3.5-architecture chat models for the llm_judge tests, demo and bench, built on the
spot with transformers 5 (the llm_judge stack; run in .venv-llm_judge or its image).

The model has the architecture transformers uses for the supported Qwen3.5 bases (linear and
full attention layers), the tiny BPE tokenizer of devkit.tiny_tokenizer, and a chat template
written here that takes tools, renders tool calls in the XML style of the Qwen3.5 templates
and honours `enable_thinking`. Answers are random text: the judge grades them as text.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3_5TextConfig

from devkit.tiny_tokenizer import build_tokenizer

# A Jinja chat template in the spirit of Qwen's (ChatML markers), small enough to read.
CHAT_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages and messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|im_end|>
{% elif messages and messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content or '' }}
{%- for call in message.tool_calls or [] %}
<tool_call><function={{ call.function.name }}>
{%- set arguments = call.function.arguments %}
{%- if arguments is string %}{{ arguments }}{% else %}
{%- for key, value in arguments.items() %}<parameter={{ key }}>{{ value }}</parameter>{% endfor %}
{%- endif %}</function></tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""

BASE_CONFIG = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=2,
    layer_types=["linear_attention", "full_attention"],
    max_position_embeddings=8192,
    tie_word_embeddings=False,
)


def build_chat_base(dest: Path, seed: int = 0) -> Path:
    """A saved tiny base (safetensors) with its tokenizer and chat template; returns `dest`."""
    build_tokenizer(dest, "qwen")
    tokenizer = AutoTokenizer.from_pretrained(str(dest))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(str(dest))
    config = Qwen3_5TextConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")],
        **BASE_CONFIG,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(dest), safe_serialization=True)
    return dest


def build_chat_multimodal(base_dir: Path, dest: Path, seed: int = 0) -> Path:
    """The base's tokenizer and a model saved as Qwen3.5's own checkpoints are: a composite
    config (`text_config` of the base's shape, a small `vision_config`), the
    ConditionalGeneration class, and an MTP tensor that no transformers class loads."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = json.loads((base_dir / "config.json").read_text())
    text = {k: v for k, v in text.items() if k not in ("architectures", "transformers_version")}
    vision = dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
        patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision))
    model.save_pretrained(str(dest), safe_serialization=True)
    weights = load_file(str(dest / "model.safetensors"))
    weights["mtp.fc.weight"] = torch.zeros(64, 32)
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (dest / name).write_bytes((base_dir / name).read_bytes())
    return dest


def build_chat_adapter(base_dir: Path, dest: Path, base_name: str, seed: int, r: int = 4) -> Path:
    """A LoRA adapter on the base at `base_dir`, whose config names `base_name`."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"])
    peft_model = get_peft_model(model, config)
    for name, parameter in peft_model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: a no-op adapter would prove nothing
            torch.nn.init.normal_(parameter, std=0.5)
    peft_model.save_pretrained(str(dest), safe_serialization=True)
    adapter_config = dest / "adapter_config.json"
    data = json.loads(adapter_config.read_text())
    data["base_model_name_or_path"] = base_name
    adapter_config.write_text(json.dumps(data, indent=2))
    return dest
