"""What a full model's own JSON files may ask of the validator, checked before transformers reads
them in the validator's process (docs/llm-judge-scoring.md, "The submission").

transformers trusts these files: a 20-byte config can make it build a dict of millions of labels
or a list of millions of layer types; a generation config can ask for thousands of beams or
banned sequences, each costing a Python loop per sampled token. No honest model asks for any of
these, so each is a rejection (-999, as a submission that does not load), never a limit that
changes an honest score. (The tokenizer's files are read only in its bounded child, which checks
the file names they give: tokenizer_child.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from validator.kit import SubmissionRejected

# Far above any released model (a few hundred layers, a few thousand labels), far below what
# costs memory to build (transformers makes a list per layer and a dict entry per label).
MAX_LAYERS = 10_000
MAX_LABELS = 100_000
SIZE_FIELDS = {"num_hidden_layers": MAX_LAYERS, "num_labels": MAX_LABELS}
# Generation configs are a few hundred bytes; beams multiply the sampled sequences; each banned
# or biased sequence of several tokens is checked in Python at every step of every sequence.
MAX_GENERATION_CONFIG_BYTES = 64 * 1024
MAX_BEAMS = 8
MAX_SEQUENCE_RULES = 32  # each one ~0.3 ms per step for the whole batch (CPU, here)
SEQUENCE_RULE_FIELDS = ("bad_words_ids", "sequence_bias")


def check_model_config(config: dict, what: str) -> None:
    """config.json's sizes that transformers expands into lists or dicts, at any depth (the
    text model of a multimodal config sits in `text_config`)."""
    for name, value in _items(config):
        limit = SIZE_FIELDS.get(name)
        if limit is not None and isinstance(value, int) and value > limit:
            raise SubmissionRejected(f"{what}: config.json {name} is {value}, over {limit}")


def check_generation_config(folder: Path, what: str) -> None:
    """generation_config.json's size, beams and sequence rules."""
    path = folder / "generation_config.json"
    if path.is_file() and path.stat().st_size > MAX_GENERATION_CONFIG_BYTES:
        raise SubmissionRejected(
            f"{what}: generation_config.json is {path.stat().st_size} bytes, over "
            f"{MAX_GENERATION_CONFIG_BYTES}"
        )
    # One that does not parse is transformers' to judge, as there (it falls back to the
    # model config's defaults for a file that is not JSON).
    config = _read(path)
    beams = config.get("num_beams")
    if isinstance(beams, int) and beams > MAX_BEAMS:
        raise SubmissionRejected(
            f"{what}: generation_config.json num_beams is {beams}, over {MAX_BEAMS}"
        )
    rules = sum(
        len(value)
        for value in (config.get(name) for name in SEQUENCE_RULE_FIELDS)
        if isinstance(value, list | dict)
    )
    if rules > MAX_SEQUENCE_RULES:
        raise SubmissionRejected(
            f"{what}: generation_config.json bans or biases {rules} token sequences, over "
            f"{MAX_SEQUENCE_RULES}"
        )


def _items(value: Any):
    """Every (key, value) of every object in a JSON value (depth bounded by its reader)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield key, inner
            yield from _items(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _items(inner)


def _read(path: Path) -> dict:
    """The file as transformers reads it (plain json: the size is bounded above, and a depth
    limit of our own would let a deep file pass unchecked); {} for what it cannot read."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}
