"""`python run.py report <module> [--json | --html FILE] [--worker K]`: the report of a module's
journal, made inside the module's image from its state volume (the journal's SQLite file is read
where it lives, never copied while the validator may be writing it). A fleet's workers each
have their own volume (launcher/fleet/plan.py): the report adds them up, with a line per worker."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import docker
from docker.errors import ContainerError

from launcher.engine.containers import worker_state_volume
from launcher.errors import LaunchError, say
from launcher.fleet.totals import FleetSummary, WorkerSummary, add_up, render_fleet
from validator.errors import ExitCode
from validator.report.summary import Summary
from validator.spec import STATE_PATH


def run_report(client: docker.DockerClient, image: str, state_volume: str, args: list[str]) -> int:
    """Prints the report (text or JSON), or writes the HTML page to the file `--html` names."""
    html_file: Path | None = None
    rest = list(args)
    if "--html" in rest:
        at = rest.index("--html")
        if at + 1 >= len(rest):
            raise LaunchError("report --html needs a file name", ExitCode.USAGE)
        html_file = Path(rest[at + 1])
        rest[at : at + 2] = ["--html", "-"]  # the page comes back on stdout
    output = report_output(client, image, state_volume, rest)
    if html_file is None:
        sys.stdout.write(output.decode())
        return ExitCode.OK
    html_file.write_bytes(output)
    print(f"wrote {html_file}", file=sys.stderr)
    return ExitCode.OK


def report_output(
    client: docker.DockerClient, image: str, state_volume: str, args: list[str]
) -> bytes:
    """What `python -m validator report` prints over one journal volume."""
    try:
        return client.containers.run(
            image,
            # The report names the volume, not the path it is mounted at in the container.
            command=[
                "report",
                "--state-dir",
                STATE_PATH,
                "--source",
                f"volume {state_volume}",
                *args,
            ],
            volumes={state_volume: {"bind": STATE_PATH, "mode": "rw"}},
            network_mode="none",
            remove=True,
            stdout=True,
            stderr=False,
        )
    except ContainerError as exc:
        # The SDK's is the container's log, bytes; its stubs say str.
        said = exc.stderr or b""
        text = said.decode(errors="replace") if isinstance(said, bytes) else said
        detail = text.strip().splitlines()
        raise LaunchError(
            f"the report of {state_volume} failed: {detail[-1] if detail else exc}",
            ExitCode.OPERATOR,
        ) from exc


def worker_volumes(
    client: docker.DockerClient, base: str, worker: int | None
) -> list[tuple[int, str]]:
    """(worker index, journal volume) of every worker whose volume exists (launcher/fleet/plan.py
    names them `base`, `base-1`, ...), or of the one `--worker` names. A host that never ran a
    fleet has worker 0's only, which is the one-container report as before."""
    if worker is not None:
        volume = worker_state_volume(base, worker)
        if worker > 0 and not client.volumes.list(filters={"name": volume}):
            raise LaunchError(f"--worker {worker}: no journal volume {volume}", ExitCode.USAGE)
        return [(worker, volume)]
    pattern = re.compile(re.escape(base) + r"(?:-(\d+))?")
    found: dict[int, str] = {}
    for listed in client.volumes.list(filters={"name": base}):
        match = pattern.fullmatch(listed.name)
        if match:
            found[int(match.group(1) or 0)] = listed.name
    found.setdefault(0, base)  # as before: its absence is the inner report's one line
    if set(found) - {0} and len(found) < max(found) + 1:
        say(f"note: workers {sorted(set(range(max(found) + 1)) - set(found))} have no journal")
    return sorted(found.items())


def run_reports(
    client: docker.DockerClient, image: str, volumes: list[tuple[int, str]], args: list[str]
) -> int:
    """One journal: its report as before. Several (a fleet): the totals and a line per worker,
    as text, or with `--json` one object {"totals", "workers"}."""
    if len(volumes) == 1:
        return run_report(client, image, volumes[0][1], args)
    if "--html" in args:
        raise LaunchError(
            f"report --html draws one journal; this host has {len(volumes)} workers: add "
            "--worker K",
            ExitCode.USAGE,
        )
    rest = [arg for arg in args if arg != "--json"]
    workers = [
        WorkerSummary(
            worker=index,
            state_volume=volume,
            summary=Summary.model_validate_json(
                report_output(client, image, volume, [*rest, "--json"])
            ),
        )
        for index, volume in volumes
    ]
    fleet = FleetSummary(totals=add_up([w.summary for w in workers]), workers=workers)
    if "--json" in args:
        print(fleet.model_dump_json(indent=2))
    else:
        sys.stdout.write(render_fleet(fleet))
    return ExitCode.OK
