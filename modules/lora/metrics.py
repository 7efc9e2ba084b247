"""The submitted metrics as formulas on numbers: no model, no tensors.

Contract (docs/lora-scoring.md, "Loss"): the reference runs HF `Trainer.evaluate` at batch size
1, so `eval_loss` is the plain mean of the per-example mean losses that `forward.example_losses`
computes. The metrics derived from it (docs/lora-scoring.md, "Metrics") follow the reference's
order of operations, so that rounding matches; a submission that cannot be scored gets 999.
"""

from __future__ import annotations

import logging
import math

from validator.kit import current_scope

log = logging.getLogger(__name__)

# What the reference submits when the loss cannot be computed (and for oversized models).
HIGH_LOSS = 999.0
SUSPICIOUS_TOKEN_BYTE_RATIO = 0.1


def eval_loss(losses: list[float]) -> float:
    """Mean of the per-example losses; NaN when empty or when any example is NaN."""
    if not losses or any(math.isnan(x) for x in losses):
        return math.nan
    return math.fsum(losses) / len(losses)


def score_metrics(eval_loss: float, total_target_tokens: int, total_bytes: int) -> dict:
    """The submitted metrics (docs/lora-scoring.md, "Metrics"), computed in the reference's
    order of operations.

    Invalid input (zero bytes, NaN or infinite loss) gives what the FLock-validator lora module
    reports for an oversized model: loss = bpc = 999, bppl = 2**999, NaN totals.
    """
    if total_bytes == 0 or math.isnan(eval_loss) or math.isinf(eval_loss):
        # The network's penalty, not a score: said once, with the result (Scope.penalty).
        current_scope().penalty(
            "no_score",
            f"cannot compute bpc (eval_loss={eval_loss}, bytes={total_bytes}): loss {HIGH_LOSS:g}",
        )
        return high_loss_metrics(eval_loss)
    nats = eval_loss * total_target_tokens
    bits = nats / math.log(2)
    bpc = bits / total_bytes
    return {
        "loss": bpc,
        "bpc": bpc,
        "bppl": _pow2(bpc),
        "nll_token_nats_total": nats,
        "nll_token_bits_total": bits,
        "eval_loss": eval_loss,
    }


def high_loss_metrics(eval_loss: float = math.nan) -> dict:
    """Metrics for a submission that gets the 999 penalty (oversized, or loss not computable)."""
    return {
        "loss": HIGH_LOSS,
        "bpc": HIGH_LOSS,
        "bppl": _pow2(HIGH_LOSS),
        "nll_token_nats_total": math.nan,
        "nll_token_bits_total": math.nan,
        "eval_loss": eval_loss,
    }


def token_byte_ratio(total_target_tokens: int, total_bytes: int) -> float:
    """T/B; infinite when there are no bytes (as the reference's get_token_byte_ratio)."""
    if total_bytes == 0:
        return math.inf
    return total_target_tokens / total_bytes


def check_token_byte_ratio(total_target_tokens: int, total_bytes: int) -> bool:
    """Logs the ratio; True (and a 'suspicious' warning) when it is below 0.1.

    A very low ratio means few tokens carry many bytes, which a manipulated tokenization or
    validation set would produce; the reference only logs it, so do we.
    """
    ratio = token_byte_ratio(total_target_tokens, total_bytes)
    if ratio < SUSPICIOUS_TOKEN_BYTE_RATIO:
        log.warning(
            "suspicious token/byte ratio %.4f (T=%d, B=%d): below %s",
            ratio,
            total_target_tokens,
            total_bytes,
            SUSPICIOUS_TOKEN_BYTE_RATIO,
        )
        return True
    log.debug("token/byte ratio %.4f (T=%d, B=%d)", ratio, total_target_tokens, total_bytes)
    return False


def _pow2(bpc: float) -> float:
    # 2**bpc overflows a float above bpc 1024; bppl is then inf rather than an error that
    # would fail an assignment whose bpc is valid.
    try:
        return math.pow(2, bpc)
    except OverflowError:
        return math.inf
