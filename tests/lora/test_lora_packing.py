"""Packed rows (modules/lora/packing.py): several conversations per forward, each attending only
to itself, must give every conversation the loss it has alone. Checked on a CPU with eager
FlexAttention against the padded path and against the plain reference of test_lora_loss, with
mutations showing that the checks can fail."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from pydantic import ValidationError

from devkit.tiny_models import build_model, make_lora, merged_copy
from modules.lora import LoraConfig, packing
from modules.lora.forward import example_losses
from modules.lora.lm_head import _POST_HEAD_TRANSFORMS
from modules.lora.metrics import eval_loss
from modules.lora.records import EncodedExample
from tests.lora.test_lora_loss import VOCAB, fail_forwards_over, plain_loss, random_examples

TOLERANCE = 1e-6  # relative, fp32
BUDGET = 96  # tokens per packed row: two to six of the examples below
# Longer than the budget: a row of its own.
LONG = EncodedExample(
    [(7 * i + 3) % VOCAB for i in range(120)], [0] * 50 + [1] * 40 + [0] * 10 + [1] * 20
)
EXAMPLES = [*random_examples(16, seed=7), LONG]
# The kinds whose reference masks apply a sliding window, and the window that bites here.
WINDOW = 8
WINDOWED = {"qwen2", "mistral", "phi3", "gemma2", "cohere2"}
KINDS = ["qwen2", "llama", "mistral", "phi3", "gemma2", "cohere", "cohere2", "granite", "gemma"]


@pytest.fixture(autouse=True)
def fresh_health(monkeypatch: pytest.MonkeyPatch) -> packing.PackingHealth:
    """Each test starts as a fresh process would: packing neither failed nor succeeded."""
    health = packing.PackingHealth()
    monkeypatch.setattr(packing, "HEALTH", health)
    return health


def tiny(kind: str, seed: int = 1, **overrides) -> torch.nn.Module:
    if kind in WINDOWED:
        overrides.setdefault("sliding_window", WINDOW)
    return build_model(kind, vocab_size=VOCAB, seed=seed, **overrides)


def longrope_phi3() -> torch.nn.Module:
    """Phi-3.5's RoPE: long factors when the forward's largest position id passes 32."""
    factors = {"short_factor": [1.0] * 8, "long_factor": [1.0 + i for i in range(8)]}
    rope = {"type": "longrope", **factors}
    return tiny("phi3", rope_scaling=rope, original_max_position_embeddings=32)


def packed(
    model: torch.nn.Module, examples: list[EncodedExample] = EXAMPLES, *, ran: bool = True
) -> list[float]:
    losses = example_losses(model, examples, token_budget=BUDGET, packing="on")
    if ran:  # the packed path scored them, rather than a silent fall back to padded batches
        assert packing.HEALTH.succeeded and not packing.HEALTH.failures
    return losses


def padded(model: torch.nn.Module, examples: list[EncodedExample] = EXAMPLES) -> list[float]:
    return example_losses(model, examples, token_budget=10**6, max_batch_size=4, packing="off")


def max_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def test_the_examples_pack_several_per_row_and_the_long_one_alone() -> None:
    # Guards every comparison below: packing that put one conversation per row would prove
    # nothing about document masks.
    lengths = {i: len(e.input_ids) for i, e in enumerate(EXAMPLES)}
    rows = packing.plan_rows(list(lengths), lengths, BUDGET, None)
    assert [len(EXAMPLES) - 1] in rows
    assert max(len(row) for row in rows) >= 3
    assert sum(len(row) > 1 for row in rows) >= 3
    assert max(len(e.input_ids) for e in EXAMPLES[:-1]) > 4 * WINDOW


@pytest.mark.parametrize("kind", KINDS)
def test_packed_equals_unpacked_and_the_plain_reference(kind: str) -> None:
    model = tiny(kind)
    expected = [plain_loss(model, e) for e in EXAMPLES]
    got = packed(model)
    assert max_rel(got, padded(model)) < TOLERANCE
    assert max_rel(got, expected) < TOLERANCE
    if kind in WINDOWED:
        # The window changes these losses, so the packed path really applied it.
        unwindowed = tiny(kind, sliding_window=4096)
        assert max_rel(packed(unwindowed), got) > 1e-3


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_gemma2_attention_softcap_follows_the_models_implementation(implementation: str) -> None:
    # HF's eager attention applies gemma2's attention-logit soft-cap; its sdpa path drops it.
    # Packed scoring must do what the model's own implementation does.
    model = tiny("gemma2", attn_implementation=implementation, attn_logit_softcapping=1.0)
    got = packed(model)
    assert max_rel(got, [plain_loss(model, e) for e in EXAMPLES]) < TOLERANCE
    other = "sdpa" if implementation == "eager" else "eager"
    flipped = tiny("gemma2", attn_implementation=other, attn_logit_softcapping=1.0)
    assert max_rel(packed(flipped), got) > 1e-3  # the cap bites at 1.0


@pytest.mark.parametrize("kind", ["qwen2", "gemma2"])
def test_unmerged_lora_packed_equals_merged_reference(kind: str) -> None:
    adapted = make_lora(tiny(kind), seed=2)
    merged = merged_copy(adapted)
    assert max_rel(packed(adapted), [plain_loss(merged, e) for e in EXAMPLES]) < 1e-5


@pytest.mark.parametrize(
    ("kind", "mutation"),
    [
        ("longrope phi3", "positions run on across the row"),
        ("qwen2", "causal attention across documents"),
        ("gemma2", "causal attention across documents"),
        ("qwen2", "no sliding window"),
        ("gemma2", "no sliding window"),
    ],
)
def test_mutations_change_the_losses(
    kind: str, mutation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ingredient of packing matters: without it the losses move far past the tolerance.
    (RoPE scores depend only on position differences, so positions that run on across the row
    show only where the frequencies depend on the positions themselves, as longrope's do.)"""
    model = longrope_phi3() if kind == "longrope phi3" else tiny(kind)
    right = packed(model)
    assert max_rel(right, padded(model)) < TOLERANCE
    if mutation == "positions run on across the row":
        monkeypatch.setattr(
            packing, "_document_positions", lambda lengths: torch.arange(sum(lengths))
        )
    elif mutation == "causal attention across documents":
        real = packing._mask_mod
        monkeypatch.setattr(
            packing, "_mask_mod", lambda documents, window: real(documents * 0, window)
        )
    else:
        real = packing._mask_mod
        monkeypatch.setattr(packing, "_mask_mod", lambda documents, window: real(documents, None))
    assert max_rel(packed(model), right) > 1e-3


