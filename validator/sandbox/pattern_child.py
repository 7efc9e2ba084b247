"""The bounded child of validator/kit/adapter_patterns.py: a standalone script (the standard
library only, nothing of the validator), started through validator/kit/boundary.py.

`python -I pattern_child.py REQUEST.json`: reads the adapter_config.json the request names and
runs every regular expression peft builds from it against every module name of the base, as
peft's versions do (target_modules and exclude_modules as one pattern, rank_pattern and
alpha_pattern keys, layers_pattern, modules_to_save), and writes {"patterns": n} when all of them
finished within the child's CPU limit, {"error": "..."} for a pattern that does not compile.
"""

from __future__ import annotations

import json
import re
import sys


def main(request_path: str) -> None:
    with open(request_path, encoding="utf-8") as handle:
        request = json.load(handle)
    with open(request["config"], encoding="utf-8") as handle:
        config = json.load(handle)
    names = [str(name) for name in request["names"]]
    answer: dict[str, int | str]
    try:
        answer = {"patterns": probe(config if isinstance(config, dict) else {}, names)}
    except re.error as exc:
        answer = {"error": f"a module pattern is not a regular expression: {exc}"[:300]}
    with open(request["result"], "w", encoding="utf-8") as handle:
        json.dump(answer, handle)


def probe(config: dict[str, object], names: list[str]) -> int:
    """Runs the matches peft runs; returns how many patterns there were."""
    full: list[str] = []
    partial: list[str] = []  # re.fullmatch(p, name) / re.match(p, name)
    for key in ("target_modules", "exclude_modules"):
        value = config.get(key)
        if isinstance(value, str):
            full.append(value)
    for key in ("rank_pattern", "alpha_pattern"):
        pattern_keys = config.get(key)
        for name in pattern_keys if isinstance(pattern_keys, dict) else ():
            partial += [rf".*\.{name}$", rf"(.*\.)?({name})$"]
    layers = config.get("layers_pattern")
    for name in (
        [layers] if isinstance(layers, str) else layers if isinstance(layers, list | dict) else ()
    ):
        if isinstance(name, str):
            partial.append(rf".*\.{name}\.(\d+)\.")
    saved = config.get("modules_to_save")
    for name in saved if isinstance(saved, list) else ():
        if isinstance(name, str):
            partial.append(rf"(^|.*\.){name}($|\..*)")
    compiled = [(re.compile(p), True) for p in full] + [(re.compile(p), False) for p in partial]
    for pattern, whole in compiled:
        for name in names:
            pattern.fullmatch(name) if whole else pattern.match(name)
    return len(compiled)


if __name__ == "__main__":
    main(sys.argv[1])
