"""`compose.yaml`, `compose.cpu.yaml` and `compose.gpus.yaml`, written from the module specs
(`python run.py compose`, `make compose`; the services are rendered by compose_services.py and
compose_gpus.py).

One service `validator-<name>` per module with a spec file; a test checks that the committed
files equal what this writes, so a spec change cannot leave Compose behind.
"""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.deploy.compose_gpus import GPUS_FILE, HOSTS_FILE, load_hosts, render_gpus
from launcher.deploy.compose_services import (
    COMPOSE_FILE,
    CPU_OVERRIDE_FILE,
    render,
    specs_with_files,
)
from validator.errors import ConfigError, ExitCode


def write_compose(repo: Path, check: bool, hosts: Path | None, gpus_output: Path | None) -> int:
    """Writes the files (with `check`: exit 1 naming each that is stale, writing none); a host
    file that does not read is exit 2. `hosts`, another host's file, needs `gpus_output`."""
    specs = specs_with_files(repo)
    compose, cpu = render(specs)
    outputs = [(repo / COMPOSE_FILE, compose), (repo / CPU_OVERRIDE_FILE, cpu)]
    # A repository without a host file (a module author's scratch repo) has no per-GPU file.
    hosts_path = hosts or repo / HOSTS_FILE
    if hosts is not None or hosts_path.is_file():
        try:
            gpus = render_gpus(specs, load_hosts(hosts_path, specs))
        except (ConfigError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        outputs.append((gpus_output or repo / GPUS_FILE, gpus))
    stale = [path for path, text in outputs if not path.is_file() or path.read_text() != text]
    if check:
        for path in stale:
            print(
                f"{path.name} is not what the module specs say; run `make compose`", file=sys.stderr
            )
        return 1 if stale else 0
    for path, text in outputs:
        path.write_text(text)
    written = " and ".join(path.name for path, _ in outputs)
    print(f"wrote {written}: {', '.join(specs) or 'no modules'}")
    return 0
