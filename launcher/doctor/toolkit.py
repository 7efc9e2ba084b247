"""The host's NVIDIA Container Toolkit against the fixes of its container escapes: versions
before 1.17.8 let a container reach the host through the toolkit's hooks (CVE-2024-0132, fixed
in 1.16.2; CVE-2025-23359, 1.17.4; CVE-2025-23266, 1.17.8). The doctor reads the version of
each part the host has (the runtime Docker names in `docker info`, `nvidia-ctk`,
`nvidia-container-cli`; one package set, released together) and holds the oldest against 1.17.8.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from validator.doctor.rows import Row
from validator.spec import ModuleSpec

NAME = "NVIDIA Container Toolkit"
FIXED = (1, 17, 8)
CVES = "CVE-2024-0132, CVE-2025-23359, CVE-2025-23266"
UPGRADE = (
    "sudo apt-get update && sudo apt-get install --only-upgrade nvidia-container-toolkit "
    "(yum: sudo yum update nvidia-container-toolkit), then sudo systemctl restart docker"
)
QUERY_TIMEOUT = 10
# What each part prints for --version: `NVIDIA Container Runtime version 1.17.8`, `NVIDIA
# Container Toolkit CLI version 1.17.8`, `NVIDIA Container Runtime Hook version 1.17.8`;
# libnvidia-container's `cli-version: 1.17.8` (and `version: 1.0.7` before it named both).
_LINE = re.compile(
    r"^\s*(?:NVIDIA Container (?:Runtime(?: Hook)?|Toolkit CLI) version|cli-version:|"
    r"version:)\s*v?(\d+)\.(\d+)\.(\d+)([-~+][0-9A-Za-z.~+-]*)?\s*$",
    re.MULTILINE,
)
Version = tuple[int, int, int, int]  # the last: 0 for a pre-release (1.17.8-rc.1), else 1


@dataclass(frozen=True)
class Reading:
    command: str  # as run, e.g. `nvidia-ctk --version`
    version: Version | None
    said: str  # its first line, for a version that could not be read


def parse_version(output: str) -> Version | None:
    """The version a part of the toolkit printed for --version; None when it printed none."""
    match = _LINE.search(output)
    if match is None:
        return None
    major, minor, patch, suffix = match.groups()
    release = 0 if suffix and suffix[0] in "-~" and not suffix[1:].isdigit() else 1
    return int(major), int(minor), int(patch), release


def shown(version: Version) -> str:
    return ".".join(map(str, version[:3])) + ("" if version[3] else " (a pre-release)")


def read_parts(runtime_path: str | None) -> list[Reading]:
    """Each part of the toolkit on this host, read: the runtime Docker runs (`runtime_path`,
    from `docker info`; else the one on PATH), nvidia-ctk and nvidia-container-cli. A part
    that is not here is left out."""
    found, seen = [], set()
    for program in (
        runtime_path or "nvidia-container-runtime",
        "nvidia-ctk",
        "nvidia-container-cli",
    ):
        path = shutil.which(program)
        if path is None or path in seen:
            continue
        seen.add(path)
        command = f"{program} --version"
        try:
            done = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=QUERY_TIMEOUT
            )
            output = f"{done.stdout}\n{done.stderr}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            found.append(Reading(command, None, f"did not answer ({type(exc).__name__})"))
            continue
        first = next((line.strip() for line in output.splitlines() if line.strip()), "nothing")
        found.append(Reading(command, parse_version(output), first[:80]))
    return found


def toolkit_row(spec: ModuleSpec | None, runtime_path: str | None) -> Row:
    """The toolkit's row: failed before 1.17.8 for a module whose containers use a GPU (or for
    the host alone), a warning for a CPU module, whose containers never go through it."""
    readings = read_parts(runtime_path)
    known = [(r.command, r.version) for r in readings if r.version is not None]
    uses_gpu = spec is None or spec.gpu
    if known:
        where = ", ".join(f"{command}: {shown(version)}" for command, version in known)
        if min(version for _, version in known) >= (*FIXED, 1):
            return Row.ok(NAME, f"{where}: has the container escape fixes of 1.17.8")
        found = f"{where}: before 1.17.8, open to container escapes ({CVES})"
        if spec is not None and not uses_gpu:
            return Row.warning(NAME, f"{found}; {spec.name}'s containers do not use it", UPGRADE)
        return Row.failed(NAME, found, UPGRADE)
    if readings:
        said = "; ".join(f"`{r.command}` said {r.said!r}" for r in readings)
        return Row.warning(
            NAME, f"version unreadable: {said}", f"check it is 1.17.8 or newer; {UPGRADE}"
        )
    if spec is not None and not uses_gpu:
        return Row.ok(NAME, f"not found; not needed: {spec.name} runs on the CPU")
    return Row.warning(
        NAME,
        "no nvidia-container-runtime, nvidia-ctk or nvidia-container-cli on PATH: its version "
        "is unknown",
        "install the NVIDIA Container Toolkit 1.17.8 or newer (apt/yum nvidia-container-toolkit)",
    )
