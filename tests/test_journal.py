import multiprocessing
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from tests.helpers.tmpfs import fill, small_tmpfs
from validator.errors import ConfigError, JournalBroken, JournalLocked, JournalUnwritable
from validator.observe.logs import RedactSecrets
from validator.state.entry import UNDECIDED, UNSUBMITTED, State
from validator.state.journal import RESERVE_NAME, Journal
from validator.state.store import SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_VERSION

JOURNAL = "journal.sqlite3"


@pytest.fixture
def journal(tmp_path):
    journal = Journal(tmp_path / "state")
    yield journal
    journal.close()


def test_assignment_moves_through_states_with_an_event_trail(journal):
    entry = journal.receive("5", "lora", "12", {"hg_repo_id": "a/b"})
    entry = journal.begin_scoring(entry)
    assert entry == journal.get("5")  # what a transition returns is what the journal holds
    entry = journal.scored(entry, {"loss": 1.5, "bppl": float("inf")})
    assert entry.state is State.SCORED
    assert entry.metrics == {"loss": 1.5, "bppl": float("inf")}
    assert entry.attempts == 1
    assert entry == journal.get("5")
    entry = journal.submitted(entry)
    assert (entry.state, entry.outcome) == (State.SUBMITTED, "completed")
    assert entry == journal.get("5")
    assert [state for state, _ in journal.events("5")] == [
        "received",
        "scoring",
        "scored",
        "submitted",
    ]


def test_failed_outcome_is_recorded_on_submit(journal):
    entry = journal.failed(journal.receive("6", "lora", "12", {}), "ValueError: bad adapter")
    assert entry.error == "ValueError: bad adapter" == journal.get("6").error
    entry = journal.submitted(entry)
    assert entry.outcome == "failed" == journal.get("6").outcome


def test_a_known_secret_in_a_reason_is_never_stored(tmp_path):
    # A reason quotes errors (a child's stderr, a library's message); the journal feeds the
    # records, the report and the status page, so the log's redactor applies there too.
    secret = "hf_" + "Q" * 30
    journal = Journal(tmp_path / "state", redact=RedactSecrets([secret]).redact)
    try:
        entry = journal.receive("7", "lora", "12", {})
        entry = journal.retry_later(entry, f"RuntimeError: token={secret} refused", 0)
        journal.failed(entry, f"child said {secret}")
        stored = [journal.get("7").error, *(note for _, note in journal.events("7"))]
        assert not any(secret in (text or "") for text in stored), stored
        assert journal.get("7").error.startswith("child said ")
    finally:
        journal.close()


def test_receive_keeps_an_existing_entry(journal):
    journal.begin_scoring(journal.receive("5", "lora", "12", {"x": 1}))
    entry = journal.receive("5", "lora", "12", {"x": 2})
    assert entry.state is State.SCORING
    assert entry.input == {"x": 1}


def test_postpone_does_not_count_as_an_attempt(journal):
    entry = journal.begin_scoring(journal.receive("5", "lora", "12", {}))
    entry = journal.postpone(entry, "disk full", 123.0)
    assert entry == journal.get("5")
    assert (entry.state, entry.attempts, entry.not_before) == (State.RECEIVED, 0, 123.0)


def test_retry_later_counts_the_attempt(journal):
    entry = journal.begin_scoring(journal.receive("5", "lora", "12", {}))
    entry = journal.retry_later(entry, "unexpected error in the module: TypeError: x", 123.0)
    entry = journal.begin_scoring(entry)
    entry = journal.retry_later(entry, "unexpected error in the module: TypeError: y", 456.0)
    assert entry == journal.get("5")
    assert (entry.state, entry.attempts, entry.not_before) == (State.RECEIVED, 2, 456.0)
    assert entry.error == "unexpected error in the module: TypeError: y"


def test_pending_is_per_module_and_state_and_survives_reopen(tmp_path):
    journal = Journal(tmp_path)
    journal.receive("1", "lora", "12", {})
    journal.receive("2", "rl", "13", {})
    journal.scored(journal.begin_scoring(journal.receive("3", "lora", "12", {})), {"loss": 2.0})
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


# --- a broken or locked journal ---------------------------------------------------------------


def _journal_with_rows(state: Path) -> bytes:
    journal = Journal(state)
    for assignment_id in ("1", "2", "3"):
        entry = journal.receive(assignment_id, "lora", "12", {"hg_repo_id": "a/b" * 20})
        journal.scored(entry, {"loss": 1.0})
    journal.close()
    return (state / JOURNAL).read_bytes()


def _refused_as_broken(state: Path) -> str:
    before = (state / JOURNAL).read_bytes()
    with pytest.raises(JournalBroken) as refused:
        Journal(state)
    message = str(refused.value)
    assert message.startswith(f"journal {state / JOURNAL} is broken: "), message
    assert "move it out of the state dir" in message and "\n" not in message
    assert (state / JOURNAL).read_bytes() == before  # not a byte written
    # Refusing let go of both locks: a rerun gets the same answer, not "in use".
    with pytest.raises(JournalBroken):
        Journal(state)
    return message


