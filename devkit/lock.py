"""`python -m devkit.lock` (`make lock`): the hash locks, written by uv's resolver.

- `requirements-host.lock`: the host's venv (`run.py`), from requirements-host.txt, for every
  platform and Python the project supports (a universal resolution, with markers);
- `modules/<name>/locks/<variant>.txt`: everything a module's image installs into /opt/conda
  (the `pip:` section of its environment file and requirements.txt, resolved together), for
  the image's platform: `production` (linux x86_64, the Python of its environment file, PyPI's
  torch: the CUDA build) and `cpu` (the stand-in base of CI: Debian 12's Python, torch's CPU
  build, found through pip's find-links).

Each lock's first lines hold a digest of its inputs; `--check` (offline) exits 1 naming the
locks whose inputs changed since they were written. The image build installs its lock with
`pip install --require-hashes` (docker/install-env.sh), so a package missing from it, or a file
whose hash differs, stops the build.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from devkit import FIXTURE_MODULES
from devkit.requirements import pip_requirements
from validator.errors import ConfigError
from validator.spec import REPO_ROOT, find_module_folders, load_spec

HOST_INPUT = "requirements-host.txt"
HOST_LOCK = "requirements-host.lock"
RUNTIME_INPUT = "requirements.txt"  # the orchestrator's, inside every image
LOCKS_DIR = "locks"
# The oldest Python the host's launcher supports (pyproject.toml's requires-python).
HOST_PYTHON = "3.10"
# Bumped when what a lock is made of changes, so that every lock reads as stale.
FORMAT = "1"
DIGEST_LINE = re.compile(r"^# inputs: sha256:([0-9a-f]{64})$", re.MULTILINE)
PYTHON_PIN = re.compile(r"^python\s*=\s*(\d+\.\d+)(\.\*)?$")
PINNED_TORCH = re.compile(r"^torch==([^+;\s]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class Variant:
    """The platform a module's image lock is resolved for."""

    name: str
    platform: str
    python: str | None  # None: the Python its environment file names
    what: str


VARIANTS = (
    # mambaorg/micromamba's CUDA base is Ubuntu 22.04 (glibc 2.35); micromamba installs the
    # Python the environment file names.
    Variant("production", "x86_64-manylinux_2_35", None, "the production image"),
    # local/base:bookworm (scripts/local-base-image.sh): Debian 12, glibc 2.36, Python 3.11.
    Variant("cpu", "x86_64-manylinux_2_36", "3.11", "the CPU image (CI's stand-in base)"),
)
VARIANT_NAMES = tuple(variant.name for variant in VARIANTS)


@dataclass(frozen=True)
class Lock:
    """One lock to write: its path, the inputs it is resolved from, and how."""

    path: Path
    title: str
    inputs: dict[str, str]  # file name in the resolver's folder -> its text
    sources: tuple[str, ...]  # the inputs given to the resolver (the others are -r'd by them)
    options: tuple[str, ...]
    find_links: bool = False  # torch's CPU build is found there, never PyPI's CUDA build

    def digest(self) -> str:
        hashed = hashlib.sha256(f"format {FORMAT}\n".encode())
        for option in self.options:
            hashed.update(f"option {option}\n".encode())
        for name, text in sorted(self.inputs.items()):
            hashed.update(f"input {name}\n".encode())
            hashed.update(hashlib.sha256(text.encode()).digest())
        return hashed.hexdigest()


def lock_path(folder: Path, variant: str) -> Path:
    return folder / LOCKS_DIR / f"{variant}.txt"


def environment_python(environment: Path) -> str:
    """`3.12` for an environment file whose dependencies name `python=3.12`."""
    document = yaml.safe_load(environment.read_text(encoding="utf-8")) or {}
    for dependency in document.get("dependencies") or []:
        match = PYTHON_PIN.match(str(dependency).replace(" ", ""))
        if match:
            return match.group(1)
    where = f"{environment.parent.name}/{environment.name}"
    raise ConfigError(f"modules/{where}: name the image's Python as `python=X.Y`")


def cpu_requirement(requirement: str) -> str:
    """torch's CPU build for the CPU image: `torch==2.13.0` -> `torch==2.13.0+cpu`."""
    match = PINNED_TORCH.match(requirement.strip())
    return f"torch=={match.group(1)}+cpu" if match else requirement


def module_locks(repo: Path, folder: Path) -> list[Lock]:
    spec = load_spec(folder)
    environment = folder / spec.environment
    runtime = (repo / RUNTIME_INPUT).read_text(encoding="utf-8")
    locks = []
    for variant in VARIANTS:
        pins = pip_requirements(environment)
        if variant.name == "cpu":
            pins = [cpu_requirement(pin) for pin in pins]
        python = variant.python or environment_python(environment)
        section = f"{spec.environment}-pip.txt"
        locks.append(
            Lock(
                lock_path(folder, variant.name),
                f"every package {variant.what} of {spec.name} installs (the `pip:` section of "
                f"its {spec.environment} and {RUNTIME_INPUT}); Python {python}, "
                f"{variant.platform}",
                {section: "".join(f"{pin}\n" for pin in pins), RUNTIME_INPUT: runtime},
                (section, RUNTIME_INPUT),
                ("--python-version", python, "--python-platform", variant.platform),
                find_links=variant.name == "cpu",
            )
        )
    return locks


