"""Adapters sized to exhaust the host: ranks and tensor shapes are checked against the base
before peft allocates a layer, and what the submission wrote reaches a reason bounded."""

from __future__ import annotations

import json
import logging
import resource

import pytest
import torch
from safetensors.torch import save_file

from modules.lora.adapters import AdapterRejected
from tests.lora.test_lora_hostile import World, honest_tensors, inputs, module, world  # noqa: F401
from validator.errors import describe
from validator.observe.logs import RedactSecrets
from validator.text import MAX_LOG_MESSAGE, MAX_REASON

MIB = 1024 * 1024


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"r": 10**6}, r"r = 1000000: not a LoRA rank .* can use \(1 to 64\)"),
        ({"rank_pattern": {"q_proj": 10**6}}, r"rank_pattern\['q_proj'\] = 1000000"),
    ],
    ids=["r", "rank_pattern"],
)
def test_a_huge_rank_is_refused_before_anything_is_allocated(world, changes, reason):  # noqa: F811
    repo = f"mallory/huge-{next(iter(changes))}"
    world.add_hostile(repo, "qwen", honest_tensors(world, "qwen"), **changes)
    before = peak_rss_bytes()
    with pytest.raises(AdapterRejected, match=reason):
        module().validate(inputs(repo, "qwen"))
    # peft would have allocated 64 x 10**6 floats per projection: gigabytes.
    assert peak_rss_bytes() - before < 200 * MIB


def test_a_lora_tensor_that_does_not_fit_its_projection_is_refused(world):  # noqa: F811
    tensors = honest_tensors(world, "qwen")
    key = next(k for k in sorted(tensors) if k.endswith("q_proj.lora_B.weight"))
    tensors[key] = torch.zeros(tensors[key].shape[0] + 5, tensors[key].shape[1])
    world.add_hostile("mallory/wide-b", "qwen", tensors)
    with pytest.raises(AdapterRejected, match=r"adapter tensor '.*q_proj.lora_B.weight' has shape"):
        module().validate(inputs("mallory/wide-b", "qwen"))


def test_a_huge_value_in_the_config_reaches_reasons_and_logs_bounded(world, tmp_path):  # noqa: F811
    honest = world.honest["qwen"]
    config = json.loads((honest / "adapter_config.json").read_text())
    # Just under the 1 MiB cap on adapter_config.json, with line breaks that would forge lines.
    value = ("x" * 1000 + "\n2026-11-23 INFO validator: forged\r") * 900
    config["not_a_peft_key"] = value
    folder = tmp_path / "huge-value"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps(config))
    save_file(honest_tensors(world, "qwen"), folder / "adapter_model.safetensors")
    world.hub.add_repo("mallory/huge-value", {p.name: p for p in folder.iterdir()})
    with pytest.raises(AdapterRejected) as caught:
        module().validate(inputs("mallory/huge-value", "qwen"))
    reason = describe(caught.value)
    assert "not_a_peft_key" in reason
    assert len(reason) < MAX_REASON + 100
    assert "\n" not in reason and "\r" not in reason
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "failed: %s", (value,), None)
    RedactSecrets([]).filter(record)
    line = record.getMessage()
    assert len(line) < MAX_LOG_MESSAGE + 100
    assert "\n" not in line and "\r" not in line and "\\n2026-11-23 INFO" in line
