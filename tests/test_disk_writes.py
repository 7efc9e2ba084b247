"""What the loop writes to the disk when it has nothing to do: the free-space guard
(validator/disk.py) reads the file system at every check and writes its test file only near the
floor or once an hour, so that an idle lookup costs a few KiB at most (it wrote and synced
64 KiB each: about 6 GB a day at 200 tasks). The real runner and journal, the state dir on a
real disk (tmp_path), the bytes this process sent to the storage layer (/proc/self/io's
write_bytes) read at each lookup. The guarantees of the guard on a full disk:
tests/faults/test_full_disk.py."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.loop import Loop
from validator.errors import ExitCode
from validator.observe.hooks import Middleware

TASKS = [str(n) for n in range(1, 21)]
ROUNDS = 10
FEW_KIB = 4 * 1024


def write_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no write_bytes in /proc/self/io")


class Written(Middleware):
    """This process's write_bytes after each lookup."""

    def __init__(self) -> None:
        self.samples: list[int] = []

    def after_lookup(self, task_id: str, answer: str, seconds: float, assignment_id) -> None:
        self.samples.append(write_bytes())


def test_an_idle_lookup_writes_a_few_kib_at_most(tmp_path):
    loop = Loop(tmp_path, on_disk=True)
    written = Written()
    try:
        horizon = ROUNDS * (loop.lookup_interval + 1) + 1
        assert loop.run(TASKS, horizon=horizon, hooks=[written]) == ExitCode.OK
    finally:
        loop.close()
    assert {lookup.answer for lookup in loop.ledger.lookups} == {"no_submissions"}
    samples = written.samples
    assert len(samples) >= len(TASKS) * ROUNDS
    per_lookup = (samples[-1] - samples[0]) / (len(samples) - 1)
    assert per_lookup <= FEW_KIB, f"{per_lookup:.0f} bytes written per idle lookup"
