"""validator.kit is the one import for module authors: the modules and the scaffold use only it,
its names are written once (its stub imports each from where it is defined, and the docs list
them from the stub), they load lazily, and the runtime scope is an object that is a no-op outside
a run. Earlier spellings: tests/test_aliases.py."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from devkit.validator_cli import REPO_ROOT, run_validator, validator_env
from scripts import kit_docs
from validator import errors, kit, text
from validator.scope import NO_RUN, Progress, Scope, current_scope
from validator.state.phases import ScoringMarks

IMPORT = re.compile(r"^\s*(?:from|import) (validator(?:\.\w+)*)\b", re.M)
STUB = REPO_ROOT / "validator" / "kit" / "__init__.pyi"
AUTHORED = sorted(
    [*(REPO_ROOT / "modules").glob("*/*.py"), *(REPO_ROOT / "devkit" / "scaffold").rglob("*.j2")]
)


def validator_imports(path: Path) -> list[str]:
    """Every `validator...` module that `path` imports, at any depth (templates are not Python
    until rendered, so the lines are read as text)."""
    return IMPORT.findall(path.read_text())


def test_modules_and_the_scaffold_import_the_validator_through_the_kit_only():
    assert len([p for p in AUTHORED if p.suffix == ".j2"]) >= 2
    # The scaffold's test template checks the config loading and the spec, as a test may.
    allowed = {"validator.kit", "validator.config", "validator.spec"}
    outside = {
        str(path.relative_to(REPO_ROOT)): sorted(set(names) - {"validator.kit"})
        for path in AUTHORED
        if (names := validator_imports(path))
        and set(names) - ({"validator.kit"} | (allowed if path.name.startswith("test_") else set()))
    }
    assert outside == {}


def test_every_name_of_the_kit_resolves_and_all_lists_them():
    table = kit.table()
    names = [name for node in ast.parse(STUB.read_text()).body if isinstance(node, ast.ImportFrom)
             for name in (alias.asname or alias.name for alias in node.names)]  # fmt: skip
    # A name imported twice would silently come from the later line only.
    assert len(names) == len(set(names)) == len(table) and len(names) > 50
    assert kit.__all__ == sorted(names) and dir(kit) == kit.__all__
    for name, (module, attribute) in table.items():
        source = importlib.import_module(module)
        value = getattr(kit, name)
        assert value is (source if attribute is None else getattr(source, attribute)), name
        if isinstance(value, type) or inspect.isfunction(value):
            # The very object where it is defined, never a copy: the loop catches these classes.
            assert value.__module__ == module and getattr(source, name) is value, name
    assert kit.SubmissionRejected is errors.SubmissionRejected
    assert kit.OperatorError is errors.OperatorError and kit.quoted is text.quoted
    assert kit.current_scope is current_scope
    with pytest.raises(AttributeError, match="has no attribute 'journal'"):
        _ = kit.journal


def defined_at_top(path: Path) -> set[str]:
    """The names `path` defines itself (a class, a function, an assignment), not imports."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return names


