"""Assignment work folders: removed after each assignment, and swept at start-up when a killed
process left them, but never while their process lives."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from validator.kit.workdirs import LOCK_NAME, ROOT_NAME, UNLOCKED_GRACE_SECONDS, WorkArea, sweep

REPO = Path(__file__).resolve().parents[1]

# A validator process: takes a work folder, writes a download into it, says where, then waits.
HOLDER = textwrap.dedent(
    """
    import sys, time
    from validator.kit.workdirs import WorkArea
    folder = WorkArea("lora", sys.argv[1]).new()
    (folder / "adapter_model.safetensors").write_bytes(b"x" * 1024)
    print(folder, flush=True)
    time.sleep(600)
    """
)


def start_holder(parent: Path) -> tuple[subprocess.Popen, Path]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(parent)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout is not None
    return process, Path(process.stdout.readline().strip())


def test_a_folder_is_removed_after_its_assignment(tmp_path):
    area = WorkArea("rl", str(tmp_path))
    first = area.new()
    (first / "policy.onnx").write_bytes(b"x")
    second = area.new()  # the previous assignment's folder goes first
    assert not first.exists() and second.exists()
    assert second.parent == tmp_path / ROOT_NAME and second.name.startswith("rl-")
    area.clean()
    assert not second.exists()
    assert list((tmp_path / ROOT_NAME).iterdir()) == []


def test_a_killed_process_leaves_a_folder_that_the_next_start_sweeps(tmp_path):
    process, left = start_holder(tmp_path)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    assert (left / "adapter_model.safetensors").exists()
    WorkArea("lora", str(tmp_path))
    assert not left.exists()


def test_a_live_process_keeps_its_folder(tmp_path):
    process, held = start_holder(tmp_path)
    try:
        WorkArea("lora", str(tmp_path))  # a second validator on the same work root starts
        assert (held / "adapter_model.safetensors").exists()
    finally:
        process.kill()
        process.wait(timeout=10)
    assert sweep(tmp_path / ROOT_NAME) == 1
    assert not held.exists()


def test_a_folder_without_its_lock_is_swept_only_once_it_is_old(tmp_path):
    root = tmp_path / ROOT_NAME
    young, old = root / "lora-young", root / "lora-old"
    for folder in (young, old):
        folder.mkdir(parents=True)
    stale = time.time() - UNLOCKED_GRACE_SECONDS - 5
    os.utime(old, (stale, stale))
    assert sweep(root) == 1
    assert young.exists() and not old.exists()
    assert not (young / LOCK_NAME).exists()


def test_a_folder_removed_by_another_process_during_a_sweep_is_passed_over(tmp_path, monkeypatch):
    # Two validators sharing the temp dir sweep it at their starts: a folder the other one
    # removed between this sweep's listing and its look is gone, not a crash.
    from validator.kit import workdirs

    root = tmp_path / ROOT_NAME
    gone, left = root / "lora-gone", root / "lora-left"
    for folder in (gone, left):
        folder.mkdir(parents=True)
        old = time.time() - UNLOCKED_GRACE_SECONDS - 10
        os.utime(folder, (old, old))
    look = workdirs._claim

    def removed_meanwhile(folder: Path) -> int | None:
        if folder == gone:
            folder.rmdir()
        return look(folder)

    monkeypatch.setattr(workdirs, "_claim", removed_meanwhile)
    assert sweep(root) == 1
    assert not left.exists()


def test_a_folder_removed_while_its_strays_are_looked_for_is_passed_over(tmp_path, monkeypatch):
    from validator.kit import workdirs

    root = tmp_path / ROOT_NAME
    gone, left = root / "lora-gone", root / "lora-left"
    for folder in (gone, left):
        (folder / "adapter").mkdir(parents=True)
        (folder / LOCK_NAME).touch()
    look = workdirs.kill_strays

    def removed_meanwhile(folder: Path) -> int:
        if folder == gone:
            shutil.rmtree(folder / "adapter")
            (folder / "adapter").stat()  # what a scan of the removed folder meets
        return look(folder)

    monkeypatch.setattr(workdirs, "kill_strays", removed_meanwhile)
    assert sweep(root) == 1
    assert not left.exists()


def test_a_folder_another_sweep_is_removing_is_left_to_it(tmp_path):
    from validator.kit import workdirs

    root = tmp_path / ROOT_NAME
    folder = root / "lora-abandoned"
    folder.mkdir(parents=True)
    (folder / LOCK_NAME).touch()
    held = workdirs._claim(folder)
    assert held is not None and held >= 0
    try:
        assert sweep(root) == 0
        assert folder.exists()
    finally:
        os.close(held)
    assert sweep(root) == 1
    assert not folder.exists()
