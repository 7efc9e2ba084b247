"""The hand-written chat example of the LoRA protocol's tests: one conversation and, per chat
template, the pieces it renders to (text, and whether the loss counts it), written out by hand
from `modules/lora/chat_templates.json`, never produced by the code under test."""

from __future__ import annotations

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
