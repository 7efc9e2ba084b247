"""The arithmetic lora scores in: which dtype and autocast each device and config gets, and
that our batched forward under an autocast agrees with the reference's Trainer under the same
mixed precision (bf16 stands in on a CPU for the GPU's fp16, which a CPU Trainer refuses)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from bench.lora_baseline import trainer_eval_loss
from devkit.tiny_models import build_model, make_lora, merged_copy
from modules.lora.forward import example_losses
from modules.lora.metrics import eval_loss
from modules.lora.precision import pick_precision
from modules.lora.records import EncodedExample
from modules.lora.schemas import LoraConfig

VOCAB = 640


def test_the_network_default_on_a_gpu_is_fp16_weights_under_fp16_autocast() -> None:
    assert LoraConfig(supported_base_models=["Qwen/Qwen2.5-0.5B"]).fp16 is True
    precision = pick_precision("cuda", fp16=True)
    assert (precision.weights, precision.autocast) == (torch.float16, torch.float16)
    assert precision.matches_network


def test_bf16_is_an_explicit_option_that_does_not_match_the_network() -> None:
    precision = pick_precision("cuda", fp16=False)
    # As the reference with fp16 off: bf16 weights, the Trainer without mixed precision.
    assert (precision.weights, precision.autocast) == (torch.bfloat16, None)
    assert not precision.matches_network
    assert "does NOT match" in precision.describe()


@pytest.mark.parametrize("fp16", [True, False])
def test_a_cpu_scores_in_fp32_without_autocast(fp16: bool) -> None:
    precision = pick_precision("cpu", fp16=fp16)
    assert (precision.weights, precision.autocast) == (torch.float32, None)
    assert precision.describe() == "float32 weights"


def _examples(count: int, seed: int) -> list[EncodedExample]:
    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        length = rng.randint(5, 40)
        mask = [1 if rng.random() < 0.5 else 0 for _ in range(length)]
        mask[-1] = 1
        examples.append(EncodedExample([rng.randrange(VOCAB) for _ in range(length)], mask))
    return examples


@pytest.mark.parametrize("kind", ["qwen2", "gemma2"])
def test_our_autocast_forward_matches_the_trainer_under_mixed_precision(
    kind: str, tmp_path: Path
) -> None:
    model = merged_copy(make_lora(build_model(kind, vocab_size=VOCAB, seed=1), seed=2))
    examples = _examples(12, seed=3)

    def ours(autocast: torch.dtype | None, max_batch_size: int = 1) -> float:
        losses = example_losses(
            model, examples, max_batch_size=max_batch_size, pad_token_id=3, autocast=autocast
        )
        return eval_loss(losses)

    reference = trainer_eval_loss(model, examples, 3, tmp_path, mixed_precision="bf16")
    mixed, plain = ours(torch.bfloat16), ours(None)
    # One at a time, as the Trainer: the same arithmetic, up to the order of the final sums.
    assert mixed == pytest.approx(reference, rel=1e-6)
    # Without the autocast the same weights score measurably differently: the regime matters.
    assert abs(plain - reference) > 30 * abs(mixed - reference)
    # Batched: padded rows round differently in a 16-bit forward, far less than bf16 vs fp32.
    assert ours(torch.bfloat16, max_batch_size=4) == pytest.approx(reference, rel=1e-4)
    # And the Trainer without mixed precision is the plain forward again (its state is reset).
    assert trainer_eval_loss(model, examples, 3, tmp_path) == pytest.approx(plain, rel=1e-6)
