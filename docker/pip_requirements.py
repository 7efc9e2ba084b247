"""Checks, in the image build, that the lock installed is the environment file's:

    python pip_requirements.py ENVIRONMENT_YML LOCK [--pip-installer]

Every `pip:` requirement of the environment file must be pinned in the lock at a version it
allows (a lock left behind by an edit of the environment file stops the build; `make lock`
writes it again). With --pip-installer (bases without conda), the conda dependencies other than
python and pip, which only micromamba installs, are listed on stderr, so that the build log shows
what the stand-in image leaves out. Runs after the lock is installed: PyYAML and packaging come
with it (requirements.txt).
"""

from __future__ import annotations

import re
import sys

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def locked(lock: str) -> dict[str, str]:
    pins = {}
    for line in lock.splitlines():
        match = PIN.match(line)
        if match:
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def main(env_path: str, lock_path: str, pip_installer: bool) -> int:
    with open(env_path, encoding="utf-8") as handle:
        spec = yaml.safe_load(handle) or {}
    with open(lock_path, encoding="utf-8") as handle:
        pins = locked(handle.read())
    problems = []
    for dependency in spec.get("dependencies", []):
        if isinstance(dependency, dict):
            for line in dependency.get("pip") or []:
                requirement = Requirement(line)
                version = pins.get(canonicalize_name(requirement.name))
                if version is None or not requirement.specifier.contains(version, prereleases=True):
                    problems.append(f"{line} (the lock has {version or 'none'})")
        elif pip_installer and str(dependency).split("=")[0].split(":")[-1].strip() not in (
            "python",
            "pip",
        ):
            print(f"pip installer: skipping conda-only dependency {dependency}", file=sys.stderr)
    if problems:
        print(
            f"the lock is not the environment file's: {'; '.join(problems)}; run `make lock`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], "--pip-installer" in sys.argv[3:]))
