"""An attack: peft's `layer_replication` deep-copies one base layer per replicated layer
in the validator's process (400 entries took 800 layer copies of a tiny base; a few MB of
config hold 10**6). The kit bounds the layers an adapter may replicate; lora refuses past it
before peft builds anything."""

from __future__ import annotations

import pytest

from modules.lora.adapters import AdapterRejected, plan_adapter
from validator.kit import replicated_layers
from validator.kit.adapter_bounds import MAX_REPLICATED_LAYERS

CONFIG = {
    "base_model_name_or_path": "Qwen/tiny",
    "peft_type": "LORA",
    "r": 4,
    "lora_alpha": 8,
    "target_modules": ["q_proj", "v_proj"],
}


def test_a_replication_past_the_bound_is_refused_before_peft_builds_it():
    replication = [[0, 2]] * (MAX_REPLICATED_LAYERS // 2 + 1)
    with pytest.raises(AdapterRejected, match=r"layer_replication builds 514 layers, over the 512"):
        plan_adapter({**CONFIG, "layer_replication": replication}, ["Qwen/tiny"])


def test_a_small_replication_is_planned_with_a_reload_of_the_base():
    plan = plan_adapter({**CONFIG, "layer_replication": [[0, 2], [1, 2]]}, ["Qwen/tiny"])
    assert plan.needs_base_reload
    assert plan.config.layer_replication == [[0, 2], [1, 2]]


@pytest.mark.parametrize(
    ("value", "layers"),
    [(None, 0), ([], 0), ([[0, 4], [2, 4]], 6), ([[3, 1]], 0), ("0-4", None), ([[0, "4"]], None)],
)
def test_the_replicated_layers_are_counted_as_peft_builds_them(value, layers):
    assert replicated_layers(value) == layers
