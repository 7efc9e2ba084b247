"""The report's figures against a journal and records this test builds, by hand-computed
values: counts by task and outcome, per hour, phase medians and p95s, score statistics, the
latest failures; in text, JSON (the real CLI) and HTML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from validator.report.summary import percentile, render_text, summarize
from validator.state.journal import Journal
from validator.state.records import AssignmentRecord, RecordStore

REPO = Path(__file__).resolve().parents[1]
HOUR = 3600.0
T0 = 1_800_000_000.0  # a whole hour (2027-01-15 08:00 UTC)

# (id, task, outcome, score phase seconds, loss or None)
DONE = [
    ("1", "7", "completed", 10.0, 0.5),
    ("2", "7", "completed", 20.0, 0.7),
    ("3", "7", "completed", 30.0, 0.9),
    ("4", "8", "completed", 40.0, 1.5),
    ("5", "8", "failed", 1.0, None),
]


@pytest.fixture
def state(tmp_path) -> Path:
    journal = Journal(tmp_path)
    for assignment_id, task_id, outcome, _, loss in DONE:
        entry = journal.receive(
            assignment_id, "lora", task_id, {"hg_repo_id": f"u/{assignment_id}"}
        )
        entry = journal.begin_scoring(entry)
        if outcome == "completed":
            entry = journal.scored(entry, {"loss": loss, "bpc": loss})
        else:
            entry = journal.failed(entry, "adapter_config.json has no base_model_name_or_path")
        journal.submitted(entry)
    journal.receive("6", "lora", "8", {"hg_repo_id": "u/6"})  # still to score
    journal.close()
    # Finish times: 1-3 in the first hour, 4-5 in the second.
    with _db(tmp_path) as db:
        for assignment_id, offset in [("1", 60), ("2", 120), ("3", 3000), ("4", HOUR + 5)]:
            finished = (T0 + offset, assignment_id)
            db.execute("UPDATE assignments SET updated_at=? WHERE id=?", finished)
        db.execute("UPDATE assignments SET updated_at=? WHERE id='5'", (T0 + HOUR + 50,))
    store = RecordStore(tmp_path)
    for index, (assignment_id, task_id, outcome, seconds, loss) in enumerate(DONE):
        store.write(
            AssignmentRecord(
                id=assignment_id,
                task_id=task_id,
                module="lora",
                outcome=outcome,
                received_at=T0,
                finished_at=T0 + index,
                metrics={"loss": loss, "bpc": loss} if loss is not None else None,
                phases={"lookup": 0.5, "score": seconds, "submit": 0.1 * (index + 1)},
            )
        )
    return tmp_path


def _db(state_dir: Path):
    import sqlite3

    return sqlite3.connect(state_dir / "journal.sqlite3")


def test_the_summary_has_the_hand_computed_figures(state):
    summary, records = summarize(state)
    assert summary.assignments == 6 and summary.records == len(records) == 5
    assert summary.by_task == {
        "7": {"completed": 3},
        "8": {"completed": 1, "failed": 1, "received": 1},
    }
    assert summary.per_hour == {int(T0): 3, int(T0 + HOUR): 2}
    phases = {p.phase: p for p in summary.phases}
    assert list(phases) == ["lookup", "score", "submit"]
    # score seconds 10, 20, 30, 40, 1: median 20; nearest-rank p95 of 5 values: the 5th, 40.
    assert (phases["score"].median_s, phases["score"].p95_s) == (20.0, 40.0)
    assert (phases["submit"].median_s, phases["submit"].p95_s) == (pytest.approx(0.3), 0.5)
    scores = {s.task_id: s for s in summary.scores}
    assert (scores["7"].metric, scores["7"].count) == ("loss", 3)
    assert (scores["7"].min, scores["7"].median, scores["7"].max) == (0.5, 0.7, 0.9)
    assert scores["7"].mean == pytest.approx(0.7)
    assert (scores["8"].count, scores["8"].median) == (1, 1.5)
    (failure,) = summary.failures
    assert (failure.id, failure.task_id) == ("5", "8")
    assert failure.reason == "adapter_config.json has no base_model_name_or_path"


def test_penalties_are_kept_apart_from_the_scores(tmp_path):
    """A -999 counted as a score would make task 7's mean -333.349 and squash its scores into
    one bar; a penalty is counted by kind, its reason among the latest."""
    journal = Journal(tmp_path)
    store = RecordStore(tmp_path)
    for assignment_id, score, penalty in [
        ("1", 0.71, None),
        ("2", 0.65, None),
        ("3", -999.0, ("cannot_load", "the model cannot be loaded: no weights: score -999")),
    ]:
        entry = journal.begin_scoring(journal.receive(assignment_id, "llm_judge", "7", {}))
        entry = journal.submitted(journal.scored(entry, {"score": score}, penalty))
        record = AssignmentRecord(
            id=assignment_id,
            task_id="7",
            module="llm_judge",
            outcome="completed",
            received_at=T0,
            finished_at=T0,
            metrics={"score": score},
        )  # no penalty in the record: the journal's is the truth
        store.write(record)
    journal.close()
    summary, _ = summarize(tmp_path, "volume flock-validator-llm_judge-state")
    (scores,) = summary.scores
    assert (scores.count, scores.min, scores.max) == (2, 0.65, 0.71)
    assert scores.mean == pytest.approx(0.68)
    assert [(p.task_id, p.kind, p.count) for p in summary.penalties] == [("7", "cannot_load", 1)]
    (latest,) = summary.failures
    assert (latest.id, latest.outcome, latest.kind) == ("3", "completed", "cannot_load")
    text = render_text(summary)
    assert text.startswith("flock-validator report: volume flock-validator-llm_judge-state (")
    assert "task 7: score n=2 min 0.65 median 0.68 max 0.71 mean 0.68" in text
    assert "task 7: cannot_load 1" in text
    assert (
        "assignment 3 (task 7), completed (cannot_load): the model cannot be loaded: no "
        "weights: score -999" in text
    )


def test_percentile_is_the_nearest_rank():
    assert percentile([5.0], 0.95) == 5.0
    assert percentile([float(v) for v in range(1, 101)], 0.95) == 95.0
    assert percentile([1.0, 2.0], 0.5) == 1.0


def test_text_report_shows_the_figures(state):
    text = render_text(summarize(state)[0])
    assert "6 assignments, 5 records" in text
    assert "score     n=5     median    20.00  p95    40.00" in text
    assert "task 7: loss n=3 min 0.5 median 0.7 max 0.9 mean 0.7" in text
    assert (
        "assignment 5 (task 8), failed (unrecorded): adapter_config.json has no "
        "base_model_name_or_path" in text
    )


def report_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "validator", "report", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_json_and_html_from_the_cli(state, tmp_path):
    result = report_cli("--state-dir", str(state), "--json")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["assignments"] == 6 and body["by_task"]["7"] == {"completed": 3}
    page = tmp_path / "report.html"
    result = report_cli("--state-dir", str(state), "--html", str(page))
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    assert html.count("src='data:image/png;base64,") == 3
    assert "<b id='assignments'>6</b>" in html


def test_a_folder_without_a_journal_is_a_clear_error(tmp_path):
    result = report_cli("--state-dir", str(tmp_path))
    assert result.returncode == 2
    assert "no journal at" in result.stderr and "Traceback" not in result.stderr


def test_records_are_bounded_oldest_first(tmp_path):
    store = RecordStore(tmp_path, keep=3)
    for index in range(5):
        store.write(
            AssignmentRecord(
                id=str(index),
                task_id="1",
                module="m",
                outcome="completed",
                received_at=T0,
                finished_at=T0 + index,
            )
        )
    assert [r.id for r in store.read_all()] == ["2", "3", "4"]


def test_the_loop_loads_nothing_of_the_report():
    import subprocess
    import sys

    code = (
        "import sys, validator.entrypoint, validator.observe.status_server; "
        "print(sorted(m for m in sys.modules if m.startswith('validator.report')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
