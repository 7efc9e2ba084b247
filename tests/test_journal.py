import multiprocessing
import sqlite3

import pytest

from tests.helpers.tmpfs import fill, small_tmpfs
from validator.errors import ConfigError
from validator.journal import (
    RESERVE_NAME,
    UNDECIDED,
    UNSUBMITTED,
    Journal,
    JournalUnwritable,
    State,
)


@pytest.fixture
def journal(tmp_path):
    journal = Journal(tmp_path / "state")
    yield journal
    journal.close()


def test_assignment_moves_through_states_with_an_event_trail(journal):
    journal.receive("5", "lora", "12", {"hg_repo_id": "a/b"})
    journal.begin_scoring("5")
    journal.scored("5", {"loss": 1.5, "bppl": float("inf")})
    entry = journal.get("5")
    assert entry.state is State.SCORED
    assert entry.metrics == {"loss": 1.5, "bppl": float("inf")}
    assert entry.attempts == 1
    journal.submitted("5")
    entry = journal.get("5")
    assert (entry.state, entry.outcome) == (State.SUBMITTED, "completed")
    assert [state for state, _ in journal.events("5")] == [
        "received",
        "scoring",
        "scored",
        "submitted",
    ]


def test_failed_outcome_is_recorded_on_submit(journal):
    journal.receive("6", "lora", "12", {})
    journal.failed("6", "ValueError: bad adapter")
    assert journal.get("6").error == "ValueError: bad adapter"
    journal.submitted("6")
    assert journal.get("6").outcome == "failed"


def test_receive_keeps_an_existing_entry(journal):
    journal.receive("5", "lora", "12", {"x": 1})
    journal.begin_scoring("5")
    entry = journal.receive("5", "lora", "12", {"x": 2})
    assert entry.state is State.SCORING
    assert entry.input == {"x": 1}


def test_postpone_does_not_count_as_an_attempt(journal):
    journal.receive("5", "lora", "12", {})
    journal.begin_scoring("5")
    journal.postpone("5", "disk full", 123.0)
    entry = journal.get("5")
    assert (entry.state, entry.attempts, entry.not_before) == (State.RECEIVED, 0, 123.0)


def test_retry_later_counts_the_attempt(journal):
    journal.receive("5", "lora", "12", {})
    journal.begin_scoring("5")
    journal.retry_later("5", "unexpected error in the module: TypeError: x", 123.0)
    journal.begin_scoring("5")
    journal.retry_later("5", "unexpected error in the module: TypeError: y", 456.0)
    entry = journal.get("5")
    assert (entry.state, entry.attempts, entry.not_before) == (State.RECEIVED, 2, 456.0)
    assert entry.error == "unexpected error in the module: TypeError: y"


def test_pending_is_per_module_and_state_and_survives_reopen(tmp_path):
    journal = Journal(tmp_path)
    journal.receive("1", "lora", "12", {})
    journal.receive("2", "rl", "13", {})
    journal.receive("3", "lora", "12", {})
    journal.begin_scoring("3")
    journal.scored("3", {"loss": 2.0})
    journal.close()
    reopened = Journal(tmp_path)
    assert [e.id for e in reopened.pending("lora", UNDECIDED)] == ["1"]
    assert [e.id for e in reopened.pending("lora", UNSUBMITTED)] == ["3"]
    assert [e.id for e in reopened.pending("rl", UNDECIDED)] == ["2"]
    reopened.close()


def _try_open(path, queue):
    try:
        Journal(path)
        queue.put("opened")
    except ConfigError as exc:
        queue.put(str(exc))


def test_second_process_on_the_same_state_dir_is_refused(journal, tmp_path):
    queue = multiprocessing.get_context("spawn").Queue()
    process = multiprocessing.get_context("spawn").Process(
        target=_try_open, args=(tmp_path / "state", queue)
    )
    process.start()
    process.join(30)
    assert "in use by another validator process" in queue.get(timeout=5)


def test_below_the_free_space_floor_the_journal_refuses_and_says_where(tmp_path):
    journal = Journal(tmp_path, min_free_mb=1 << 40)
    with pytest.raises(JournalUnwritable) as refused:
        journal.ensure_writable()
    message = str(refused.value)
    assert f"state dir {tmp_path} " in message and "MiB free" in message
    assert "\n" not in message
    journal.ensure_writable(floor=False)  # submissions of decided results still go ahead
    journal.close()


def test_a_disk_filling_up_records_the_step_in_progress_then_refuses(tmp_path):
    with small_tmpfs(tmp_path / "state", size_kib=1024) as state:
        journal = Journal(state, min_free_mb=0)
        journal.receive("1", "lora", "12", {"hg_repo_id": "a/b"})
        journal.ensure_writable()
        filler = fill(state)
        # The reserve pays for this write: an assignment already handed out is recorded.
        journal.receive("2", "lora", "12", {"hg_repo_id": "c/d"})
        assert not (state / RESERVE_NAME).exists()
        with pytest.raises(JournalUnwritable, match="state dir .* cannot take journal writes"):
            journal.ensure_writable(floor=False)
        more = fill(state, name="more")  # what the reserve gave back is taken too
        with pytest.raises(JournalUnwritable, match="journal write: database or disk is full"):
            journal.receive("3", "lora", "12", {})
        assert [e.id for e in journal.pending("lora", UNDECIDED)] == ["1", "2"]
        journal.close()

        filler.unlink()
        more.unlink()
        reopened = Journal(state, min_free_mb=0)
        reopened.ensure_writable()
        assert (state / RESERVE_NAME).exists()
        reopened.receive("3", "lora", "12", {})
        assert [e.id for e in reopened.pending("lora", UNDECIDED)] == ["1", "2", "3"]
        reopened.close()


def test_opening_on_a_full_disk_is_an_operator_error_and_loses_nothing(tmp_path):
    with small_tmpfs(tmp_path / "state", size_kib=1024) as state:
        journal = Journal(state, min_free_mb=0)
        journal.receive("1", "lora", "12", {})
        journal.close()
        filler = fill(state)
        with pytest.raises(JournalUnwritable, match=f"state dir {state} "):
            Journal(state, min_free_mb=0)
        filler.unlink()
        with sqlite3.connect(state / "journal.sqlite3") as db:
            assert db.execute("SELECT id, state FROM assignments").fetchall() == [("1", "received")]
