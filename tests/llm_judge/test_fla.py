"""Qwen3.5's linear-attention kernels (loading.linear_attention_kernels): what a CPU can check.

flash-linear-attention's Triton kernels cannot run on a CPU, so their greedy output against the
torch fallback is compared on a GPU by bench/llm_judge_fla_check.py (bench/gpu_session_llm_judge.sh
runs it and fails loudly on a difference). Here: the choice of kernels on a CPU host, on a GPU
host whose fla does not import (this venv has fla-core but no Triton, a real broken install) and
under the operator's override; and the GPU check's own machinery (the swap to the torch path and
the comparison) on a CPU, where both sides are the torch path and must agree, and must not when
the weights change."""

from __future__ import annotations

import logging
import sys
from importlib.metadata import version

import pytest
import torch
import yaml
from transformers import AutoTokenizer
from transformers.utils import import_utils

from bench import llm_judge_fla_check as check
from devkit.tiny_chat_models import build_chat_base
from modules.llm_judge import loading
from modules.llm_judge.generation import EndTokens, Request, Sampling, generate, render
from validator.errors import ConfigError

GREEDY = Sampling(0, 1.0, 0, max_new_tokens=10, token_budget=10**6, max_batch=64)
QUESTIONS = ["Hi", "What is the weather like in Paris today?", "Convert 100 USD to euros."]


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch):
    """Each test decides anew and leaves transformers' check and modeling files as it found
    them (monkeypatch restores what it set first)."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as modeling

    monkeypatch.setattr(
        import_utils,
        "is_flash_linear_attention_available",
        import_utils.is_flash_linear_attention_available,
    )
    for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
        monkeypatch.setattr(modeling, name, getattr(modeling, name))
    monkeypatch.setattr(modeling, "FusedRMSNormGated", modeling.FusedRMSNormGated)
    monkeypatch.setattr(modeling, "is_fast_path_available", modeling.is_fast_path_available)
    monkeypatch.delenv(loading.LINEAR_ATTENTION_ENV, raising=False)
    loading.linear_attention_kernels.cache_clear()
    yield
    loading.linear_attention_kernels.cache_clear()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_chat_base(tmp_path_factory.mktemp("base"))


def read_with_tokenizer(base):
    """The model as the module reads it, and the tiny base's trusted tokenizer."""
    return loading.read_model(base, torch.float32), AutoTokenizer.from_pretrained(str(base))


def prompts_of(tokenizer) -> list[list[int]]:
    return [render(tokenizer, [{"role": "user", "content": q}], None) for q in QUESTIONS]


def test_the_image_pins_fla_core_and_this_stack_has_it():
    spec = yaml.safe_load(open("modules/llm_judge/environment.yml"))
    pins = [p for d in spec["dependencies"] if isinstance(d, dict) for p in d["pip"]]
    pin = next(p for p in pins if p.startswith("fla-core=="))
    assert version("fla-core") == pin.split("==")[1]


def test_a_cpu_host_runs_the_torch_fallback_with_fla_installed(base):
    assert not torch.cuda.is_available()  # this suite's premise: the CPU side of the check
    assert loading.linear_attention_kernels() == "torch"
    model = loading.read_model(base, torch.float32)
    assert check.kernels_of(model) == {"torch"}


def test_a_gpu_host_whose_fla_does_not_import_falls_back_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ImportError):  # the premise: fla-core without Triton does not import
        import fla.ops.gated_delta_rule  # noqa: F401
    with caplog.at_level(logging.WARNING, logger=loading.__name__):
        assert loading.linear_attention_kernels() == "torch"
    assert "flash-linear-attention does not import" in caplog.text
    # transformers would otherwise import fla when it builds a Qwen3.5 layer, and fail: every
    # Qwen3.5 submission would score -999 on that host.
    assert import_utils.is_flash_linear_attention_available() is False
    modeling = sys.modules["transformers.models.qwen3_5.modeling_qwen3_5"]
    assert modeling.chunk_gated_delta_rule is None and modeling.FusedRMSNormGated is None


def test_the_override_forces_the_fallback_and_a_bad_value_stops_at_start_up(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv(loading.LINEAR_ATTENTION_ENV, "torch")
    assert loading.linear_attention_kernels() == "torch"
    assert import_utils.is_flash_linear_attention_available() is False
    loading.linear_attention_kernels.cache_clear()
    monkeypatch.setenv(loading.LINEAR_ATTENTION_ENV, "triton")
    with pytest.raises(ConfigError, match="LLM_JUDGE_LINEAR_ATTENTION='triton'"):  # exit 2:
        loading.device_and_dtype()


def test_the_swap_to_the_torch_path_keeps_the_greedy_answers(base):
    model, tokenizer = read_with_tokenizer(base)
    requests = [Request(i, 0, ids) for i, ids in enumerate(prompts_of(tokenizer))]
    ends = EndTokens.of(tokenizer)
    before = generate(model, requests, GREEDY, 1, ends)
    ids_before = check.greedy(model, prompts_of(tokenizer), 10, tokenizer.eos_token_id)
    assert check.use_torch_path(model) == 1  # the tiny base's one linear-attention layer
    assert check.kernels_of(model) == {"torch"}
    assert generate(model, requests, GREEDY, 1, ends) == before
    after = check.greedy(model, prompts_of(tokenizer), 10, tokenizer.eos_token_id)
    assert torch.equal(after, ids_before)


def test_the_comparison_passes_equal_paths_and_fails_changed_weights(base, monkeypatch):
    model, tokenizer = read_with_tokenizer(base)
    prompts = prompts_of(tokenizer)
    problems, summary = check.compare(model, prompts, 12, tokenizer.eos_token_id)
    assert problems == [] and f"{len(prompts)} of {len(prompts)} answers identical" in summary

    swap = check.use_torch_path

    def swap_and_break(model) -> int:  # a "torch path" that computes something else
        changed = swap(model)
        for module in model.modules():
            if hasattr(module, "chunk_gated_delta_rule"):
                module.norm.weight.data.mul_(-3.0)
        return changed

    monkeypatch.setattr(check, "use_torch_path", swap_and_break)
    model = loading.read_model(base, torch.float32)
    problems, _ = check.compare(model, prompts, 12, tokenizer.eos_token_id)
    assert problems and "teacher-forced logits differ" in problems[0]


def test_the_gpu_check_refuses_to_pass_without_cuda(capsys):
    assert check.main(["--device", "cuda"]) == 2
    assert check.main(["--device", "cpu"]) == 2
    assert "nothing was compared" in capsys.readouterr().err
