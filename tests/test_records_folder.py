"""The per-assignment records folder (validator/state/records.py) at its bound: a write costs the
same whatever the folder holds. It is listed once per process, then kept in order in memory;
it listed and sorted every file on every write once it held its `--records-keep`. The real
runner and its observer (records, metrics, status board) in this process (tests/helpers/loop.py);
the listings counted by the interpreter's audit events (os.scandir, os.listdir)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from validator.errors import ExitCode
from validator.observe.observer import Observer
from validator.state.records import RECORDS_DIR, RecordStore

KEEP = 5
LISTING_EVENTS = ("os.scandir", "os.listdir")
_listings: list[list[str]] = []  # the open counters: an audit hook cannot be removed


def _audit(event: str, args: tuple) -> None:
    if _listings and event in LISTING_EVENTS and args and args[0] is not None:
        for listing in _listings:
            listing.append(str(args[0]))


sys.addaudithook(_audit)


@contextmanager
def listings_of(folder: Path) -> Iterator[list[str]]:
    """The listings of `folder` made in the block."""
    seen: list[str] = []
    _listings.append(seen)
    found: list[str] = []
    try:
        yield found
    finally:
        _listings.remove(seen)
        found += [path for path in seen if Path(path) == folder]


def records(loop) -> list[str]:
    return [record.id for record in RecordStore(loop.state_dir).read_all()]


def test_a_full_records_folder_is_listed_once_a_process_not_at_every_write(loop):
    folder = loop.state_dir / RECORDS_DIR
    for n in range(3 * KEEP):
        loop.submission("1", f"s{n}", 0.5)

    for finished in (2 * KEEP, KEEP):  # two processes, each over the bound
        observer = Observer(loop.state_dir, "plan", records_keep=KEEP)
        with listings_of(folder) as listed:
            assert loop.run(["1"], max_assignments=finished, hooks=[observer]) == ExitCode.OK
        assert len(listed) == 1, f"{len(listed)} listings of the records folder"
        # The newest KEEP assignments' records, the oldest dropped first.
        handed_out = sorted(loop.ledger.handed_out, key=int)
        assert records(loop) == handed_out[-KEEP:]
        assert len(list(folder.glob("*.json"))) == KEEP
