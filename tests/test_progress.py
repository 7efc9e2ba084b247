"""Progress lines for long work, rate-limited, and the heartbeat they give /healthz."""

from __future__ import annotations

import logging
import time

from validator.kit.progress import watch_bytes
from validator.scope import Progress
from validator.state.phases import ScoringMarks


def test_progress_lines_are_rate_limited_and_beat_the_heart(tmp_path, caplog):
    beats = []
    caplog.set_level(logging.INFO, "validator.scope")
    with ScoringMarks(tmp_path).scoring("7", on_beat=lambda: beats.append(1)):
        quiet = Progress("scoring", total=10, unit="conversations", every=3600)
        for _ in range(10):
            quiet.advance()
        assert caplog.records == [] and beats == []
        chatty = Progress("scoring", total=4, unit="conversations", every=0)
        chatty.advance(2)
    assert len(beats) == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("scoring: 2 of 4 (50%) conversations in ")


def test_a_download_reports_the_bytes_that_arrived(tmp_path, caplog):
    caplog.set_level(logging.INFO, "validator.kit.progress")
    folder = tmp_path / "models--org--base" / "blobs"
    with watch_bytes(tmp_path / "models--org--base", "downloading base model org/base", 0.2):
        folder.mkdir(parents=True)
        (folder / "shard.incomplete").write_bytes(b"x" * 3 * 2**20)
        time.sleep(1.5)  # several 0.2 s periods, with room for a loaded machine
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("downloading base model org/base: 3.0 MiB so far") for line in lines)


def test_a_download_of_known_size_reports_each_tenth_with_the_time_left(tmp_path, caplog):
    caplog.set_level(logging.INFO, "validator.kit.progress")
    folder = tmp_path / "models--org--base"
    (folder / "blobs").mkdir(parents=True)
    # In the cache before the download: not counted.
    (folder / "blobs" / "older-revision").write_bytes(b"x" * 2**20)
    with watch_bytes(folder, "downloading base model org/base", every=3600, total=10 * 2**20):
        (folder / "blobs" / "shard.incomplete").write_bytes(b"x" * 3 * 2**20)
        # A line comes at the next look (LOOK_SECONDS) although `every` is an hour away: a tenth
        # arrived. Bounded wait for it, never a timing assertion.
        deadline = time.monotonic() + 30
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.1)
    line = caplog.records[0].getMessage()
    assert line.startswith("downloading base model org/base: 3.0 of 10.0 MiB (30%) in ")
    assert line.endswith(" s left")
