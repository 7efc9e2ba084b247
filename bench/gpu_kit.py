"""Wheels that let the lora bench's GPU mode run on a lent GPU machine, which has no network.

Those machines come with a CUDA build of torch (and numpy, safetensors, requests, ...) but not
with the scoring stack's pinned versions, nor pydantic. This downloads, with no dependencies,
the wheels of exactly the versions installed in this venv, for the machine's Python, into
bench/gpu-kit/ (git-ignored; carry it to the machine, then run bench/gpu_session.sh there).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

KIT = Path(__file__).resolve().parent / "gpu-kit"
# The lora stack minus torch and safetensors (there already, CUDA build), bitsandbytes (the
# bench does not quantize; its wheel alone would fill the 64 MiB a run may carry), and what
# the validator's module API imports.
PACKAGES = (
    "transformers",
    "tokenizers",
    "huggingface-hub",
    "peft",
    "accelerate",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's python3")
    args = parser.parse_args(argv)
    pins = [f"{name}=={version(name)}" for name in PACKAGES]
    KIT.mkdir(exist_ok=True)
    for stale in KIT.glob("*.whl"):
        stale.unlink()
    platforms = [option for platform in PLATFORMS for option in ("--platform", platform)]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        args.python_version,
        *platforms,
        "--dest",
        str(KIT),
        *pins,
    ]
    subprocess.run(command, check=True)
    wheels = sorted(KIT.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {size / 1024**2:.1f} MiB in {KIT}: {' '.join(pins)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
