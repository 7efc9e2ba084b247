"""The source hash of a module's image: a SHA-256 of its build arguments and of every file that
goes into it. One implementation for both sides: run.py names and reuses images by it
(launcher/engine/images.py loads this file), and the image build computes it again from the files it
was given (docker/Dockerfile), so that every image carries the hash of what it was built from,
whoever built it (run.py, Compose, the release workflow).

    python source_hash.py ROOT MODULE KEY=VALUE...   # prints the hash

Standard library only: it runs on the image's Python before anything else is installed.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path

# What goes into an image besides the module's own folder (see .dockerignore). Not wheels/ (the
# offline wheelhouse, read by the build's `env` stage only: where to get a package from, not
# what the image holds) nor devkit/ (never sent to a build).
SHARED_INPUTS = ("configs", "docker", "requirements.txt", "validator")
SKIPPED_PARTS = ("__pycache__",)


def input_files(root: Path, module: str) -> Iterator[Path]:
    """The files whose content the hash stands for: what the build copies into the image."""
    roots = [root / name for name in SHARED_INPUTS]
    roots.append(root / "modules" / module)
    for top in roots:
        paths = [top] if top.is_file() else sorted(top.rglob("*"))
        for path in paths:
            parts = path.relative_to(root).parts
            skipped = path.suffix == ".pyc" or any(part in SKIPPED_PARTS for part in parts)
            if path.is_file() and not skipped:
                yield path


def source_hash(root: Path, module: str, build_args: dict[str, str]) -> str:
    """Changes whenever anything that goes into the image, or a build argument, changes."""
    digest = hashlib.sha256()
    for key, value in sorted(build_args.items()):
        digest.update(f"arg {key}={value}\n".encode())
    for path in input_files(root, module):
        digest.update(f"file {path.relative_to(root).as_posix()}\n".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    root, module, *pairs = argv
    build_args = dict(pair.split("=", 1) for pair in pairs)
    print(source_hash(Path(root), module, build_args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