def test_a_file_that_is_not_a_database_is_refused_and_kept(tmp_path):
    (tmp_path / JOURNAL).write_bytes(b"not a journal\n" * 1000)
    assert "SQLite cannot read it: file is not a database" in _refused_as_broken(tmp_path)


@pytest.mark.parametrize("keep", [0.5, 0.75, 100 / 16384])
def test_a_truncated_journal_is_refused_and_kept(tmp_path, keep):
    data = _journal_with_rows(tmp_path / "whole")
    (tmp_path / JOURNAL).write_bytes(data[: int(len(data) * keep)])
    assert "database disk image is malformed" in _refused_as_broken(tmp_path)


def test_a_journal_missing_a_column_is_refused_and_kept(tmp_path):
    with sqlite3.connect(tmp_path / JOURNAL) as db:
        db.executescript(SCHEMA_V1.replace("    not_before REAL NOT NULL DEFAULT 0,\n", ""))
        db.execute(
            "INSERT INTO assignments (id, module, task_id, state, input, received_at, updated_at)"
            " VALUES ('1', 'lora', '12', 'scored', '{}', 0, 0)"
        )
    db.close()
    message = _refused_as_broken(tmp_path)
    assert "an unknown schema, not migrated: table 'assignments' lacks not_before" in message


def test_a_journal_of_a_newer_validator_is_refused(tmp_path):
    _journal_with_rows(tmp_path)
    with sqlite3.connect(tmp_path / JOURNAL) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    assert "newer than this validator's" in _refused_as_broken(tmp_path)


def test_a_journal_of_an_earlier_validator_is_migrated_and_keeps_its_rows(tmp_path):
    with sqlite3.connect(tmp_path / JOURNAL) as db:  # as every journal before the version
        db.executescript(SCHEMA_V1)
        db.execute(
            "INSERT INTO assignments (id, module, task_id, state, input, metrics, received_at,"
            " updated_at) VALUES ('1', 'lora', '12', 'scored', '{\"a\": 1}', '{\"loss\": 2}', 5, 6)"
        )
        db.execute("INSERT INTO events VALUES ('1', 5, 'received', 'task 12')")
        # Version 1 kept what a submit try may have had taken in the error's text.
        db.execute(
            "INSERT INTO assignments (id, module, task_id, state, input, error, received_at,"
            " updated_at) VALUES ('2', 'lora', '12', 'failed', '{}', ?, 7, 8)",
            ("submit, maybe taken by the API: HTTP 502: bad gateway; then: HTTP 503: busy",),
        )
    db.close()
    journal = Journal(tmp_path)
    try:
        entry, kept = journal.pending("lora", UNSUBMITTED)
        assert (entry.id, entry.input, entry.metrics) == ("1", {"a": 1}, {"loss": 2})
        assert entry.maybe_taken is None
        assert (kept.id, kept.maybe_taken) == ("2", "HTTP 502: bad gateway")
        assert (entry.received_at, entry.updated_at) == (5.0, 6.0)
        assert journal.events("1") == [("received", "task 12")]
        assert journal.quarantined() == []
    finally:
        journal.close()
    with sqlite3.connect(tmp_path / JOURNAL) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        # The constraints hold from now on.
        with pytest.raises(sqlite3.IntegrityError, match="NOT NULL"):
            db.execute("UPDATE assignments SET id = NULL")
    db.close()


V2_ROW = ["id", "module", "task_id", "state", "input", "metrics", "outcome", "error", "attempts"]
V2_ROW += ["not_before", "received_at", "updated_at", "maybe_taken"]


def test_version_2s_schema_keeps_the_columns_version_2_journals_hold():
    """SCHEMA_V2 and version 3's SCHEMA are built from one template (store.py): a column meant for
    a later version, written into the template, would change what a version 2 journal is checked
    against and migrated from."""
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA_V2)
    tables = ("assignments", "events", "quarantine")
    columns = {t: [row[1] for row in db.execute(f"PRAGMA table_info({t})")] for t in tables}
    db.close()
    assert columns == {
        "assignments": V2_ROW,
        "events": ["assignment_id", "time", "state", "note"],
        "quarantine": [*V2_ROW, "reason", "set_aside_at"],
    }


def test_version_3s_schema_keeps_the_columns_version_3_journals_hold():
    """SCHEMA_V3, against which a version 3 journal is checked and migrated, is version 2's and
    the penalty's two columns: version 4's, built from the same template, adds none to it."""
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA_V3)
    tables = ("assignments", "events", "quarantine")
    columns = {t: [row[1] for row in db.execute(f"PRAGMA table_info({t})")] for t in tables}
    db.close()
    v3_row = [*V2_ROW, "penalty_kind", "penalty"]
    assert columns == {
        "assignments": v3_row,
        "events": ["assignment_id", "time", "state", "note"],
        "quarantine": [*V2_ROW, "reason", "set_aside_at", "penalty_kind", "penalty"],
    }


