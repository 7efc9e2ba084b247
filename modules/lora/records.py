"""Data passed between the lora module's stages: encoding, scoring, metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EncodedExample:
    """One validation conversation as the model sees it.

    `target_mask[i]` is 1 where token i is one the model is scored on (assistant output) and 0
    elsewhere; both lists have the same length, at most the context length.
    """

    input_ids: list[int]
    target_mask: list[int]

    @property
    def target_count(self) -> int:
        return sum(self.target_mask)

    @property
    def predicted_count(self) -> int:
        """Targets a next-token loss scores: position 0 is never predicted, since the logit at
        t predicts token t+1."""
        return sum(self.target_mask[1:])