def pad_to_buckets(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Eager rows padded to the compiled path's buckets, as on CUDA; the lengths built."""
    lengths: list[int] = []

    def row_length(tokens: int, token_budget: int, compiled: bool) -> int:
        lengths.append(packing.bucket_length(tokens, token_budget))
        return lengths[-1]

    monkeypatch.setattr(packing, "row_length", row_length)
    return lengths


def test_rows_padded_to_buckets_score_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the compiled path does: rows padded to a bucket (256 tokens here), with a pad document.
    model = tiny("qwen2")
    unpadded = packed(model)
    lengths = pad_to_buckets(monkeypatch)
    assert max_rel(packed(model), unpadded) < TOLERANCE
    assert lengths and all(n == 256 for n in lengths)


def test_bucket_lengths() -> None:
    # Powers of two from 256, capped at the budget rounded up to a block; over it, alone.
    assert [packing.bucket_length(n, 16384) for n in (1, 256, 257, 700, 9000, 16384)] == [
        256,
        256,
        512,
        1024,
        16384,
        16384,
    ]
    assert [packing.bucket_length(n, 12000) for n in (5000, 8193, 12000, 12100)] == [
        8192,
        12032,
        12032,
        16384,
    ]
    assert packing.bucket_length(40, 96) == 256
    assert packing.row_length(300, 16384, compiled=False) == 300
    assert packing.row_length(300, 16384, compiled=True) == 512
    # A kind of model's buckets at the default budget stay under dynamo's recompile limit.
    buckets = {packing.bucket_length(n, 16384) for n in range(1, 16385)}
    assert len(buckets) == 7 and 4 * len(buckets) <= packing.RECOMPILE_LIMIT


def test_build_row_layout() -> None:
    a = EncodedExample([11, 12, 13], [0, 1, 1])
    b = EncodedExample([21, 22, 23, 24], [1, 0, 1, 1])
    row = packing.build_row([a, b], [1, 0], pad_token_id=5, length=12)
    assert row.input_ids.tolist() == [[21, 22, 23, 24, 11, 12, 13, 5, 5, 5, 5, 5]]
    assert row.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 0, 0, 0, 0]]
    assert row.documents.tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2]
    # t predicts a target at t+1 of its own conversation; b's position 0 target is never one.
    predicts = [False, True, True, False, True, True, False] + [False] * 5
    assert row.predicts.tolist() == predicts
    assert row.labels[row.predicts].tolist() == [23, 24, 12, 13]
    assert row.tokens == 7
    assert packing.build_row([a, b], [0, 1], 5).input_ids.shape == (1, 7)
    assert packing.build_row([a] * 90, list(range(90)), 5, 512).input_ids.shape[1] == 512
    with pytest.raises(ValueError, match="does not fit"):
        packing.build_row([a, b], [0, 1], 5, 6)


