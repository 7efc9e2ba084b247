"""A full model's config is read only in the bounded child (inspect_child.py), never
by transformers in the validator's process. A 147-byte gpt_neo config whose `attention_types`
expands into a list of N layers would take the validator's process to 5.2 GB (N = 5*10^7)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import GPTNeoConfig, GPTNeoForCausalLM

from devkit.tiny_chat_models import build_chat_adapter, build_chat_base
from devkit.tiny_repos import files_of
from modules.llm_judge import inspection
from modules.llm_judge.submission import fetch_submission
from tests.helpers.served_hub import served_hub
from validator.errors import SubmissionRejected

BASE = "Qwen/Qwen3.5-0.8B"
LAYERS = 300_000  # about 30 MB of Python objects to build: over the bound set below


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metadata-child")
    base = build_chat_base(tmp / "base")
    with served_hub(tmp) as hub:
        yield hub, base, tmp


def test_a_config_that_expands_is_built_only_in_the_child(world, monkeypatch):
    hub, base, tmp = world
    calls = []

    def refused(*args, **kwargs):  # transformers reading a config in this process
        calls.append(args)
        raise AssertionError("AutoConfig was called in the validator's process")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", refused)
    monkeypatch.setattr(inspection, "MAX_REREAD_BYTES", 16 * 1024**2)
    neo = {"model_type": "gpt_neo", "num_layers": LAYERS, "attention_types": [[["global"], LAYERS]]}
    hub.add_repo("mallory/neo", {**files_of(base), "config.json": json.dumps(neo).encode()})
    hub.add_repo("bob/full", files_of(base))

    def fetch(repo: str):
        return fetch_submission(repo, "main", tmp / repo, [BASE], 10**9, 10**10, 10**12)

    with pytest.raises(SubmissionRejected, match=r"config\.json: reading it .* over 16777216"):
        fetch("mallory/neo")
    assert fetch("bob/full").parameter_count > 0  # an honest config: counted in the child too
    assert calls == []


def test_an_adapter_of_another_peft_type_is_refused_before_peft_builds_it(world):
    """peft re-reads adapter_config.json in this process and builds the type it names: a
    PROMPT_TUNING config of 200 bytes made it allocate num_virtual_tokens x token_dim (8 GB)."""
    hub, base, tmp = world
    adapter = tmp / "prompt-adapter"
    build_chat_adapter(base, adapter, BASE, seed=0)
    files = files_of(adapter)
    config = {
        "peft_type": "PROMPT_TUNING", "task_type": "CAUSAL_LM", "base_model_name_or_path": BASE,
        "num_virtual_tokens": 10**6, "token_dim": 2000, "num_transformer_submodules": 1,
    }  # fmt: skip
    hub.add_repo("mallory/prompt", {**files, "adapter_config.json": json.dumps(config).encode()})
    hub.add_repo("bob/lora", files)

    def fetch(repo: str):
        return fetch_submission(repo, "main", tmp / repo, [BASE], 10**9, 10**10, 10**12)

    with pytest.raises(SubmissionRejected, match=r"peft_type 'PROMPT_TUNING' is not a LoRA"):
        fetch("mallory/prompt")
    assert fetch("bob/lora").base_model == BASE  # a LoRA (peft_type LORA as peft saves it)


def test_an_adapter_that_replicates_layers_past_the_bound_is_refused(world):
    """peft re-reads adapter_config.json here and deep-copies one base layer per replicated
    layer (an attack on memory): the child counts them, and past the kit's bound it is -999."""
    hub, base, tmp = world
    adapter = tmp / "replicating-adapter"
    build_chat_adapter(base, adapter, BASE, seed=0)
    files = files_of(adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    many = {**config, "layer_replication": [[0, 1]] * 600}
    hub.add_repo("mallory/replicate", {**files, "adapter_config.json": json.dumps(many).encode()})
    few = {**config, "layer_replication": [[0, 1], [0, 1]]}
    hub.add_repo("bob/replicate", {**files, "adapter_config.json": json.dumps(few).encode()})

    def fetch(repo: str):
        return fetch_submission(repo, "main", tmp / repo, [BASE], 10**9, 10**10, 10**12)

    with pytest.raises(SubmissionRejected, match=r"layer_replication builds 600 layers, over"):
        fetch("mallory/replicate")
    assert fetch("bob/replicate").base_model == BASE


def test_a_config_whose_buffers_dwarf_its_parameters_is_refused(world):
    """A gpt_neo model with max_position_embeddings 40000 holds 3*10**5 parameters (its weights
    hold them all) but its causal masks take 1.6 GB a layer when the validator's process builds
    it; 10**5 would take 10 GB a layer. The old code downloaded it for loading."""
    hub, base, tmp = world
    small = GPTNeoConfig(
        vocab_size=64, hidden_size=8, num_layers=2, num_heads=2,
        attention_types=[[["global"], 2]], max_position_embeddings=64,
    )  # fmt: skip
    folder = tmp / "masks"
    GPTNeoForCausalLM(small).save_pretrained(str(folder))
    weights = load_file(str(folder / "model.safetensors"))
    weights["transformer.wpe.weight"] = torch.zeros(40_000, 8)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 40_000}))
    hub.add_repo("mallory/masks", files_of(folder))
    hub.add_repo("bob/honest", files_of(base))

    def fetch(repo: str):
        return fetch_submission(repo, "main", tmp / repo, [BASE], 10**9, 10**10, 10**9)

    with pytest.raises(SubmissionRejected, match=r"buffers hold 3200\d+ elements, over max_p"):
        fetch("mallory/masks")
    assert fetch("bob/honest").parameter_count > 0
