"""One validator process per GPU on a many-GPU host: the plan of `run.py MODULE --gpus 0,1,2,3`.

Pure functions: the command line's fleet options -> the list of workers (container name, GPUs,
journal volume, status port, task share). `run.py --plan` prints it; the launcher starts one
supervised container per worker (launcher/engine/supervisor.py, launcher/fleet/run.py).

Decisions an operator relies on (docs/many-gpus.md):
- `--gpus all` / `none` (or no --gpus) is one worker, as before; a list of ids is one worker per
  id, or per `--gpus-per-worker K` ids; `--workers N` is N workers without a GPU.
- Worker 0 keeps the journal volume a one-container run always had (flock-validator-MODULE-state,
  or --state-volume), so an operator who goes from one GPU to four keeps its journal; worker K
  gets that name with `-K` appended.
- A worker's status port is the base port plus 10 per worker: the modules' own ports are
  neighbours (lora 9110, llm_judge 9111, rl 9112), so +1 would put lora's worker 1 on
  llm_judge's port.
- With at least as many task ids as workers, worker K validates shard K/N of them (the
  validator's --shard); with fewer, every worker looks up every task, and run.py warns that
  workers will sit idle (`idle_warning`).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from launcher.engine.containers import gpu_ids, state_volume_name, worker_state_volume
from launcher.errors import UsageError

PORT_STEP = 10
MAX_PORT = 65535
HTTP_PORT_OPTION = "--http-port"
SHARD_OPTION = "--shard"
_PORT_TEXT = re.compile(r"[0-9]{1,5}")  # matched whole


@dataclass(frozen=True)
class Worker:
    """One validator container of a fleet."""

    index: int
    name: str  # the container's name; also how the launcher's lines name the worker
    gpus: str  # all, none, or ids such as 0,1 (launcher.engine.containers.device_requests)
    state_volume: str  # its own journal: no other worker ever mounts it
    http_port: int | None  # its status page, /metrics and /healthz; None: not served
    shard: str | None  # "K/N" of the task ids (the validator's --shard); None: every task

    def inner_args(self) -> list[str]:
        """What this worker adds to the validator's arguments."""
        args: list[str] = []
        if self.shard is not None:
            args += [SHARD_OPTION, self.shard]
        if self.http_port is not None:
            args += [HTTP_PORT_OPTION, str(self.http_port)]
        return args

    def as_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class FleetOptions:
    """The command line's say on workers, as click parsed it."""

    module: str
    gpus: str | None  # --gpus as given; None: the spec's default
    module_gpu: bool  # the spec's `gpu:`, which picks the default
    gpus_per_worker: int | None
    workers: int | None
    state_volume: str | None  # --state-volume as given
    task_ids: str | None
    http_port: int | None  # --http-port taken from the validator's options, if given
    status_port: int | None  # the spec's status_port


def worker_name(module: str, state_volume: str | None, index: int) -> str:
    """Container names follow the journal: a custom --state-volume names its workers after it,
    so two launchers of one module, each with its own journal, never take each other's names."""
    prefix = state_volume if state_volume else f"flock-validator-{module}"
    return f"{prefix}-{index}"


def task_count(task_ids: str | None) -> int:
    return len([part for part in (task_ids or "").split(",") if part.strip()])


def gpu_groups(options: FleetOptions) -> list[str]:
    """Each worker's GPUs: raises UsageError for a list that cannot be shared out."""
    gpus = options.gpus or ("all" if options.module_gpu else "none")
    per_worker = options.gpus_per_worker
    if per_worker is not None and per_worker < 1:
        raise UsageError(f"--gpus-per-worker {per_worker}: give 1 or more")
    if gpus in ("all", "none"):
        if per_worker is not None:
            raise UsageError(f"--gpus-per-worker needs GPU ids (--gpus 0,1,2,3), not --gpus {gpus}")
        count = options.workers or 1
        if count > 1 and gpus == "all":
            raise UsageError(
                f"--workers {count} would give every worker all GPUs: list the GPU ids instead "
                "(--gpus 0,1,... is one worker per GPU), or use --gpus none for workers "
                "without a GPU"
            )
        return [gpus] * count
    ids = gpu_ids(gpus)
    if len(set(ids)) != len(ids):
        raise UsageError(f"--gpus {gpus!r} names a GPU twice; each GPU goes to one worker")
    per_worker = per_worker or 1
    if len(ids) % per_worker:
        raise UsageError(
            f"--gpus {gpus!r} has {len(ids)} GPUs, which do not divide into workers of "
            f"--gpus-per-worker {per_worker}"
        )
    groups = [",".join(ids[at : at + per_worker]) for at in range(0, len(ids), per_worker)]
    if options.workers is not None and options.workers != len(groups):
        raise UsageError(
            f"--workers {options.workers} does not match --gpus {gpus!r} with "
            f"{per_worker} GPU(s) per worker ({len(groups)} workers); leave --workers out"
        )
    return groups


