"""`python run.py <module> report [--json | --html FILE]`: the report of a module's journal,
made inside the module's image from its state volume (the journal's SQLite file is read where
it lives, never copied while the validator may be writing it)."""

from __future__ import annotations

import sys
from pathlib import Path

import docker
from docker.errors import ContainerError

from launcher.errors import LaunchError
from validator.errors import ExitCode
from validator.spec import STATE_PATH


def run_report(client: docker.DockerClient, image: str, state_volume: str, args: list[str]) -> int:
    """Prints the report (text or JSON), or writes the HTML page to the file `--html` names."""
    html_file: Path | None = None
    inner = ["report", "--state-dir", STATE_PATH]
    rest = list(args)
    if "--html" in rest:
        at = rest.index("--html")
        if at + 1 >= len(rest):
            raise LaunchError("report --html needs a file name", ExitCode.USAGE)
        html_file = Path(rest[at + 1])
        rest[at : at + 2] = ["--html", "-"]  # the page comes back on stdout
    try:
        output = client.containers.run(
            image,
            command=[*inner, *rest],
            volumes={state_volume: {"bind": STATE_PATH, "mode": "rw"}},
            network_mode="none",
            remove=True,
            stdout=True,
            stderr=False,
        )
    except ContainerError as exc:
        detail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        raise LaunchError(
            f"the report failed: {detail[-1] if detail else exc}", ExitCode.OPERATOR
        ) from exc
    if html_file is None:
        sys.stdout.write(output.decode())
        return ExitCode.OK
    html_file.write_bytes(output)
    print(f"wrote {html_file}", file=sys.stderr)
    return ExitCode.OK
