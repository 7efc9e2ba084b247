"""Prints the `pip:` requirements of a conda environment.yml, one per line (pip installer mode).

Conda dependencies other than python and pip cannot be installed without conda; they are
reported on stderr so the build log shows what the stand-in image leaves out.
"""

import sys

import yaml


def main(path: str) -> None:
    with open(path, encoding="utf-8") as handle:
        spec = yaml.safe_load(handle) or {}
    for dependency in spec.get("dependencies", []):
        if isinstance(dependency, dict):
            for requirement in dependency.get("pip", []):
                print(requirement)
        elif str(dependency).split("=")[0].split(":")[-1].strip() not in ("python", "pip"):
            print(f"pip installer: skipping conda-only dependency {dependency}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1])
