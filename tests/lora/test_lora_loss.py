"""Validation loss against a deliberately plain reference, batching independence, metrics."""

from __future__ import annotations

import math
import random

import pytest
import torch

from devkit.tiny_models import build_model, make_lora, merged_copy
from modules.lora.forward import UnsupportedArchitecture, example_losses
from modules.lora.metrics import (
    HIGH_LOSS,
    check_token_byte_ratio,
    eval_loss,
    score_metrics,
    token_byte_ratio,
)
from modules.lora.records import EncodedExample

VOCAB = 640
REL = 1e-5


def plain_loss(model: torch.nn.Module, example: EncodedExample) -> float:
    """One example alone, full logits, float64 log-softmax: labels semantics written by hand."""
    ids = torch.tensor([example.input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    logprobs = torch.log_softmax(logits, dim=-1)
    # The logit at position t predicts token t+1; a target at position 0 is never predicted.
    terms = [
        -logprobs[t, example.input_ids[t + 1]].item()
        for t in range(len(example.input_ids) - 1)
        if example.target_mask[t + 1] == 1
    ]
    return sum(terms) / len(terms) if terms else math.nan


def random_examples(count: int, seed: int) -> list[EncodedExample]:
    """Varied lengths; each mask has a prompt part and one or more scored spans."""
    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        length = rng.randint(3, 48)
        ids = [rng.randrange(VOCAB) for _ in range(length)]
        mask = [1 if rng.random() < 0.4 else 0 for _ in range(length)]
        mask[rng.randrange(1, length)] = 1  # at least one predicted target
        examples.append(EncodedExample(ids, mask))
    return examples


EXAMPLES = random_examples(16, seed=7)
LONGEST = max(len(e.input_ids) for e in EXAMPLES)
# (token_budget, max_batch_size) giving 1, 3 and 16 examples per batch.
BATCHINGS = {
    "one": (10**6, 1),
    "three": (10**6, 3),
    "sixteen": (16 * LONGEST, 64),
}


@pytest.fixture(scope="module", params=["qwen2", "llama", "gemma2"])
def models(request: pytest.FixtureRequest) -> dict:
    base = build_model(request.param, vocab_size=VOCAB, seed=1)
    peft_model = make_lora(base, seed=2)
    merged = merged_copy(peft_model)
    expected = [plain_loss(merged, e) for e in EXAMPLES]
    return {"base": base, "peft": peft_model, "merged": merged, "expected": expected}


@pytest.mark.parametrize("batching", list(BATCHINGS))
@pytest.mark.parametrize("which", ["peft", "merged"])
def test_matches_plain_reference(models: dict, which: str, batching: str) -> None:
    budget, max_batch = BATCHINGS[batching]
    got = example_losses(
        models[which], EXAMPLES, token_budget=budget, max_batch_size=max_batch, pad_token_id=3
    )
    assert got == pytest.approx(models["expected"], rel=REL)


def test_adapter_changes_the_losses(models: dict) -> None:
    # Guards the comparison above: a no-op adapter would make it vacuous.
    base_losses = example_losses(models["base"], EXAMPLES[:3])
    with models["peft"].disable_adapter():
        disabled = example_losses(models["peft"], EXAMPLES[:3])
    assert disabled == pytest.approx(base_losses, rel=REL)
    assert min(abs(a - b) for a, b in zip(base_losses, models["expected"][:3], strict=True)) > 1e-3


def test_gemma2_softcap_is_applied() -> None:
    model = build_model("gemma2", vocab_size=VOCAB, seed=3)
    expected = [plain_loss(model, e) for e in EXAMPLES[:4]]
    capped = example_losses(model, EXAMPLES[:4])
    model.config.final_logit_softcapping = None
    uncapped = example_losses(model, EXAMPLES[:4])
    assert capped == pytest.approx(expected, rel=REL)
    # Without the cap the numbers move well beyond the tolerance, so the cap is being tested.
    assert min(abs(a - b) for a, b in zip(capped, uncapped, strict=True)) > 1e-3


@pytest.mark.parametrize("kind", ["cohere", "granite", "mistral", "phi3"])
def test_other_supported_architectures(kind: str) -> None:
    # cohere and granite scale the logits after the lm_head; mistral and phi3 do not.
    model = build_model(kind, vocab_size=VOCAB, seed=4)
    got = example_losses(model, EXAMPLES[:6], max_batch_size=3)
    assert got == pytest.approx([plain_loss(model, e) for e in EXAMPLES[:6]], rel=REL)


def test_unsupported_architecture_is_refused() -> None:
    model = build_model("qwen2", vocab_size=VOCAB)
    model.config.model_type = "mystery"
    with pytest.raises(UnsupportedArchitecture, match="mystery"):
        example_losses(model, EXAMPLES[:1])


def test_example_without_predicted_target_is_nan() -> None:
    model = build_model("qwen2", vocab_size=VOCAB, seed=5)
    only_first = EncodedExample([5, 6, 7, 8], [1, 0, 0, 0])
    nothing = EncodedExample([9], [1])
    examples = [EXAMPLES[0], only_first, EXAMPLES[1], nothing]
    got = example_losses(model, examples, max_batch_size=4)
    assert math.isnan(got[1]) and math.isnan(got[3])
    assert [got[0], got[2]] == pytest.approx(
        [plain_loss(model, EXAMPLES[0]), plain_loss(model, EXAMPLES[1])], rel=REL
    )
    assert math.isnan(eval_loss(got))
    # What the reference sees at batch size 1: HF's own loss with no unmasked label is NaN.
    with torch.no_grad():
        hf = model(
            input_ids=torch.tensor([only_first.input_ids]),
            labels=torch.tensor([[5, -100, -100, -100]]),
        ).loss
    assert math.isnan(hf.item())


def test_eval_loss_independent_of_token_budget() -> None:
    model = build_model("llama", vocab_size=VOCAB, seed=6)
    results = [
        eval_loss(example_losses(model, EXAMPLES, token_budget=budget))
        for budget in (1, 60, 200, 10**6)
    ]
    assert results == pytest.approx([results[0]] * len(results), rel=1e-6)


def test_lm_head_chunks_do_not_change_the_losses(monkeypatch) -> None:
    model = build_model("qwen2", vocab_size=VOCAB, seed=9)
    whole = example_losses(model, EXAMPLES, max_batch_size=8)
    # Five rows per lm_head chunk: chunks then straddle example boundaries.
    monkeypatch.setattr("modules.lora.lm_head.LOGIT_ELEMENTS_PER_CHUNK", {"cpu": 5 * VOCAB})
    chunked = example_losses(model, EXAMPLES, max_batch_size=8)
    assert chunked == pytest.approx(whole, rel=1e-6)


def test_eval_loss_mean_and_nan() -> None:
    assert eval_loss([1.0, 2.0, 4.5]) == 2.5
    assert math.isnan(eval_loss([]))
    assert math.isnan(eval_loss([1.0, math.nan]))


def fail_forwards_over(model, limit: int, error: Exception, monkeypatch, dim: int = 0) -> list[int]:
    """Makes only the decoder's forward fail on inputs whose size along `dim` (0: conversations
    in a batch, 1: tokens in a row) is over `limit`; records every forward's size."""
    decoder = model.get_decoder()
    original = decoder.forward
    sizes: list[int] = []

    def forward(*args, **kwargs):
        size = kwargs["input_ids"].shape[dim]
        sizes.append(size)
        if size > limit:
            raise error
        return original(*args, **kwargs)

    monkeypatch.setattr(decoder, "forward", forward)
    return sizes


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"),
        RuntimeError("[enforce fail] DefaultCPUAllocator: not enough memory: out of memory"),
    ],
)
def test_out_of_memory_halves_the_batch(monkeypatch, error: Exception) -> None:
    model = build_model("qwen2", vocab_size=VOCAB, seed=8)
    expected = example_losses(model, EXAMPLES, token_budget=10**6)
    sizes = fail_forwards_over(model, 3, error, monkeypatch)
    got = example_losses(model, EXAMPLES, token_budget=10**6)
    assert got == pytest.approx(expected, rel=1e-6)
    assert sizes[:4] == [16, 8, 4, 2]