def test_a_version_2_journal_gains_the_penalty_columns_and_its_failures_their_reasons(tmp_path):
    """Version 3 keeps why a result is a penalty; a version 2 journal is migrated in place, and a
    result failed before it gets its reason from the failure's event (its error column may since
    hold a submit try's words), its kind left unrecorded."""
    with sqlite3.connect(tmp_path / JOURNAL) as db:
        db.executescript(SCHEMA_V2 + "PRAGMA user_version = 2;")
        insert = (
            "INSERT INTO assignments (id, module, task_id, state, input, metrics, outcome, error,"
            " received_at, updated_at) VALUES (?, 'lora', '12', ?, '{}', ?, ?, ?, 1.0, 2.0)"
        )
        db.execute(insert, ("1", "submitted", None, "failed", "submit: HTTP 503: busy"))
        db.execute(insert, ("2", "submitted", '{"loss": 1}', "completed", None))
        db.execute(insert, ("3", "failed", None, None, "ValueError: no adapter"))
        for row in (("1", "failed", "ValueError: bad rank"), ("1", "submitted", "failed")):
            db.execute("INSERT INTO events VALUES (?, 1.5, ?, ?)", (row[0], row[1], row[2]))
        db.execute("INSERT INTO events VALUES ('3', 1.5, 'failed', 'ValueError: no adapter')")
    db.close()
    journal = Journal(tmp_path)
    try:
        (kept,) = journal.pending("lora", UNSUBMITTED)
        assert (kept.penalty_kind, kept.penalty) == (None, "ValueError: no adapter")
        scored = journal.scored(
            journal.receive("4", "lora", "12", {}), {"score": -999.0}, ("cannot_load", "no weights")
        )
        assert (scored.penalty_kind, scored.penalty) == ("cannot_load", "no weights")
    finally:
        journal.close()
    with sqlite3.connect(tmp_path / JOURNAL) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 4
        rows = db.execute("SELECT id, penalty_kind, penalty FROM assignments ORDER BY id")
        assert rows.fetchall() == [
            ("1", None, "ValueError: bad rank"),
            ("2", None, None),
            ("3", None, "ValueError: no adapter"),
            ("4", "cannot_load", "no weights"),
        ]
    db.close()
    Journal(tmp_path).close()  # opened again as version 3: nothing to migrate, nothing refused


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def test_a_lock_at_open_is_waited_for(tmp_path):
    _journal_with_rows(tmp_path)
    holder = _hold_write_lock(tmp_path / JOURNAL)
    release = threading.Timer(1.0, lambda: holder.execute("ROLLBACK"))
    release.start()
    started = time.monotonic()
    journal = Journal(tmp_path, lock_timeout=20)
    assert time.monotonic() - started >= 0.9
    journal.receive("4", "lora", "12", {})
    assert len(journal.pending("lora", UNDECIDED + UNSUBMITTED)) == 4
    journal.close()
    release.join()
    holder.close()


def test_a_lock_past_the_bound_refuses_the_next_step_and_the_journal_goes_on_after(tmp_path):
    journal = Journal(tmp_path, lock_timeout=0.5)
    journal.receive("1", "lora", "12", {})
    holder = _hold_write_lock(tmp_path / JOURNAL)
    with pytest.raises(JournalLocked, match=f"journal {tmp_path / JOURNAL} stayed locked"):
        journal.ensure_writable(floor=False)
    with pytest.raises(JournalLocked):  # a write that raced the check waits, then says why
        journal.receive("2", "lora", "12", {})
    assert [e.id for e in journal.pending("lora", UNDECIDED)] == ["1"]  # reads go on
    holder.execute("ROLLBACK")
    holder.close()
    journal.ensure_writable(floor=False)
    journal.receive("2", "lora", "12", {})
    assert [e.id for e in journal.pending("lora", UNDECIDED)] == ["1", "2"]
    journal.close()


def test_a_lock_past_the_bound_at_open_is_refused_and_lets_go(tmp_path):
    _journal_with_rows(tmp_path)
    holder = _hold_write_lock(tmp_path / JOURNAL)
    with pytest.raises(JournalLocked, match="VALIDATOR_JOURNAL_LOCK_TIMEOUT sets the wait"):
        Journal(tmp_path, lock_timeout=0.3)
    holder.execute("ROLLBACK")
    holder.close()
    Journal(tmp_path, lock_timeout=0.3).close()


def test_deleting_the_state_dirs_files_does_not_let_a_second_process_in(journal, tmp_path):
    # A cleanup that deletes every file there (a lock file of old, the journal itself): the
    # lock is on the directory. Before, a lock file and the journal's file each held a flock,
    # and deleting both let a second process in.
    deleted = [path.name for path in (tmp_path / "state").iterdir()]
    for name in deleted:
        (tmp_path / "state" / name).unlink()
    assert "journal.sqlite3" in deleted
    queue = multiprocessing.get_context("spawn").Queue()
    process = multiprocessing.get_context("spawn").Process(
        target=_try_open, args=(tmp_path / "state", queue)
    )
    process.start()
    process.join(30)
    refusal = queue.get(timeout=5)
    assert f"state directory {tmp_path / 'state'} is in use by another validator" in refusal
