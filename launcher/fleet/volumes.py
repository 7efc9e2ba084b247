"""One name per worker's journal, and the journals of the names before it.

run.py, compose.gpus.yaml and Kubernetes name worker K's journal after K, the shard it validates
(launcher/engine/containers.py `worker_state_volume`): `flock-validator-MODULE-state` for worker 0
(the one-container volume), `...-state-K` after it; a StatefulSet's pod K has its claim. An
earlier compose.gpus.yaml named them after their GPU (`flock-validator-MODULE-gpu<ID>-state`),
so that an operator who moved between the two started on an empty journal and the results not
yet submitted stayed in a volume nothing read.

At start, run.py moves each such volume's journal into the volume of a worker of this run, in
the order of their GPU ids, in a container of the module's image (launcher/fleet/journal_move.py):
copied, opened by the validator's own journal checks, placed or merged by assignment id, and
only then the old volume removed, with one line saying what the worker will submit. A journal
that cannot be opened whole is never removed: its readable rows are moved, the volume kept,
and the line says which. A move cut short anywhere (the launcher or the host killed) finishes
on the next start: the move's container has a name and a label this module finds, and a move
done twice takes nothing twice. The doctor lists the volumes still there.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, NotFound

from launcher.engine.containers import LABEL_LAUNCHER
from launcher.engine.docker_errors import listed
from launcher.engine.fault_hook import kill_point, passed_on
from launcher.errors import LaunchError, say
from launcher.fleet import journal_move
from launcher.fleet.plan import Worker
from validator.errors import ExitCode
from validator.spec import STATE_PATH

OLD_SOURCE = "/data/earlier-state"
# The move's container: named after the old volume, so that a start finds one an earlier start
# left running (its launcher killed), and removed by the engine once it ends.
MOVE_LABEL = "org.flock-validator.move"
SCRIPT = Path(journal_move.__file__).read_text(encoding="utf-8")
PYTHON = "/opt/conda/bin/python"


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


def move_container_name(old: str) -> str:
    return f"{old}-move"


def _move(client: docker.DockerClient, image: str, module: str, name: str, worker: Worker) -> None:
    _end_earlier_moves(client, name)
    using = [c for c in listed(client, {"volume": name}) if MOVE_LABEL not in c.labels]
    if using:
        raise LaunchError(
            f"{name} (compose.gpus.yaml's name before for a journal) is used by "
            f"{', '.join(c.name or c.short_id for c in using)}: stop and remove them first "
            "(docker compose -f compose.gpus.yaml down), then start again: run.py moves its "
            "journal",
            ExitCode.OPERATOR,
        )
    outcome = _run_move(client, image, module, name, worker)
    kill_point("move:done")
    where = f"worker {worker.index}: the journal of {name} (compose.gpus.yaml's name before)"
    if outcome.problem is not None:
        say(_kept_line(where, name, worker.state_volume, outcome))
        return
    try:
        client.volumes.get(name).remove()
        gone = f"{name} removed"
    except DockerException as exc:
        gone = f"{name} could not be removed ({exc}): the next start removes it"
    kill_point("move:removed")
    if outcome.outcome == "finished":
        say(f"{where} was moved into {worker.state_volume} by an earlier start; {gone}")
        return
    how = "merged by assignment into the journal" if outcome.outcome == "merged" else "now"
    say(
        f"{where} is {how} in {worker.state_volume}, the one name run.py, Compose and "
        f"Kubernetes give it, and opens whole: {_backlog(outcome)} by this worker; {gone}"
    )


def _backlog(outcome: journal_move.Outcome) -> str:
    return (
        f"{outcome.to_submit} results to submit and {outcome.to_score} assignments to score "
        "there, each submitted once"
    )


def _kept_line(where: str, name: str, target: str, outcome: journal_move.Outcome) -> str:
    moved = "were moved by an earlier start" if outcome.outcome == "finished" else "are moved"
    what = "" if outcome.outcome == "finished" else f" ({_backlog(outcome)})"
    return (
        f"{where} cannot be opened whole ({outcome.problem}): its {outcome.rows} readable rows "
        f"{moved} into {target}{what}; the rest stays in volume {name} ({journal_move.JOURNAL}), "
        f"which is kept: repair it with sqlite3 and start again to move what it then holds, or "
        f"remove it (docker volume rm {name}) once nothing in it is wanted"
    )


def _end_earlier_moves(client: docker.DockerClient, name: str) -> None:
    """A move of `name` an earlier start left (its launcher killed while it ran) is ended:
    the move done again takes nothing twice."""
    for container in _moves_of(client, name):
        try:
            container.remove(force=True)
        except NotFound:
            pass  # ended and removed by the engine meanwhile
        except APIError as exc:
            if exc.status_code != 409:  # 409: the engine is removing it already
                raise
    _until_removed(client, name)


def _moves_of(client: docker.DockerClient, name: str) -> list:
    return listed(client, {"label": f"{MOVE_LABEL}={name}"})


def _until_removed(client: docker.DockerClient, name: str) -> None:
    """Until the engine has removed the moves of `name` that ended (10 s at most)."""
    for _ in range(100):
        if not _moves_of(client, name):
            return
        time.sleep(0.1)
    raise LaunchError(
        f"the container of a move of {name} is still there after 10 s: remove it (docker rm "
        f"-f {move_container_name(name)}), then start again; the move takes nothing twice",
        ExitCode.OPERATOR,
    )


def _run_move(
    client: docker.DockerClient, image: str, module: str, name: str, worker: Worker
) -> journal_move.Outcome:
    """The move, in a container of the module's image: its one JSON line, or LaunchError."""
    container = client.containers.create(
        image,
        ["-c", SCRIPT, OLD_SOURCE, STATE_PATH, name, module],
        entrypoint=[PYTHON],
        name=move_container_name(name),
        labels={LABEL_LAUNCHER: "run.py", MOVE_LABEL: name},
        volumes={
            name: {"bind": OLD_SOURCE, "mode": "ro"},
            worker.state_volume: {"bind": STATE_PATH, "mode": "rw"},
        },
        environment=passed_on(),
        network_mode="none",
        auto_remove=True,
    )
    stream = container.attach(stream=True, logs=True, demux=True)
    container.start()
    kill_point("move:started")
    out, err = b"", b""
    for chunk, error in stream:
        out, err = out + (chunk or b""), err + (error or b"")
    _until_removed(client, name)  # the engine's, after it ended: it holds the old volume till then
    answer = _answer(out)
    if answer is not None and answer.outcome != "failed":
        return answer
    why = answer.problem if answer is not None else _last_line(err) or "it ended without a word"
    raise LaunchError(
        f"{name} (compose.gpus.yaml's name before for worker {worker.index}'s journal) "
        f"could not be moved to {worker.state_volume}: {why}. Nothing was removed and nothing "
        "is taken twice: start again to finish the move",
        ExitCode.OPERATOR,
    )


def _answer(out: bytes) -> journal_move.Outcome | None:
    try:
        found = json.loads(_last_line(out))
        return journal_move.Outcome(**found)
    except (ValueError, TypeError):
        return None


def _last_line(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else ""
