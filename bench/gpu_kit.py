"""Wheels that let the GPU benches run on a lent GPU machine, which has no network.

Those machines come with a CUDA build of torch (and numpy, safetensors, requests, ...) but not
with the scoring stack's pinned versions, nor pydantic. This downloads, with no dependencies,
the wheels of exactly the versions installed in the running venv, for the machine's Python:
`--stack lora` (the default, from .venv) into bench/gpu-kit/ for bench/gpu_session.sh;
`--stack llm_judge` (run from .venv-llm_judge) into bench/gpu-kit-llm_judge/ for
bench/gpu_session_llm_judge.sh: the llm_judge stack with fla-core and everything it needs
besides torch (and torch's own dependencies, Triton among them, which come with the machine's
CUDA build) and numpy. Both folders are git-ignored; carry them to the machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

KIT = Path(__file__).resolve().parent / "gpu-kit"
LLM_JUDGE_KIT = Path(__file__).resolve().parent / "gpu-kit-llm_judge"
# What the llm_judge benches import; their dependencies are followed from the installed
# metadata, as far as torch's own (the machine's CUDA build brings those) and numpy.
LLM_JUDGE_ROOTS = (
    "transformers",
    "tokenizers",
    "huggingface-hub",
    "peft",
    "accelerate",
    "safetensors",
    "openai",
    "pydantic",
    "Jinja2",
    "fla-core",
    "einops",
    "blake3",
)
# The lora stack minus torch and safetensors (there already, CUDA build), bitsandbytes (the
# bench does not quantize; its wheel alone would fill the 64 MiB a run may carry), and what
# the validator's module API imports (blake3: the kit's fingerprint).
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
    "blake3",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's python3")
    parser.add_argument("--stack", choices=["lora", "llm_judge"], default="lora")
    args = parser.parse_args(argv)
    if args.stack == "llm_judge":
        if not version("transformers").startswith("5."):
            print("error: --stack llm_judge runs in .venv-llm_judge (transformers 5)",
                  file=sys.stderr)  # fmt: skip
            return 2
        kit = LLM_JUDGE_KIT
        pins = [f"{n}=={v}" for n, v in sorted(_closure(LLM_JUDGE_ROOTS, skip=("torch",)).items())]
    else:
        kit = KIT
        pins = [f"{name}=={version(name)}" for name in PACKAGES]
    return _download(kit, pins, args.python_version)


def _closure(roots: tuple[str, ...], skip: tuple[str, ...]) -> dict[str, str]:
    """The installed distributions `roots` need (markers read for this interpreter, no
    extras), without those of `skip` and their own dependencies, nor numpy: name -> version."""
    excluded = set(_installed_deps(skip, set())) | {"numpy"}
    return _installed_deps(roots, excluded)


def _installed_deps(roots, excluded: set[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    todo = [canonicalize_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in found or name in excluded:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:  # an optional dependency this venv does not have
            continue
        found[name] = dist.version
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return found


def _download(kit: Path, pins: list[str], python_version: str) -> int:
    kit.mkdir(exist_ok=True)
    for stale in kit.glob("*.whl"):
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
        python_version,
        *platforms,
        "--dest",
        str(kit),
        *pins,
    ]
    subprocess.run(command, check=True)
    wheels = sorted(kit.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {size / 1024**2:.1f} MiB in {kit}: {' '.join(pins)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
