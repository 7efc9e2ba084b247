"""What a full model's generation config may ask of the validator's generation
(docs/llm-judge-scoring.md, "The submission"): beams multiply the sampled sequences, and each
banned or biased sequence of several tokens is checked in Python at every step of every
sequence. No honest model asks for many, so more is a rejection (-999, as a submission that
does not load), never a limit that changes an honest score.

The values come from the bounded child that read the file (inspection.py); what reading the
files may cost the validator's process is the child's to bound, not a field's."""

from __future__ import annotations

from modules.llm_judge.inspection import ModelFacts
from validator.kit import SubmissionRejected

MAX_BEAMS = 8
MAX_SEQUENCE_RULES = 32  # each one ~0.3 ms per step for the whole batch (CPU, here)


def check_generation_config(facts: ModelFacts, what: str) -> None:
    """generation_config.json's beams and sequence rules."""
    if facts.num_beams is not None and facts.num_beams > MAX_BEAMS:
        raise SubmissionRejected(
            f"{what}: generation_config.json num_beams is {facts.num_beams}, over {MAX_BEAMS}"
        )
    if facts.sequence_rules > MAX_SEQUENCE_RULES:
        raise SubmissionRejected(
            f"{what}: generation_config.json bans or biases {facts.sequence_rules} token "
            f"sequences, over {MAX_SEQUENCE_RULES}"
        )