def test_plan_rows_first_fit_decreasing() -> None:
    lengths = {0: 50, 1: 30, 2: 60, 3: 40, 4: 10, 5: 100, 6: 20, 7: 45}
    rows = packing.plan_rows(list(lengths), lengths, 100, None)
    # Decreasing: 100 alone (at the budget); 60+40, then 50+45 and the 30 with 20 and 10.
    assert rows == [[5], [2, 3], [0, 7], [1, 6, 4]]
    rows = packing.plan_rows(list(lengths), lengths, 100, alone_over=45)
    assert rows == [[5], [2], [0], [7, 3, 4], [1, 6]]
    assert sorted(i for row in rows for i in row) == list(lengths)
    assert packing.plan_rows([], {}, 100, None) == []


def test_longrope_conversations_past_the_original_length_run_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Phi-3.5's longrope picks its factors from the largest position id of the whole forward.
    rope = {
        "type": "longrope",
        "short_factor": [1.0] * 8,
        "long_factor": [1.0 + i for i in range(8)],
    }
    model = tiny("phi3", rope_scaling=rope, original_max_position_embeddings=32)
    assert packing.isolation_length(model) == 32
    examples = EXAMPLES[:-1]
    expected = [plain_loss(model, e) for e in examples]
    both = [packed(model, examples), padded(model, examples)]
    assert all(max_rel(got, expected) < TOLERANCE for got in both)
    # Rows padded to buckets (256 tokens here): the padding must not raise the positions.
    with monkeypatch.context() as patch:
        assert pad_to_buckets(patch) is not None
        assert max_rel(packed(model, examples), expected) < TOLERANCE
    monkeypatch.setattr(packing, "isolation_length", lambda lm: None)
    assert max_rel(packed(model, examples), expected) > 1e-3
    assert max_rel(padded(model, examples), expected) > 1e-3


def test_every_supported_architecture_has_a_window_rule() -> None:
    assert set(packing._WINDOW_RULES) == set(_POST_HEAD_TRANSFORMS)


def test_unsupported_attention_implementation_is_scored_padded() -> None:
    model = tiny("llama")
    assert packing.unsupported_reason(model) is None
    model.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in packing.unsupported_reason(model)
    model.config.model_type = "mystery"
    assert "mystery" in packing.unsupported_reason(model)


