"""The GPU's packed scoring path rehearsed on a CPU: FlexAttention and its block masks compiled
by inductor with the module's own options (packing.COMPILE_OPTIONS: static shapes, rows padded
to the module's buckets), through `example_losses` as the module calls it on CUDA. Losses agree
with the eager packed path and the plain implementation to 1e-5 in fp32 on each kind of
attention; in fp16 and bf16 with the reference's regime; and the module's own check
(modules/lora/packed_rows.py) turns a NaN or a wrong mask in a compiled row into one warning and
the padded path's losses.

Compiling costs seconds per kernel on a CPU, so everything is compiled once, in the module
fixture (tiny shapes, one bucket but for one model), and the later tests reuse its kernels."""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass

import pytest
import torch
from torch._dynamo.utils import counters

from modules.lora import packing
from modules.lora.forward import example_losses
from modules.lora.metrics import eval_loss
from modules.lora.precision import pick_precision
from tests.lora.test_lora_loss import plain_loss
from tests.lora.test_lora_packing import BUDGET, EXAMPLES, max_rel, padded, tiny

TOLERANCE = 1e-5  # relative, fp32
# What compiling sees of a model is its attention: one kind of each (tests/lora/test_lora_packing.py
# holds every kind's eager packed path to the plain implementation). No window (llama, as gemma,
# cohere, granite), the config's window on every layer (qwen2, as mistral, phi3), a window per
# layer with soft-capped scores (gemma2), a window per layer without (cohere2). Compiling all
# nine on a CPU took 73 s of the suite's setup.
KINDS = ["llama", "qwen2", "gemma2", "cohere2"]
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Compiled:
    """What the module fixture measured on one model."""

    compiled: list[float]
    eager: list[float]
    plain: list[float]
    key: str


def compiled_losses(model: torch.nn.Module, **options) -> list[float]:
    options.setdefault("token_budget", BUDGET)
    return example_losses(model, EXAMPLES, packing="on", compiled=True, **options)


@pytest.fixture(scope="module")
def runs():
    """Every kind scored compiled (and eagerly, and plainly), in one fresh packing health: the
    only compiles of this file. Yields (kind -> Compiled, the health, graphs compiled)."""
    with pytest.MonkeyPatch.context() as patch:
        health = packing.PackingHealth()
        patch.setattr(packing, "HEALTH", health)
        before = counters["stats"]["unique_graphs"]
        found = {}
        for kind in KINDS:
            model = tiny(kind)
            found[kind] = Compiled(
                compiled=compiled_losses(model),
                eager=example_losses(model, EXAMPLES, token_budget=BUDGET, packing="on"),
                plain=[plain_loss(model, e) for e in EXAMPLES],
                key=packing.health_key(model, model.device, None, compiled=True),
            )
        yield found, health, counters["stats"]["unique_graphs"] - before


@pytest.mark.parametrize("kind", KINDS)
def test_compiled_packed_equals_eager_packed_and_the_plain_reference(runs, kind: str) -> None:
    found, health, _ = runs
    run = found[kind]
    assert max_rel(run.compiled, run.eager) < TOLERANCE
    assert max_rel(run.compiled, run.plain) < TOLERANCE
    assert health.usable(run.key)


def test_every_bucket_was_compiled_and_checked_once(runs) -> None:
    found, health, graphs = runs
    assert not health.failures and graphs > 0  # inductor compiled, and nothing fell back
    assert all(found[kind].key in health.succeeded for kind in KINDS)
    # The tests' rows (up to 120 tokens) all fill the first bucket: one check per kind.
    # A row of one conversation and one of several, checked apart (the first proves nothing
    # about document masks).
    checked = {seen for seen in health.verified if seen[0].endswith("compiled")}
    assert checked == {(found[kind].key, 256, several) for kind in KINDS for several in (0, 1)}
    assert packing.COMPILE_OPTIONS == {"dynamic": False, "fullgraph": True}


