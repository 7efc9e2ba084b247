"""The layout is the architecture (docs/development.md, "Layout"): the kit is the module authors'
door and holds nothing else, nothing outside it reaches past that door into its files, and the
rooms below it (the sandbox, outbound) never import what stands above them; the launcher's rooms
import only the rooms below them, and no two of its files import each other, even by a detour.
Read from the code's own import statements, so a new import that breaks a rule fails here,
naming the file."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from devkit.validator_cli import REPO_ROOT
from validator import kit
from validator._moved import ALIASES

VALIDATOR = REPO_ROOT / "validator"
KIT = VALIDATOR / "kit"
SANDBOX = VALIDATOR / "sandbox"
# The files a bounded child loads without the validator (child_entry.py, `python -I`), and the
# scripts run as children: the standard library and each other only.
CHILD_SIDE = (
    "child_entry",
    "child_landlock",
    "child_limits",
    "child_seccomp",
    "child_reaper",
    "kernel",
    "protocol",
)
CHILD_SCRIPTS = ("pattern_child",)
# Each room below the loop, and the validator modules and rooms it may import besides its own.
BELOW = {
    "validator.sandbox": {"validator.errors", "validator.scope"},
    "validator.outbound": {"validator.errors", "validator.run_context"},
    "validator.kit": {
        "validator",  # `from validator import sandbox`: the pattern child's folder
        "validator._moved",  # the earlier names of the kit's, with the release removing each
        "validator.errors",
        "validator.text",
        "validator.disk",
        "validator.scope",
        "validator.run_context",
        "validator.outbound",
        "validator.sandbox",
    },
}


LAUNCHER = REPO_ROOT / "launcher"
# Each of the launcher's rooms, and the rooms it may import besides its own: the commands stand
# on top; the doctor and the deployment files it writes above the fleet and the releases, which
# stand side by side (neither imports the other) on the Docker engine's side.
LAUNCHER_BELOW = {
    "launcher.commands": {
        "launcher.doctor",
        "launcher.deploy",
        "launcher.fleet",
        "launcher.release",
        "launcher.engine",
    },
    "launcher.doctor": {"launcher.fleet", "launcher.engine"},
    "launcher.deploy": {"launcher.fleet", "launcher.release", "launcher.engine"},
    "launcher.fleet": {"launcher.engine"},
    "launcher.release": {"launcher.engine"},
    "launcher.engine": set(),
}
# What every room may import: the launcher's errors and its options, which import no room.
LAUNCHER_BASE = {"launcher", "launcher.errors", "launcher.options"}


def python_files(*places: Path) -> list[Path]:
    found: list[Path] = []
    for place in places:
        found += [place] if place.suffix == ".py" else sorted(place.rglob("*.py"))
    return [path for path in found if "__pycache__" not in path.parts]


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) for each absolute import in `path`, at any depth; `import a.b` is
    ("a.b", []). Relative imports (level > 0) are the room's own."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def relative_imports(path: Path) -> list[str]:
    return [
        node.module or ""
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]


def room_of(module: str) -> str:
    """`validator.sandbox.child_process` -> `validator.sandbox`; `validator.errors` stays."""
    return ".".join(module.split(".")[:2])


def rel(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def test_every_file_of_the_kit_is_named_by_its_stub():
    files = {path.stem for path in KIT.glob("*.py") if path.name != "__init__.py"}
    named = {module for module, _ in kit.table().values() if module.startswith("validator.kit.")}
    assert {f"validator.kit.{stem}" for stem in files} == named, (
        "plumbing in the kit: move it to a room of its own"
    )


def test_nothing_outside_the_kit_reaches_past_its_public_names():
    # The product and the dev tools; tests may look inside a kit file they test.
    places = [REPO_ROOT / name for name in ("validator", "launcher", "modules", "devkit", "bench")]
    places += [REPO_ROOT / "scripts", REPO_ROOT / "run.py"]
    reaching: list[str] = []
    for path in python_files(*places):
        if KIT in path.parents:
            continue
        for module, names in imports(path):
            if module.startswith("validator.kit."):
                reaching.append(f"{rel(path)}: {module}")
            elif module == "validator.kit":
                reaching += [f"{rel(path)}: {name}" for name in names if name not in kit.__all__]
    assert reaching == [], "import these from validator.kit, or from where they live"


def test_the_rooms_below_the_loop_import_only_what_stands_below_them():
    above: list[str] = []
    for room, allowed in BELOW.items():
        for path in python_files(VALIDATOR / room.split(".")[1]):
            for module, _ in imports(path):
                if module.startswith("validator") and room_of(module) not in allowed | {room}:
                    above.append(f"{rel(path)}: {module}")
    assert above == []


def test_the_sandbox_never_imports_the_kit_and_its_child_side_runs_without_the_validator():
    standard = set(sys.stdlib_module_names) | {"__future__"}
    outside: list[str] = []
    for stem in CHILD_SIDE + CHILD_SCRIPTS:
        path = SANDBOX / f"{stem}.py"
        outside += [
            f"{rel(path)}: {module}"
            for module, _ in imports(path)
            if module.split(".")[0] not in standard
        ]
        siblings = relative_imports(path)
        assert stem not in CHILD_SCRIPTS or siblings == [], f"{rel(path)} runs alone"
        outside += [f"{rel(path)}: .{name}" for name in siblings if name not in ("", *CHILD_SIDE)]
    assert outside == []
    kit_users = [
        rel(path)
        for path in python_files(SANDBOX)
        if any(room_of(module) == "validator.kit" for module, _ in imports(path))
    ]
    assert kit_users == []


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_file_of_the_launcher_lives_in_a_room():
    # Beside the base, only the earlier `python -m launcher.X` spellings (validator/_moved.py).
    moved = {a.old.split()[-1] for a in ALIASES if a.old.startswith("python -m launcher.")}
    loose = {module_name(path) for path in LAUNCHER.glob("*.py")} - LAUNCHER_BASE - moved
    assert loose == set(), "give it a room (docs/development.md, Layout)"
    assert {path.name for path in LAUNCHER.iterdir() if path.is_dir()} - {"__pycache__"} == {
        room.split(".")[1] for room in LAUNCHER_BELOW
    }


def test_the_launchers_rooms_import_only_the_rooms_below_them():
    upward: list[str] = []
    for room, allowed in LAUNCHER_BELOW.items():
        for path in python_files(LAUNCHER / room.split(".")[1]):
            for module, names in imports(path):
                targets = [f"{module}.{name}" for name in names] if module == "launcher" else []
                for target in targets or [module]:
                    if not target.startswith("launcher"):
                        continue
                    if room_of(target) not in allowed | {room} | LAUNCHER_BASE:
                        upward.append(f"{rel(path)}: {target}")
    base_files = [LAUNCHER / f"{name.split('.')[-1]}.py" for name in LAUNCHER_BASE - {"launcher"}]
    base = [
        f"{rel(path)}: {module}"
        for path in base_files
        for module, _ in imports(path)
        if module.startswith("launcher")
    ]
    assert upward == [] and base == []


def test_no_launcher_file_imports_itself_back():
    graph: dict[str, set[str]] = {}
    for path in python_files(LAUNCHER):
        found = set()
        for module, names in imports(path):
            if module == "launcher":
                found |= {f"launcher.{name}" for name in names}
            elif module.startswith("launcher."):
                found.add(module)
        graph[module_name(path)] = found
    circles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        for target in sorted(graph.get(node, ())):
            if target in trail:
                circles.append([*trail[trail.index(target) :], target])
            elif target in graph and target not in done:
                visit(target, [*trail, target])
        done.add(node)

    done: set[str] = set()
    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    assert circles == []
