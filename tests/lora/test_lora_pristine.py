"""Pristine copies of a warm base: taken once per base, restored bit for bit, and a base whose
merge could not be undone is dropped rather than scored again."""

from __future__ import annotations

import json

import pytest
import torch
from peft.tuners.lora import LoraLayer, LoraModel
from safetensors.torch import load_file

from devkit.tiny_models import build_model, make_lora
from modules.lora.adapters import applied_adapter, plan_adapter
from tests.lora.test_lora_module import KINDS, inputs, module, world  # noqa: F401 - fixture
from validator.errors import Verdict, classify
from validator.kit.pristine import BaseNotRestored, PristineWeights, keep_on_device

GIB = 2**30
QWEN = KINDS["qwen"][2]


def _touched_bytes(model: torch.nn.Module) -> int:
    """Weights and biases of the projections the tests' adapters adapt (every one)."""
    targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    total = 0
    for name, layer in model.named_modules():
        if name.rsplit(".", 1)[-1] in targets:
            for tensor in (layer.weight, layer.bias):
                if tensor is not None:
                    total += tensor.numel() * tensor.element_size()
    return total


def test_copies_are_taken_once_per_base(world):  # noqa: F811 - pytest fixture
    scorer = module()
    base = scorer.bases.get(QWEN)
    scorer.validate(inputs("alice/qwen-adapter-1"))
    taken = base.pristine.copies_taken
    assert base.pristine.held_bytes() == {"cpu": _touched_bytes(base.model)}
    scorer.validate(inputs("alice/qwen-adapter-2"))
    scorer.validate(inputs("alice/qwen-adapter-3"))
    # Same targets: the later assignments copied nothing out, only back.
    assert base.pristine.copies_taken == taken > 0
    assert scorer.bases.loads == 1


def test_a_failed_merge_drops_the_base_and_is_a_device_fault(world, monkeypatch):  # noqa: F811
    scorer = module()
    expected = scorer.validate(inputs("alice/qwen-adapter-1")).eval_loss

    def half_merge(self, *args, **kwargs):
        # What a GPU fault part way through leaves: one weight merged, the rest not.
        first = next(m for m in self.modules() if isinstance(m, LoraLayer))
        first.merge()
        raise RuntimeError("CUDA out of memory while merging")

    with monkeypatch.context() as patch:
        patch.setattr(LoraModel, "merge_and_unload", half_merge)
        with pytest.raises(BaseNotRestored, match="the adapter could not be merged") as failure:
            scorer.validate(inputs("alice/qwen-adapter-1"))
    # The runner keeps the assignment and restarts to rescore it, rather than failing it.
    assert classify(failure.value) is Verdict.DEVICE
    again = scorer.validate(inputs("alice/qwen-adapter-1")).eval_loss
    assert scorer.bases.loads == 2  # reloaded from disk, not scored on the merged weights
    assert again == pytest.approx(expected, rel=1e-6)


def test_restoring_what_was_never_kept_is_refused() -> None:
    layer = torch.nn.Linear(4, 4)
    with pytest.raises(BaseNotRestored, match="could not be restored"):
        PristineWeights().restore(torch.nn.Sequential(layer), [("0", "weight")])


def test_copies_stay_on_the_gpu_only_with_room_to_spare() -> None:
    # A 7B base with every projection adapted touches 12.2 GiB of its 14.2 GiB of weights.
    seven_b = int(12.2 * GIB)
    assert keep_on_device(seven_b, free=64 * GIB, total=80 * GIB)  # H100 80 GB
    assert not keep_on_device(seven_b, free=8 * GIB, total=24 * GIB)  # 24 GB card
    assert keep_on_device(int(2.6 * GIB), free=20 * GIB, total=24 * GIB)  # 1.5B on 24 GB
    assert not keep_on_device(10 * GIB, free=41 * GIB, total=80 * GIB)  # 31 left < 40%


def test_a_bf16_merge_adds_the_fp32_delta_with_one_rounding(tmp_path) -> None:
    # The reference merges on its CPU, where peft holds the adapter in fp32: each weight becomes
    # bf16(W + scaling * B @ A) with the delta in fp32. Rounding the delta to bf16 first, as a
    # merge with bf16 adapter weights on a GPU would, moves some weights by one step.
    base = build_model("qwen2", seed=4).to(torch.bfloat16)
    make_lora(base, seed=6, r=3).save_pretrained(tmp_path, save_embedding_layers=False)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = "Qwen/tiny"
    factors = load_file(str(tmp_path / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.1.mlp.down_proj.lora_{}.weight"
    delta = (factors[key.format("B")] @ factors[key.format("A")]) * (config["lora_alpha"] / 3)
    weight = base.get_decoder().layers[1].mlp.down_proj.weight.detach().clone()
    once = (weight.float() + delta).to(torch.bfloat16)
    twice = (weight.float() + delta.to(torch.bfloat16).float()).to(torch.bfloat16)
    assert not torch.equal(once, twice)  # the check below can tell the two apart
    plan = plan_adapter(config, ["Qwen/tiny"])
    with applied_adapter(base, tmp_path, plan, merge=True) as merged:
        assert torch.equal(merged.get_decoder().layers[1].mlp.down_proj.weight, once)
    assert torch.equal(base.get_decoder().layers[1].mlp.down_proj.weight, weight)
