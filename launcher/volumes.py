"""One name per worker's journal, and the journals of the names before it.

run.py, compose.gpus.yaml and Kubernetes name worker K's journal after K, the shard it validates
(launcher/containers.py `worker_state_volume`): `flock-validator-MODULE-state` for worker 0
(the one-container volume), `...-state-K` after it; a StatefulSet's pod K has its claim. Until
issue 39, compose.gpus.yaml named them after their GPU (`flock-validator-MODULE-gpu<ID>-state`),
so that an operator who moved between the two started on an empty journal and the results not
yet submitted stayed in a volume nothing read.

At start, run.py moves each such volume's journal into the volume of a worker of this run, in
the order of their GPU ids, when that worker's volume holds no journal yet: copied, checked
file by file, then the old volume removed; the worker then finishes and submits what it held,
as it does for its own journal. A start that cannot move one (its containers still run, the
target holds a journal of its own, fewer workers than old volumes) stops in one line saying
what to do, and nothing is lost. The doctor lists the ones still there.
"""

from __future__ import annotations

import re

import docker
from docker.errors import ContainerError, DockerException

from launcher.errors import LaunchError
from launcher.fleet import Worker
from launcher.supervisor import say
from validator.errors import ExitCode
from validator.spec import STATE_PATH

OLD_SOURCE = "/data/earlier-state"
JOURNAL = "journal.sqlite3"
# Copies the old journal into the worker's (mounted where the image made /data/state, so that a
# new volume gets the image's owner), then checks every file arrived whole. Exit 5: the
# worker's volume holds a journal already, nothing copied.
MOVE_SCRIPT = f"""
import filecmp, shutil, sys
from pathlib import Path
source, target = Path({OLD_SOURCE!r}), Path({STATE_PATH!r})
if (target / {JOURNAL!r}).exists():
    sys.exit(5)
shutil.copytree(source, target, dirs_exist_ok=True)
files = [p.relative_to(source) for p in source.rglob("*") if p.is_file()]
same = all(filecmp.cmp(source / f, target / f, shallow=False) for f in files)
sys.exit(0 if same else 6)
"""


def old_volume_pattern(module: str) -> re.Pattern[str]:
    return re.compile(re.escape(f"flock-validator-{module}-gpu") + r"(.+)" + re.escape("-state"))


def old_volumes(client: docker.DockerClient, module: str) -> list[str]:
    """The journal volumes compose.gpus.yaml named after a GPU, in the order of their GPU ids
    (indexes first, by number): compose's worker K had the K-th GPU its host file listed."""
    pattern = old_volume_pattern(module)
    found = {}
    for volume in client.volumes.list(filters={"name": f"flock-validator-{module}-gpu"}):
        match = pattern.fullmatch(volume.name)
        if match:
            found[volume.name] = match.group(1)
    return sorted(found, key=lambda name: _gpu_order(found[name]))


def _gpu_order(gpu: str) -> tuple[int, int, str]:
    return (0, int(gpu), "") if gpu.isdigit() else (1, 0, gpu)


def adopt_old_volumes(
    client: docker.DockerClient, image: str, module: str, workers: list[Worker]
) -> None:
    """Moves each old-named journal into the volume of worker K of this run (K its place
    among them); LaunchError (exit 3) for one it cannot move, before any worker starts."""
    mounted = {worker.state_volume for worker in workers}  # given with --state-volume
    names = [name for name in old_volumes(client, module) if name not in mounted]
    if not names:
        return
    if len(names) > len(workers):
        raise LaunchError(
            f"{', '.join(names)} hold the journals of {len(names)} earlier workers "
            f"(compose.gpus.yaml's names before), and this run has {len(workers)}: run with "
            f"{len(names)} workers once (--gpus with {len(names)} ids), which moves them and "
            "submits what they hold",
            ExitCode.OPERATOR,
        )
    for name, worker in zip(names, workers, strict=False):
        _move(client, image, module, name, worker)


def _move(client: docker.DockerClient, image: str, module: str, name: str, worker: Worker) -> None:
    using = client.containers.list(all=True, filters={"volume": name})
    if using:
        raise LaunchError(
            f"{name} (compose.gpus.yaml's name before for a journal) is used by "
            f"{', '.join(c.name for c in using)}: stop and remove them first (docker compose "
            "-f compose.gpus.yaml down), then start again: run.py moves its journal",
            ExitCode.OPERATOR,
        )
    try:
        client.containers.run(
            image,
            ["-c", MOVE_SCRIPT],
            entrypoint=["/opt/conda/bin/python"],
            volumes={
                name: {"bind": OLD_SOURCE, "mode": "ro"},
                worker.state_volume: {"bind": STATE_PATH, "mode": "rw"},
            },
            network_mode="none",
            remove=True,
        )
    except ContainerError as exc:
        why = {
            5: f"{worker.state_volume} holds a journal of its own",
            6: "the copy differs from it",
        }.get(exc.exit_status, f"the copy failed: {exc}")
        raise LaunchError(
            f"{name} (compose.gpus.yaml's name before for worker {worker.index}'s journal) "
            f"could not be moved to {worker.state_volume}: {why}. Nothing was removed: run "
            f"`python run.py {module} --state-volume {name} ...` once to submit what it holds, "
            "then remove it",
            ExitCode.OPERATOR,
        ) from exc
    try:
        client.volumes.get(name).remove()
        gone = f"; {name} removed"
    except DockerException as exc:
        gone = f"; {name} could not be removed ({exc}): remove it by hand"
    say(
        f"worker {worker.index}: the journal of {name} (compose.gpus.yaml's name before) is "
        f"now in {worker.state_volume}, the one name run.py, Compose and Kubernetes give it; "
        f"what it held is finished and submitted by this worker{gone}"
    )
