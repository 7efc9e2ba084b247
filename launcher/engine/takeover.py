"""A validator whose run.py died (kill -9, a crash) is taken over by the next start of it.

Each container the supervisor creates carries the process that supervises it (a label: the
host's boot, its pid namespace, its pid and when that process started). A start that finds its
worker's name taken by a container whose run.py is known to be gone (the same boot and pid
namespace, and no process of that pid started then) stops it as an operator's stop does, with
one line: SIGTERM, so that it finishes and submits the assignment in progress, killed after the
module's grace; then removes it and starts its own. Only then is the name free, so two
validators never run on one journal (and the validator's own lock on its state dir holds that
too). A container whose run.py is alive, or that cannot be told (another host, an earlier
launcher's container without the label), is left to the supervisor's refusal.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import docker
from docker.errors import APIError, NotFound
from docker.models.containers import Container

from launcher.engine.containers import LABEL_LAUNCHER

LABEL_OWNER = "org.flock-validator.launcher-process"


def owner_labels() -> dict[str, str]:
    """The label naming this process, for each container it supervises."""
    pid = os.getpid()
    return {LABEL_OWNER: "/".join([_boot_id(), _pid_namespace(), str(pid), _started(pid)])}


def launcher_gone(owner: str | None) -> bool:
    """Whether the run.py a container's label names is known to have ended. False when it
    cannot be told: no label, another host or boot, another pid namespace, no /proc."""
    parts = (owner or "").split("/")
    if len(parts) != 4 or not parts[1] or not parts[2].isdigit():
        return False
    boot, namespace, pid, started = parts
    if boot != _boot_id() or namespace != _pid_namespace() or not started:
        return False
    return _started(int(pid)) != started


def take_over(
    client: docker.DockerClient,
    names: list[str],
    stop_timeout: float,
    tell: Callable[[str], None],
) -> None:
    """Stops and removes, side by side, each container of `names` that a run.py left when it
    died, `tell`ing one line for each still running: its worker starts again under this run's
    supervision."""
    left = []
    for name in names:
        try:
            found = client.containers.get(name)
        except NotFound:
            continue
        owner = found.labels.get(LABEL_OWNER)
        if found.labels.get(LABEL_LAUNCHER) != "run.py" or not owner or not launcher_gone(owner):
            continue
        left.append(found)
        if found.status == "running":
            tell(
                f"{name}: a validator left running by a run.py that ended without stopping "
                f"it (pid {owner.split('/')[2]}): stopping it as a stop does (it finishes "
                "and submits the assignment in progress), then starting this run's"
            )
    threads = [
        threading.Thread(target=_stop_and_remove, args=(c, stop_timeout), daemon=True) for c in left
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _stop_and_remove(container: Container, stop_timeout: float) -> None:
    try:
        container.stop(timeout=stop_timeout)
        container.remove(force=True)
    except (NotFound, APIError):
        pass  # gone already, or being removed: the supervisor's create says if it is not


def _boot_id() -> str:
    return _read("/proc/sys/kernel/random/boot_id")


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _started(pid: int) -> str:
    """When process `pid` started, in clock ticks after boot ('' when there is none): a pid
    used again by another process has another start."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split()  # after the command's name, which may hold spaces
    return fields[19] if len(fields) > 19 else ""


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""