@pytest.mark.parametrize("regime", ["fp16", "bf16"])
def test_compiled_in_16_bit_agrees_with_the_reference_s_regime(
    runs, regime: str, monkeypatch
) -> None:
    """The GPU's regimes on a CPU: fp16 weights under fp16 autocast (the network's), bf16
    weights without (the fp16: false option). The reference's regime is the model's own
    forward, one conversation at a time, under the same precision."""
    health = packing.PackingHealth()
    monkeypatch.setattr(packing, "HEALTH", health)
    precision = pick_precision("cuda", fp16=regime == "fp16")
    model = tiny("qwen2").to(precision.weights)
    got = compiled_losses(model, autocast=precision.autocast)
    regime_context = (
        torch.autocast("cpu", dtype=precision.autocast)
        if precision.autocast
        else contextlib.nullcontext()
    )
    with regime_context:
        reference = [plain_loss(model, e) for e in EXAMPLES]
    assert not health.failures and health.verified  # compiled, checked, and kept
    assert max_rel([eval_loss(got)], [eval_loss(reference)]) < 2e-3
    assert max_rel(got, reference) < (5e-3 if regime == "fp16" else 3e-2)
    assert max_rel(got, runs[0]["qwen2"].compiled) > TOLERANCE  # 16-bit really ran


# --- the module's check on compiled rows -------------------------------------------------------


def test_a_nan_from_the_compiled_kernel_falls_back_with_one_warning(
    runs, monkeypatch, caplog
) -> None:
    health = packing.PackingHealth()
    monkeypatch.setattr(packing, "HEALTH", health)
    model = tiny("qwen2")
    expected = padded(model)
    real = packing._compiled_flex()

    def nan_in_the_second_row(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        # Every layer of the first row is right (its bucket is then checked and trusted); the
        # second row gets a NaN where the check of its bucket no longer looks.
        return out if len(calls) <= model.config.num_hidden_layers else out * math.nan

    calls: list[int] = []
    monkeypatch.setattr(packing, "_compiled_flex", lambda: nan_in_the_second_row)
    caplog.set_level(logging.WARNING)
    got = compiled_losses(model)
    assert max_rel(got, expected) < 1e-6  # no NaN, no wrong loss: the padded path's
    assert len(calls) > model.config.num_hidden_layers
    warnings = [r for r in caplog.records if "packed scoring failed" in r.getMessage()]
    assert len(warnings) == 1 and "after earlier packed batches had succeeded" in caplog.text
    assert "disagrees with them unpacked" in warnings[0].getMessage()
    assert "nan packed" in warnings[0].getMessage()


def test_a_wrong_mask_in_a_compiled_row_is_caught_by_the_bucket_check(
    runs, monkeypatch, caplog
) -> None:
    health = packing.PackingHealth()
    monkeypatch.setattr(packing, "HEALTH", health)
    model = tiny("qwen2")
    expected = padded(model)
    real = packing._mask_mod
    # A kernel that lets every conversation of a row see the others (causal across documents).
    monkeypatch.setattr(packing, "_mask_mod", lambda documents, window: real(documents * 0, window))
    caplog.set_level(logging.WARNING)
    assert max_rel(compiled_losses(model), expected) < 1e-6
    warnings = [r for r in caplog.records if "packed scoring failed" in r.getMessage()]
    assert len(warnings) == 1 and "disagrees with them unpacked" in warnings[0].getMessage()
    # The first row holds the long conversation alone, where no mask can leak: it passes, and
    # the first row of several conversations is checked on its own, and fails.
    key = runs[0]["qwen2"].key
    assert health.verified == {(key, 256, False)} and list(health.failures) == [key]
    # The rest of the process scores this kind of model padded, without a second warning.
    assert max_rel(compiled_losses(model), expected) < 1e-6
    assert len([r for r in caplog.records if "packed scoring failed" in r.getMessage()]) == 1