def base_port(options: FleetOptions, count: int) -> int | None:
    """The first worker's status port: the one --http-port gives, or with several workers the
    module's own (one status page per worker is how an operator tells them apart); a single
    worker serves none unless asked, as before."""
    if options.http_port is not None:
        return options.http_port
    return options.status_port if count > 1 else None


def plan(options: FleetOptions) -> list[Worker]:
    """The workers this command line asks for; raises UsageError for options that do not fit."""
    groups = gpu_groups(options)
    count = len(groups)
    port = base_port(options, count)
    if port is not None and port and port + PORT_STEP * (count - 1) > MAX_PORT:
        raise UsageError(
            f"status ports {port} + {PORT_STEP} per worker run past {MAX_PORT} for {count} "
            f"workers; give a lower {HTTP_PORT_OPTION}"
        )
    # Fewer task ids than workers: a shard would be empty, so every worker takes them all.
    sharded = count > 1 and task_count(options.task_ids) >= count
    base_volume = options.state_volume or state_volume_name(options.module)
    return [
        Worker(
            index=index,
            name=worker_name(options.module, options.state_volume, index),
            gpus=gpus,
            state_volume=worker_state_volume(base_volume, index),
            # 0 asks for any free port, which every worker may ask for.
            http_port=None if port is None else (port + PORT_STEP * index if port else 0),
            shard=f"{index}/{count}" if sharded else None,
        )
        for index, gpus in enumerate(groups)
    ]


def idle_warning(workers: list[Worker], task_ids: str | None) -> str | None:
    """The warning for a fleet with more workers than task ids, or None: they get no shards,
    and under the Fed Ledger's one lookup per 3 minutes per key and task they race for the
    same assignments, so at most one worker per task has work."""
    count, tasks = len(workers), task_count(task_ids)
    if count <= 1 or not tasks or tasks >= count:
        return None
    ids = f"{tasks} task id{'s' if tasks > 1 else ''}"
    return (
        f"{count} workers share {ids}: each looks up every task and they race for the same "
        f"assignments, so at least {count - tasks} of them will sit idle; give at least "
        f"{count} task ids, or {tasks} worker{'s' if tasks > 1 else ''} (docs/many-gpus.md)"
    )


def take_http_port(passthrough: list[str]) -> tuple[int | None, list[str]]:
    """`--http-port P` (or `--http-port=P`) out of the validator's options, since each worker
    gets its own; the rest unchanged. Raises UsageError for a value that is not a port."""
    rest: list[str] = []
    port: str | None = None
    args = iter(passthrough)
    for arg in args:
        if arg == HTTP_PORT_OPTION:
            port = next(args, "")
        elif arg.startswith(HTTP_PORT_OPTION + "="):
            port = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if port is None:
        return None, rest
    if not _PORT_TEXT.fullmatch(port) or int(port) > MAX_PORT:
        raise UsageError(f"{HTTP_PORT_OPTION} {port!r}: give a port number (0: any free port)")
    return int(port), rest


def check_passthrough(passthrough: list[str], workers: list[Worker]) -> None:
    """The launcher shares the tasks out itself when there are several workers."""
    given = any(a == SHARD_OPTION or a.startswith(SHARD_OPTION + "=") for a in passthrough)
    if given and len(workers) > 1:
        raise UsageError(
            f"{SHARD_OPTION} is set per worker by run.py when it runs several; leave it out"
        )
