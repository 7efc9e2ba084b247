"""No function over 60 lines in validator/, modules/ or launcher/, so that it stays so:
measured with `ast`, from a function's `def` line to its last line (end_lineno - lineno + 1;
its decorators not counted), nested functions and methods each on their own. A long function is
split where its steps are (docs/development.md)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("validator", "modules", "launcher")
MAX_LINES = 60


def function_lengths(root: Path, folders: tuple[str, ...]) -> dict[str, int]:
    """`path:Qualified.name` -> lines, for every function under `root`'s `folders`."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                lengths[f"{path}:{name}"] = child.end_lineno - child.lineno + 1
            elif isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
            visit(child, path, f"{name}." if name != prefix else prefix)

    for folder in folders:
        for file in sorted((root / folder).rglob("*.py")):
            path = file.relative_to(root).as_posix()
            visit(ast.parse(file.read_text(encoding="utf-8"), path), path, "")
    return lengths


def test_no_function_in_validator_modules_or_launcher_is_over_60_lines():
    lengths = function_lengths(REPO, FOLDERS)
    assert len(lengths) > 1000  # the folders were read
    long = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert long == {}, f"over {MAX_LINES} lines; split them where their steps are: {long}"


def test_a_function_is_measured_from_its_def_to_its_last_line(tmp_path):
    def body(indent: str) -> str:
        return "\n".join(f"{indent}x{i} = {i}" for i in range(58))

    (tmp_path / "validator").mkdir()
    (tmp_path / "validator" / "m.py").write_text(
        "import functools\n\n\n"
        "@functools.cache\n@functools.cache\n"  # decorators: not counted
        f"def sixty():\n{body('    ')}\n    return 0\n\n\n"
        f"class C:\n    def sixty_one(self):\n{body('        ')}\n"
        "        y = 1\n        return y\n\n"
        "    def nested(self):\n        def inner():\n            return 1\n\n"
        "        return inner\n"
    )
    assert function_lengths(tmp_path, ("validator",)) == {
        "validator/m.py:sixty": 60,
        "validator/m.py:C.sixty_one": 61,
        "validator/m.py:C.nested": 5,
        "validator/m.py:C.nested.inner": 2,
    }