def host_lock(repo: Path) -> Lock:
    inputs = {
        name: (repo / name).read_text(encoding="utf-8") for name in (HOST_INPUT, RUNTIME_INPUT)
    }
    return Lock(
        repo / HOST_LOCK,
        f"the host's venv (run.py), from {HOST_INPUT}; every platform, Python {HOST_PYTHON}+",
        inputs,
        (HOST_INPUT,),
        ("--universal", "--python-version", HOST_PYTHON),
    )


def module_folders(repo: Path) -> list[Path]:
    """The repo's modules, and the tests' fixture module where the repo has it."""
    folders = list(find_module_folders(repo).values())
    fixture = repo / FIXTURE_MODULES.relative_to(REPO_ROOT) / "modules" / "fixture"
    if fixture.is_dir():
        folders.append(fixture)
    return folders


def all_locks(repo: Path, only: str | None = None) -> list[Lock]:
    locks = [] if only else [host_lock(repo)]
    for folder in module_folders(repo):
        if only is None or folder.name == only:
            locks += module_locks(repo, folder)
    return locks


def written_digest(path: Path) -> str | None:
    if not path.is_file():
        return None
    match = DIGEST_LINE.search(path.read_text(encoding="utf-8")[:2000])
    return match.group(1) if match else None


def stale(locks: list[Lock]) -> list[Lock]:
    return [lock for lock in locks if written_digest(lock.path) != lock.digest()]


def uv_command() -> list[str]:
    """uv, from the venv's `uv` package (requirements-dev.txt) or the PATH."""
    try:
        from uv import find_uv_bin  # noqa: PLC0415 - a dev tool, only where it locks

        return [find_uv_bin()]
    except ImportError:
        found = shutil.which("uv")
        if found is None:
            raise ConfigError("uv is not installed: `make install` brings it") from None
        return [found]


def resolve(lock: Lock, find_links: list[str], upgrade: bool) -> str:
    """The lock's text: uv's resolution of its inputs, every file's hash, under its header.
    The versions the lock holds are kept where the inputs allow them, unless `upgrade`."""
    with tempfile.TemporaryDirectory() as folder:
        for name, text in lock.inputs.items():
            (Path(folder) / name).write_text(text, encoding="utf-8")
        output = Path(folder) / "lock.txt"
        if lock.path.is_file() and not upgrade:  # uv prefers the versions of its output file
            shutil.copyfile(lock.path, output)
        command = [
            *uv_command(),
            "pip",
            "compile",
            "--quiet",
            "--generate-hashes",
            "--no-header",
            *lock.options,
            *(f"--find-links={where}" for where in (find_links if lock.find_links else [])),
            "--output-file",
            output.name,
            *lock.sources,
        ]
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise ConfigError(f"uv could not resolve {lock.path.name}: {done.stderr.strip()}")
        resolved = output.read_text(encoding="utf-8")
    header = (
        f"# Written by `make lock` (python -m devkit.lock); edit the inputs, not this file.\n"
        f"# {lock.title}.\n"
        f"# Installed with `pip install --require-hashes -r`: a file whose hash is not here is "
        f"refused.\n"
        f"# inputs: sha256:{lock.digest()}\n"
    )
    return header + resolved


def default_find_links() -> list[str]:
    """Where torch's CPU build is found (pip's own setting: PIP_FIND_LINKS, e.g. /opt/wheels)."""
    return [where for where in os.environ.get("PIP_FIND_LINKS", "").split() if where]


def write(locks: list[Lock], find_links: list[str], upgrade: bool = False) -> list[Path]:
    """Writes the stale locks (all of them, at the newest versions, with `upgrade`)."""
    changed = []
    for lock in locks if upgrade else stale(locks):
        text = resolve(lock, find_links, upgrade)
        lock.path.parent.mkdir(parents=True, exist_ok=True)
        if not lock.path.is_file() or lock.path.read_text(encoding="utf-8") != text:
            lock.path.write_text(text, encoding="utf-8")
            changed.append(lock.path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.lock",
        description="Write the hash locks of the host's venv and of each module's image.",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a lock is stale")
    parser.add_argument(
        "--upgrade", action="store_true", help="resolve every lock again (newer versions)"
    )
    parser.add_argument("--module", help="only this module's locks")
    parser.add_argument(
        "--find-links",
        action="append",
        default=None,
        metavar="DIR",
        help="where torch's CPU build is [default: pip's PIP_FIND_LINKS]",
    )
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        locks = all_locks(args.repo, args.module)
        if args.check:
            names = [str(lock.path.relative_to(args.repo)) for lock in stale(locks)]
            if names:
                print(
                    f"error: {', '.join(names)} not what their inputs say: run `make lock`",
                    file=sys.stderr,
                )
                return 1
            return 0
        find_links = args.find_links if args.find_links is not None else default_find_links()
        changed = write(locks, find_links, upgrade=args.upgrade)
    except (ConfigError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in changed:
        print(f"wrote {path.relative_to(args.repo)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