def test_repeated_examples_run_once_and_count_in_the_mean(monkeypatch) -> None:
    model = build_model("qwen2", vocab_size=VOCAB, seed=8)
    a, b, c = EXAMPLES[:3]
    same_ids_other_mask = EncodedExample(a.input_ids, [0] + [1] * (len(a.input_ids) - 1))
    examples = [a, b, a, c, same_ids_other_mask, b, a]
    # What the reference does: every line scored on its own, the mean over all lines.
    expected = [plain_loss(model, e) for e in examples]
    sizes = fail_forwards_over(model, 10**6, RuntimeError("unused"), monkeypatch)
    got = example_losses(model, examples, max_batch_size=1)
    assert got == pytest.approx(expected, rel=REL)
    assert sum(sizes) == 4  # a, b, c and the other-mask twin of a
    assert eval_loss(got) == pytest.approx(sum(expected) / 7, rel=REL)
    # Guards the check above: dropping the repeats would move the mean.
    assert abs(eval_loss(got) - eval_loss([got[0], got[1], got[3], got[4]])) > 1e-4


def test_out_of_memory_on_one_example_is_raised(monkeypatch) -> None:
    model = build_model("qwen2", vocab_size=VOCAB, seed=8)
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory")
    sizes = fail_forwards_over(model, 0, oom, monkeypatch)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        example_losses(model, EXAMPLES[:5])
    assert sizes == [5, 2, 1]


