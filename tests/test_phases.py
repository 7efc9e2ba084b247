"""Whether a process death during a scoring counts against the submission, as the next process
reads it from the marks on disk (validator/state/phases.py)."""

from __future__ import annotations

from pathlib import Path

from validator.kit.base import BaseConfig, BaseMetrics, BaseValidationModule
from validator.scoring import ModulePool
from validator.state.phases import PhaseTimes, ScoringMarks


def test_a_death_while_a_module_starts_is_the_hosts_not_the_submissions(tmp_path):
    seen: list[str | None] = []

    class LoadsABase(BaseValidationModule):
        def __init__(self, config: BaseConfig) -> None:
            # What a process started after a SIGKILL here would decide.
            seen.append(ScoringMarks(tmp_path).not_counted("a1"))

        def validate(self, data) -> BaseMetrics:
            return BaseMetrics()

    pool = ModulePool(LoadsABase, "loads_a_base", tmp_path / "configs")
    with ScoringMarks(tmp_path).scoring("a1") as times:
        pool.module_for(None)
        pool.module_for(None)  # started once: the second is the same instance
    assert seen == ["the process ended in the host's work (load)"]
    assert set(times.finish()) == {"load", "score"}


def test_phases_are_listed_in_the_order_their_time_went():
    """The log line and the record list the phases in the order their longest stretches began
    (a scoring that begins with a moment of its own work is not listed "score" first)."""
    now = [0.0]

    def run(steps: list[tuple[str, float]]) -> list[str]:
        times = PhaseTimes(clock=lambda: now[0])
        for mark, seconds in steps:
            times.switch(mark)
            now[0] += seconds
        return list(times.finish())

    lora = [("submission", 0.01), ("host: download", 2), ("submission", 1), ("host: load", 3)]
    lora += [("submission", 0.5), ("host: data", 1), ("submission", 10)]
    assert run(lora) == ["download", "load", "data", "score"]
    judge = [("submission", 0.01), ("host: download", 1), ("host: data", 0.5)]
    judge += [("submission", 10), ("host: wait", 5), ("submission", 0.01)]
    assert run(judge) == ["download", "data", "score", "wait"]
    # A refusal at once: phases of no time, listed where they last began.
    refused = [("submission", 0.001), ("host: download", 0.002), ("submission", 0.001)]
    assert run(refused) == ["download", "score"]


def test_the_stop_mark_written_again_is_whole_and_leaves_no_partial_file(tmp_path: Path):
    marks = ScoringMarks(tmp_path)
    marks.mark_stopped()
    marks.mark_stopped()  # the stop watch, then a second signal on its way out
    assert marks.not_counted("a1") == (
        "the process was stopped (a stop signal, then killed) while scoring"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stop.requested"]
