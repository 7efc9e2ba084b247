"""The host's NVIDIA driver against the CUDA a module's GPU libraries need.

A module's spec says the CUDA of its libraries (`cuda:` in module.yaml, e.g. 13.0 for torch
2.13.0's wheels); NVIDIA's compatibility table says which driver runs it (a driver runs every
CUDA release of its major version from the minimum below: minor version compatibility). A host
with an older driver starts the container and fails in the first CUDA call, after the image
was built; run.py stops before that in one line, and the doctor has a row for it.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from validator.spec import ModuleSpec

# CUDA major version -> the oldest Linux driver that runs it (NVIDIA's CUDA Toolkit release
# notes, "CUDA Driver" table: the minor-version-compatibility minimum of each major).
DRIVER_FLOOR = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580, 65, 6)}
DRIVER_QUERY = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
QUERY_TIMEOUT = 20
_VERSION = re.compile(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?")


@dataclass(frozen=True)
class DriverVerdict:
    """ok: the driver runs the module's CUDA (or nothing is needed); `line` says what was found,
    and for a failure what to do; `known` False: the driver could not be read here."""

    ok: bool
    line: str
    known: bool = True


def needed_driver(cuda: str) -> tuple[int, int, int] | None:
    """The oldest driver for CUDA `cuda` (e.g. "13.0"), None for a major not in the table."""
    return DRIVER_FLOOR.get(int(cuda.split(".")[0]))


def driver_version(text: str) -> tuple[int, int, int] | None:
    """nvidia-smi's driver_version (one line per GPU, the same driver): 580.65.06 -> a tuple."""
    for line in text.strip().splitlines():
        match = _VERSION.fullmatch(line.strip())
        if match:
            return tuple(int(part or 0) for part in match.groups())  # type: ignore[return-value]
    return None


def read_driver() -> tuple[tuple[int, int, int] | None, str]:
    """The host's driver version by nvidia-smi, or None and why it could not be read."""
    try:
        done = subprocess.run(DRIVER_QUERY, capture_output=True, text=True, timeout=QUERY_TIMEOUT)
    except FileNotFoundError:
        return None, "nvidia-smi not found on this host"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi did not answer ({type(exc).__name__})"
    version = driver_version(done.stdout) if done.returncode == 0 else None
    if version is None:
        said = (done.stderr or done.stdout).strip().splitlines()
        return None, f"nvidia-smi: {said[-1][:160] if said else f'exit {done.returncode}'}"
    return version, ""


def check_driver(spec: ModuleSpec) -> DriverVerdict:
    """The host's driver against what `spec.cuda` needs."""
    floor = needed_driver(spec.cuda) if spec.cuda else None
    if not spec.gpu or floor is None:
        return DriverVerdict(True, f"not needed: {spec.name} names no CUDA version")
    need = f"{spec.name}'s CUDA {spec.cuda} needs driver R{floor[0]} ({_text(floor)}) or newer"
    version, why = read_driver()
    if version is None:
        return DriverVerdict(False, f"{why}: {need}", known=False)
    if version < floor:
        return DriverVerdict(
            False,
            f"NVIDIA driver {_text(version)}: {need} -> upgrade the driver (R{floor[0]} or "
            "newer), or run without GPUs: --gpus none",
        )
    return DriverVerdict(True, f"NVIDIA driver {_text(version)} ({need})")


def _text(version: tuple[int, int, int]) -> str:
    major, minor, patch = version
    return f"{major}.{minor}.{patch:02d}"  # as nvidia-smi writes it: 580.65.06