def test_other_errors_are_not_retried(monkeypatch) -> None:
    model = build_model("qwen2", vocab_size=VOCAB, seed=8)
    sizes = fail_forwards_over(model, 0, RuntimeError("shape mismatch"), monkeypatch)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        example_losses(model, EXAMPLES[:5])
    assert sizes == [5]


def test_score_metrics_by_hand() -> None:
    # eval_loss 2.0, T 100, B 250: nats 200; bits 200 / ln 2 = 288.5390081777927;
    # bpc 288.539... / 250 = 1.1541560327111708; bppl 2 ** bpc = e ** (2 * 100 / 250) = e ** 0.8
    # = 2.225540928492468.
    metrics = score_metrics(2.0, 100, 250)
    assert metrics["nll_token_nats_total"] == pytest.approx(200.0, rel=1e-12)
    assert metrics["nll_token_bits_total"] == pytest.approx(288.5390081777927, rel=1e-12)
    assert metrics["bpc"] == pytest.approx(1.1541560327111708, rel=1e-12)
    assert metrics["loss"] == metrics["bpc"]
    assert metrics["bppl"] == pytest.approx(2.225540928492468, rel=1e-12)
    assert metrics["eval_loss"] == 2.0
    # eval_loss ln 2 = 0.6931471805599453, T 100, B 200: bits 100, bpc 0.5, bppl sqrt 2.
    half = score_metrics(0.6931471805599453, 100, 200)
    assert half["nll_token_bits_total"] == pytest.approx(100.0, rel=1e-12)
    assert half["bpc"] == pytest.approx(0.5, rel=1e-12)
    assert half["bppl"] == pytest.approx(1.4142135623730951, rel=1e-12)


@pytest.mark.parametrize(
    ("loss", "tokens", "nbytes"),
    [(2.0, 100, 0), (math.nan, 100, 250), (math.inf, 100, 250), (-math.inf, 10, 5)],
)
def test_score_metrics_high_loss(loss: float, tokens: int, nbytes: int) -> None:
    metrics = score_metrics(loss, tokens, nbytes)
    assert metrics["loss"] == HIGH_LOSS == metrics["bpc"] == 999.0
    # 2 ** 999 = 5.357543035931337e300, as the reference's oversized-model branch reports.
    assert metrics["bppl"] == pytest.approx(5.357543035931337e300, rel=1e-12)
    assert math.isnan(metrics["nll_token_nats_total"])
    assert math.isnan(metrics["nll_token_bits_total"])


def test_bppl_overflow_is_inf() -> None:
    # eval_loss 10, T 1000, B 5: bpc = 10 * 1000 / 5 / ln 2 = 2885.39; 2 ** 2885 overflows.
    metrics = score_metrics(10.0, 1000, 5)
    assert metrics["bpc"] == pytest.approx(2885.3900817779268, rel=1e-12)
    assert metrics["bppl"] == math.inf
    assert metrics["loss"] == metrics["bpc"]


def test_token_byte_ratio(caplog: pytest.LogCaptureFixture) -> None:
    assert token_byte_ratio(50, 200) == 0.25
    assert token_byte_ratio(5, 0) == math.inf
    assert check_token_byte_ratio(50, 200) is False
    assert "suspicious" not in caplog.text
    assert check_token_byte_ratio(9, 100) is True
    assert "suspicious" in caplog.text