# --- out of memory, fallback, config ----------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"),
        RuntimeError("[enforce fail] DefaultCPUAllocator: not enough memory: out of memory"),
    ],
)
def test_out_of_memory_halves_the_packed_budget(monkeypatch, error: Exception, caplog) -> None:
    model = tiny("qwen2")
    examples = EXAMPLES[:-1]  # all under the budgets below
    expected = padded(model, examples)
    lengths = fail_forwards_over(model, 100, error, monkeypatch, dim=1)
    got = example_losses(model, examples, token_budget=400, packing="on")
    assert max_rel(got, expected) < TOLERANCE
    # 400 fails, then the budget halves to at most 200 (<= half that row's tokens), then 100.
    assert lengths[0] > 200 and 100 < lengths[1] <= 200 and lengths[2] <= 100
    assert all(n <= 100 for n in lengths[2:])
    assert "out of memory on a packed row" in caplog.text
    assert "padded batches" not in caplog.text  # an OOM is not a reason to give packing up


def test_out_of_memory_on_a_lone_conversation_is_raised(monkeypatch) -> None:
    model = tiny("qwen2")
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory")
    lengths = fail_forwards_over(model, 0, oom, monkeypatch, dim=1)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        example_losses(model, EXAMPLES[:5], token_budget=400, packing="on")
    assert len(lengths) >= 2 and lengths[-1] == max(len(e.input_ids) for e in EXAMPLES[:5])


