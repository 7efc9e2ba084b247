"""`compose.yaml`, `compose.cpu.yaml` and `compose.gpus.yaml`, written from the module specs
(`make compose`; the services are rendered by compose_services.py and compose_gpus.py).

One service `validator-<name>` per module with a spec file; a test checks that the committed
files equal what this writes, so a spec change cannot leave Compose behind.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher.deploy.compose_gpus import GPUS_FILE, HOSTS_FILE, load_hosts, render_gpus
from launcher.deploy.compose_services import (
    COMPOSE_FILE,
    CPU_OVERRIDE_FILE,
    render,
    service,
    specs_with_files,
)
from validator.errors import ConfigError, ExitCode
from validator.spec import REPO_ROOT

__all__ = ["REPO_ROOT", "main", "render", "service", "specs_with_files"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write compose.yaml from the module specs.")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the files are stale")
    parser.add_argument(
        "--hosts",
        type=Path,
        help=f"host file: module -> its GPUs, one worker each [default: REPO/{HOSTS_FILE}]",
    )
    parser.add_argument(
        "--gpus-output",
        type=Path,
        help=f"the per-GPU Compose file to write [default: REPO/{GPUS_FILE}]",
    )
    args = parser.parse_args(argv)
    if args.hosts is not None and args.gpus_output is None:
        # Another host's file must not overwrite the committed example's output.
        parser.error("--hosts needs --gpus-output, e.g. compose.gpus.my-host.yaml")
    specs = specs_with_files(args.repo)
    compose, cpu = render(specs)
    outputs = [(args.repo / COMPOSE_FILE, compose), (args.repo / CPU_OVERRIDE_FILE, cpu)]
    # A repository without a host file (a module author's scratch repo) has no per-GPU file.
    hosts_path = args.hosts or args.repo / HOSTS_FILE
    if args.hosts is not None or hosts_path.is_file():
        try:
            gpus = render_gpus(specs, load_hosts(hosts_path, specs))
        except (ConfigError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        outputs.append((args.gpus_output or args.repo / GPUS_FILE, gpus))
    stale = [path for path, text in outputs if not path.is_file() or path.read_text() != text]
    if args.check:
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


if __name__ == "__main__":
    sys.exit(main())
