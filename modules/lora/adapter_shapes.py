"""The adapter's ranks and LoRA tensor shapes against its base, before peft allocates anything
(validator/kit/adapter_bounds.py): a refusal is the submission's, as AdapterRejected."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from modules.lora.adapters import AdapterPlan, AdapterRejected
from validator.kit import check_lora_against_base, ranks_of


def check_against_base(plan: AdapterPlan, base: nn.Module, weights: Path) -> None:
    config = {"r": plan.config.r, "rank_pattern": plan.config.rank_pattern}
    check_lora_against_base(ranks_of(config), base, plan.base_model, weights, AdapterRejected)
