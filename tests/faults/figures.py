"""Figures of the fault suite (kills, API faults, full disks...), printed at the end of a test
run so that CI's log carries them; docs/fault-suite.md quotes them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    case: str  # what was done, e.g. "kill -9 at random moments"
    result: str  # what was measured, e.g. "24 trials, 31 submissions, 0 lost, 0 double"


FIGURES: list[Figure] = []


def record(case: str, result: str) -> None:
    FIGURES.append(Figure(case, result))
