"""validator/sandbox/child_files.py, with real children through the kit (the served and the fresh
path): what a child plants in its own folder (a link to the validator's /proc/self/environ, a link
to a file elsewhere, a FIFO, a hard link, a forged pid record) never makes the parent read its own
secrets, write over a file outside, block, or kill a process that is not the child's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.helpers.children import alive, wait_until
from validator.errors import SubmissionRejected
from validator.kit.boundary import inspect_in_child
from validator.sandbox import child_process, child_server
from validator.sandbox.child_files import (
    RECORD_PREFIX,
    RECORD_SUFFIX,
    ChildFileRefused,
    kill_strays,
    read_child_file,
    write_new,
)
from validator.sandbox.child_process import ChildLimits, run_child

SECRET = "flock-SECRET-child-files-789"
LIMITS = ChildLimits(wall_seconds=120)
# Replaces every file of the run's own (its stderr, its pid record) with a link to the reader's
# own environment, then fails: a parent that reads those names back reads its own secrets.
SWAP_TO_ENVIRON = (
    "import os, sys\n"
    "for name in os.listdir('.'):\n"
    "    if name.startswith('.child-'):\n"
    "        os.unlink(name)\n"
    "        os.symlink('/proc/self/environ', name)\n"
    "sys.stderr.write('boom\\n')\n"
    "sys.exit(1)\n"
)


@pytest.fixture(params=["served", "fresh"])
def path_taken(request, monkeypatch):
    if request.param == "fresh":
        monkeypatch.setattr(child_server, "server_for", lambda *_args, **_kwargs: None)
    return request.param


def script(tmp_path: Path, body: str, name: str = "child.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def test_a_child_that_links_its_stderr_to_environ_gets_back_only_what_it_wrote(
    tmp_path, monkeypatch, path_taken
):
    monkeypatch.setenv("FLOCK_API_KEY", SECRET)
    result = run_child(script(tmp_path, SWAP_TO_ENVIRON), [], cwd=tmp_path / "run", limits=LIMITS)
    assert result.exit_code == 1
    # Read through the parent's own descriptor: the file the child wrote, not the link.
    assert result.stderr_tail.strip() == "boom"
    assert SECRET not in result.describe()
    assert not list((tmp_path / "run").glob(f"{RECORD_PREFIX}*"))  # the links removed


def test_links_planted_at_a_runs_file_names_do_not_redirect_the_parents_writes(
    tmp_path, monkeypatch, path_taken
):
    # An earlier child of this folder planted links where the next run's record and stderr go
    # (the token made predictable here stands for a race the child may win).
    token = uuid.UUID(int=7)
    monkeypatch.setattr(child_process.uuid, "uuid4", lambda: token)
    victim = tmp_path / "journal.sqlite"
    victim.write_bytes(b"precious journal")
    run = tmp_path / "run"
    run.mkdir()
    for suffix in (RECORD_SUFFIX, ".stderr", ".json"):
        (run / f"{RECORD_PREFIX}{token.hex}{suffix}").symlink_to(victim)
    result = run_child(script(tmp_path, "print('hi')\n"), [], cwd=run, limits=LIMITS)
    assert result.exit_code == 0
    assert victim.read_bytes() == b"precious journal"


def test_write_new_replaces_a_link_or_a_hard_link_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"outside")
    folder = tmp_path / "child"
    folder.mkdir()
    (folder / "soft").symlink_to(victim)
    os.link(victim, folder / "hard")
    for name in ("soft", "hard"):
        write_new(folder / name, b"request")
        assert (folder / name).read_bytes() == b"request"
        assert not (folder / name).is_symlink() and (folder / name).stat().st_nlink == 1
    assert victim.read_bytes() == b"outside"
    (folder / "made-a-folder").mkdir()
    with pytest.raises(ChildFileRefused):
        write_new(folder / "made-a-folder", b"request")


def test_read_child_file_takes_only_a_plain_file_of_the_childs_own(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOCK_API_KEY", SECRET)
    folder = tmp_path / "child"
    folder.mkdir()
    (folder / "plain").write_bytes(b"answer")
    assert read_child_file(folder / "plain", 6) == b"answer"
    (folder / "environ").symlink_to("/proc/self/environ")
    os.mkfifo(folder / "fifo")
    (tmp_path / "outside").write_bytes(b"journal")
    os.link(tmp_path / "outside", folder / "hard")
    for name in ("environ", "fifo", "hard"):
        with pytest.raises(ChildFileRefused) as refused:
            read_child_file(folder / name, 1 << 20)
        assert SECRET not in str(refused.value) and "journal" not in str(refused.value)
    with pytest.raises(ChildFileRefused, match="over 5"):
        read_child_file(folder / "plain", 5)
    with pytest.raises(FileNotFoundError):
        read_child_file(folder / "none", 5)


class Answer(BaseModel):
    ok: bool


def bounded(call: Callable[[], object]) -> object:
    """What `call` returns or raises, run in a thread: a parent that blocked on a FIFO fails
    the test instead of hanging it."""
    got: list[object] = []

    def run() -> None:
        try:
            got.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert got, "the parent blocked on what the child left"
    return got[0]


def inspect_bounded(tmp_path: Path, body: str) -> object:
    """inspect_in_child's answer or exception, bounded."""
    return bounded(
        lambda: inspect_in_child(
            script(tmp_path, body, "plant.py"), {}, work=tmp_path / "work",
            what="config.json", answer=Answer, limits=LIMITS,
        )
    )  # fmt: skip


@pytest.mark.parametrize(
    "plant",
    ["os.symlink('/proc/self/environ', result)", "os.mkfifo(result)"],
    ids=["link-to-environ", "fifo"],
)
def test_an_answer_that_is_not_a_plain_file_is_the_submissions(tmp_path, monkeypatch, plant):
    monkeypatch.setenv("FLOCK_API_KEY", SECRET)
    body = f"import json, os, sys\nresult = json.load(open(sys.argv[1]))['result']\n{plant}\n"
    error = inspect_bounded(tmp_path, body)
    assert isinstance(error, SubmissionRejected), error
    assert "not a plain file" in str(error) and SECRET not in str(error)


def test_a_request_link_planted_by_an_earlier_child_is_not_written_through(tmp_path):
    victim = tmp_path / "model.safetensors"
    victim.write_bytes(b"BASE WEIGHTS")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "plant-request.json").symlink_to(victim)
    body = "import json, sys\nresult = json.load(open(sys.argv[1]))['result']\n"
    body += "json.dump({'ok': True}, open(result, 'w'))\n"
    assert inspect_bounded(tmp_path, body) == Answer(ok=True)
    assert victim.read_bytes() == b"BASE WEIGHTS"


def test_a_forged_record_does_not_kill_a_process_that_is_not_the_childs(tmp_path):
    code = "import time; time.sleep(600)"
    bystander = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        assert wait_until(lambda: alive(bystander.pid))
        forged = {
            "-c": "-c",  # any argument of a process's command line
            "x": "a" * 31,  # not a token run_child makes
            "f" * 32: "e" * 32,  # a token that is not the one its name carries
        }
        for name, token in forged.items():
            record = tmp_path / f"{RECORD_PREFIX}{name}{RECORD_SUFFIX}"
            record.write_text(json.dumps({"pid": bystander.pid, "token": token}))
        os.mkfifo(tmp_path / f"{RECORD_PREFIX}{'d' * 32}{RECORD_SUFFIX}")  # never blocks
        assert bounded(lambda: kill_strays(tmp_path)) == 0
        assert bystander.poll() is None
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()