def test_failure_before_any_success_falls_back_to_padded(
    monkeypatch, caplog, fresh_health: packing.PackingHealth
) -> None:
    model = tiny("qwen2")
    expected = padded(model)

    def no_kernel(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(packing, "flex_attention", no_kernel)
    caplog.set_level(logging.WARNING)
    assert max_rel(packed(model, ran=False), expected) < TOLERANCE
    assert max_rel(packed(model, ran=False), expected) < TOLERANCE  # no second warning
    warnings = [r for r in caplog.records if "packed scoring failed" in r.getMessage()]
    assert len(warnings) == 1
    assert "no kernel image is available" in warnings[0].getMessage()
    assert model.config._attn_implementation == "sdpa"  # restored after the failed forward
    # Another kind of model is judged on its own: it tries packing (and here fails too).
    other = tiny("llama")
    assert max_rel(packed(other, ran=False), padded(other)) < TOLERANCE
    assert len(fresh_health.failures) == 2 and not fresh_health.succeeded


def test_failure_after_a_success_falls_back_for_the_rest(monkeypatch, caplog, fresh_health) -> None:
    # A recompile that fails later (a new row length on a card) must not fail the submission:
    # the rows already scored stand, the padded path scores the rest, the same losses.
    model = tiny("qwen2")
    expected = padded(model)
    packed(model)
    assert len(fresh_health.succeeded) == 1
    calls = {"n": 0}
    working = packing.flex_attention

    def breaks_on_the_second_row(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > model.config.num_hidden_layers:  # every layer of the first row passes
            raise RuntimeError("illegal memory access")
        return working(*args, **kwargs)

    monkeypatch.setattr(packing, "flex_attention", breaks_on_the_second_row)
    caplog.set_level(logging.WARNING)
    got = example_losses(model, EXAMPLES, token_budget=200, packing="on")
    assert max_rel(got, expected) < TOLERANCE
    assert calls["n"] > model.config.num_hidden_layers  # the first row was packed, then it broke
    assert len(fresh_health.failures) == 1
    assert "after earlier packed batches had succeeded" in caplog.text
    assert "illegal memory access" in caplog.text
    assert model.config._attn_implementation == "sdpa"


def test_a_model_s_own_nan_is_scored_padded_without_giving_packing_up(
    caplog, fresh_health: packing.PackingHealth
) -> None:
    # A token whose embedding is NaN makes its conversation NaN whichever way it runs; packed,
    # the NaN also reaches its row-mates (the kernel multiplies masked scores' zeros by it).
    # The check finds the unpacked losses NaN too: the model's, not packing's fault.
    model = tiny("llama")  # untied: the NaN row is not also a row of the lm_head
    poisoned = next(
        token for token in EXAMPLES[3].input_ids if sum(token in e.input_ids for e in EXAMPLES) == 1
    )
    with torch.no_grad():
        model.get_input_embeddings().weight[poisoned] = math.nan
    caplog.set_level(logging.WARNING)
    got = example_losses(model, EXAMPLES, token_budget=BUDGET, packing="on")
    want = padded(model)
    assert [math.isnan(x) for x in got] == [math.isnan(x) for x in want]
    assert any(math.isnan(x) for x in got) and not all(math.isnan(x) for x in got)
    finite = [i for i, x in enumerate(want) if not math.isnan(x)]
    assert max_rel([got[i] for i in finite], [want[i] for i in finite]) < TOLERANCE
    assert not fresh_health.failures and "packed scoring failed" not in caplog.text
    assert fresh_health.succeeded  # rows before it were packed


def test_packing_mode() -> None:
    assert packing.use_packing("auto", "cuda") and not packing.use_packing("auto", "cpu")
    assert packing.use_packing("on", "cpu") and not packing.use_packing("off", "cuda")
    assert LoraConfig(supported_base_models=["a/b"]).packing == "auto"
    assert LoraConfig(supported_base_models=["a/b"], packing="on").packing == "on"
    with pytest.raises(ValidationError, match="packing"):
        LoraConfig(supported_base_models=["a/b"], packing="sometimes")
    with pytest.raises(ValueError, match="packing must be"):
        example_losses(tiny("qwen2"), EXAMPLES[:2], packing="yes")


def test_nan_for_conversations_without_predicted_targets_when_packed() -> None:
    model = tiny("qwen2")
    only_first = EncodedExample([5, 6, 7, 8], [1, 0, 0, 0])
    examples = [EXAMPLES[0], only_first, EXAMPLES[1], EXAMPLES[0]]
    got = packed(model, examples)
    assert math.isnan(got[1]) and got[3] == got[0]
    assert max_rel([got[0], got[2]], [plain_loss(model, e) for e in (EXAMPLES[0], EXAMPLES[1])]) < (
        TOLERANCE
    )


def test_lm_head_chunks_straddling_conversations_of_a_row(monkeypatch) -> None:
    model = tiny("qwen2")
    whole = packed(model)
    # Five rows per lm_head chunk: chunks then straddle the conversations of a packed row.
    monkeypatch.setattr("modules.lora.lm_head.LOGIT_ELEMENTS_PER_CHUNK", {"cpu": 5 * VOCAB})
    assert max_rel(packed(model), whole) < TOLERANCE


@pytest.mark.parametrize("kind", ["qwen2", "gemma2"])
def test_packed_under_autocast_runs_in_the_autocast_dtype(kind: str) -> None:
    # What CUDA's fp16 regime does, with bf16 standing in on a CPU: q, k and v arrive in the
    # autocast dtype and FlexAttention takes them as they are. The two paths round differently
    # in 16-bit, so they agree loosely here; the GPU bench measures the fp16 agreement.
    model = tiny(kind)
    regime = {"autocast": torch.bfloat16, "token_budget": BUDGET}
    on = example_losses(model, EXAMPLES, packing="on", **regime)
    off = example_losses(model, EXAMPLES, packing="off", **regime)
    assert packing.HEALTH.succeeded and not packing.HEALTH.failures
    assert max_rel(on, off) < 5e-3  # bf16 keeps 8 bits of mantissa: 3.9e-3 relative
    assert max_rel([eval_loss(on)], [eval_loss(off)]) < 1e-3
    assert max_rel(on, packed(model)) > TOLERANCE  # the autocast really changed the arithmetic
