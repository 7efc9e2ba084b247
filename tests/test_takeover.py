"""Which container a start may take over (launcher/engine/takeover.py): one whose run.py is known to
be gone, never one whose run.py is alive or cannot be told (another host, another pid namespace, an
earlier launcher's container without the label). The take-over itself, through run.py and the
engine: tests/faults/test_moves.py."""

from __future__ import annotations

from pathlib import Path

from launcher.engine.takeover import LABEL_OWNER, launcher_gone, owner_labels


def test_this_run_py_is_alive_and_one_that_ended_is_gone():
    mine = owner_labels()[LABEL_OWNER]
    boot, namespace, pid, started = mine.split("/")
    assert boot and namespace.startswith("pid:") and started.isdigit()
    assert not launcher_gone(mine)
    # Its pid used again by a process started later, or a pid no process can have.
    assert launcher_gone(f"{boot}/{namespace}/{pid}/{int(started) - 1}")
    beyond = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    assert launcher_gone(f"{boot}/{namespace}/{beyond}/{started}")


def test_a_run_py_that_cannot_be_told_is_never_taken_for_gone():
    boot, namespace, pid, _ = owner_labels()[LABEL_OWNER].split("/")
    for owner in (
        None,  # a container of a launcher before the label
        "",
        f"another-boot/{namespace}/{pid}/1",  # another host, or before a reboot
        f"{boot}/pid:[1]/{pid}/1",  # a run.py in another pid namespace (a container)
        f"{boot}/{namespace}/x/1",
        f"{boot}/{namespace}/{pid}/",
        "a/b/c",
    ):
        assert not launcher_gone(owner), owner