def test_each_kit_name_is_written_once_beside_its_definition():
    # No face re-exports a name: the stub imports each from the file that defines it.
    elsewhere = []
    for name, (module, attribute) in kit.table().items():
        if attribute is None:
            continue  # a module of the kit (`hub`)
        path = REPO_ROOT.joinpath(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if attribute not in defined_at_top(path):
            elsewhere.append(f"{name}: not defined in {path.relative_to(REPO_ROOT)}")
    assert elsewhere == []


def test_the_docs_list_the_kits_names_and_aliases_as_the_code_holds_them():
    page = kit_docs.PAGE.read_text()
    assert kit_docs.rewritten(page) == page, "run `python -m scripts.kit_docs`"
    listed = re.findall(r"`(\w+)`", page.split("<!-- kit-names:")[1].split("<!-- /kit-names")[0])
    assert sorted(listed) == kit.__all__


def test_a_built_validator_carries_the_kits_stub_and_its_kit_imports(tmp_path):
    """Without its stub the kit does not import (it reads its names there): a wheel built
    from pyproject.toml holds it, and the kit imports from that wheel's files alone."""
    source = tmp_path / "source"
    shutil.copytree(
        REPO_ROOT / "validator", source / "validator", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "--wheel-dir", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "installed")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import validator.kit as kit; "
        "print(kit.__file__); print(len(kit.__all__), kit.SubmissionRejected.__module__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "installed")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    where, names = done.stdout.splitlines()
    assert where == str(tmp_path / "installed" / "validator" / "kit" / "__init__.py")
    assert names == f"{len(kit.__all__)} validator.errors"


def test_importing_the_kit_loads_neither_torch_nor_the_hub_library():
    code = (
        "import sys; from validator.kit import BaseValidationModule, SubmissionRejected, "
        "current_scope; print(sorted(m for m in ('torch', 'huggingface_hub') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_scope_is_a_no_op_outside_a_run():
    scope = current_scope()
    assert scope is NO_RUN and type(scope) is Scope
    with scope.host_work("load"):
        scope.note("commit", "abc")
        scope.heartbeat()
    with pytest.raises(ValueError, match="host_work phase 'compile'"):
        with scope.host_work("compile"):  # type: ignore[arg-type]
            pass


def test_the_loops_scope_records_host_work_notes_and_beats_then_goes(tmp_path):
    beats: list[int] = []
    phases: list[str] = []
    marks = ScoringMarks(tmp_path)
    with marks.scoring("a1", on_phase=phases.append, on_beat=lambda: beats.append(1)) as times:
        scope = current_scope()
        assert scope is not NO_RUN
        with scope.host_work("download"):
            # What a later process reads after a SIGKILL in here: the host's work.
            assert (tmp_path / "scoring.phase").read_text() == "a1\nhost: download\n"
        scope.note("commit", "c" * 300)
        Progress("scoring", total=2, every=0).advance()
    assert phases == ["host: download", "submission"]
    assert times.facts == {"commit": "c" * 200} and beats == [1]
    assert current_scope() is NO_RUN and not (tmp_path / "scoring.phase").exists()


def test_a_progress_made_in_a_scoring_beats_from_another_thread(tmp_path):
    import threading

    beats: list[int] = []
    with ScoringMarks(tmp_path).scoring("a1", on_beat=lambda: beats.append(1)):
        progress = Progress("judging", total=1, every=0)
        thread = threading.Thread(target=progress.advance)
        thread.start()
        thread.join()
    assert beats == [1]


# A module as the README wrote it before the kit: the paths it used, `host_work` and `note` as
# functions. It must load, score and record its facts, with the warnings in the log.
OLD_MODULE = """
from validator.base import BaseConfig, BaseInputData, BaseMetrics, BaseValidationModule
from validator.exceptions import RecoverableException, SubmissionRejected
from validator.phases import host_work, note


class OldConfig(BaseConfig):
    weight: float = 1.0


class OldInput(BaseInputData):
    hg_repo_id: str
    context_length: int


class OldMetrics(BaseMetrics):
    score: float


class OldModule(BaseValidationModule):
    config_schema = OldConfig
    input_data_schema = OldInput
    metrics_schema = OldMetrics

    def validate(self, data: OldInput) -> OldMetrics:
        if data.context_length <= 0:
            raise SubmissionRejected("context_length must be positive")
        with host_work("load"):
            note("commit", "0" * 40)
        return OldMetrics(score=self.config.weight * len(data.hg_repo_id))


MODULE = OldModule
"""


def test_a_module_written_from_the_earlier_readme_loads_with_a_warning(tmp_path):
    folder = tmp_path / "modules" / "oldstyle"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(OLD_MODULE)
    (folder / "module.yaml").write_text("name: oldstyle\n")
    (folder / "environment.yml").write_text("name: oldstyle\ndependencies: [python=3.11]\n")
    path = tmp_path / "input.json"
    path.write_text(json.dumps({"hg_repo_id": "alice/x", "context_length": 7}))
    result = run_validator(
        ["oldstyle", "--check", str(path)], validator_env(tmp_path, PYTHONPATH=str(tmp_path))
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {"score": 7.0}
    for old, new in [
        ("validator.base", "validator.kit.base"),
        ("validator.exceptions", "validator.errors"),
        ("validator.phases", "validator.scope"),
        ("validator.errors.RecoverableException", "validator.errors.OperatorError"),
        ("validator.scope.host_work", "current_scope().host_work"),
    ]:
        assert f"{old} has moved to {new}" in result.stderr
