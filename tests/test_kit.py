"""validator.kit is the one import for module authors: the modules and the scaffold use only it,
its names load lazily, earlier paths keep working with a warning, and the runtime scope is an
object that is a no-op outside a run."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

from devkit.validator_cli import REPO_ROOT, run_validator, validator_env
from validator import _moved, errors, kit, text
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


def stub_table() -> list[tuple[str, str]]:
    """(kit module, name) for each name the kit's stub imports, in its order: `from . import hub`
    gives ("hub", "hub")."""
    rows: list[tuple[str, str]] = []
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            rows += [(node.module or alias.name, alias.name) for alias in node.names]
    return rows


def test_every_name_of_the_kit_resolves_and_all_lists_them():
    table = stub_table()
    names = [name for _, name in table]
    # A name imported twice would silently come from the later line only.
    assert len(names) == len(set(names)) and len(names) > 50
    assert kit.__all__ == sorted(names) and dir(kit) == kit.__all__
    for module, name in table:
        source = importlib.import_module(f"validator.kit.{module}")
        value = getattr(kit, name)
        assert value is (source if module == name else getattr(source, name)), name
        if isinstance(value, type) or inspect.isfunction(value):
            # The very object where it is defined, never a copy: the loop catches these classes.
            assert getattr(sys.modules[value.__module__], name) is value, name
    assert kit.SubmissionRejected is errors.SubmissionRejected
    assert kit.OperatorError is errors.OperatorError and kit.quoted is text.quoted
    assert kit.SubmissionRejected.__module__ == "validator.errors"
    assert kit.current_scope is current_scope
    with pytest.raises(AttributeError, match="No validator.kit attribute journal"):
        _ = kit.journal


def test_a_built_validator_carries_the_kits_stub_and_its_kit_imports(tmp_path):
    """Without its stub the kit does not import (lazy_loader.attach_stub raises): a wheel built
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


def test_only_paths_a_module_author_could_have_imported_are_kept_and_each_says_when_it_goes():
    # The loop's own earlier paths (the journal, the Fed Ledger client, ...) are gone.
    loop = ("validator.ledger", "validator.state", "validator.observe", "validator.report")
    assert not [new for new, _ in _moved.MOVED.values() if new.startswith(loop)]
    assert {removed_in for _, removed_in in _moved.MOVED.values()} == {"0.3"}
    for gone in ("validator.journal", "validator.fedledger", "validator.observer"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(gone)


@pytest.mark.parametrize(
    "old, new, removed_in", sorted((old, *where) for old, where in _moved.MOVED.items())
)
def test_earlier_paths_import_the_same_module_with_a_warning(old, new, removed_in):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import importlib, sys; m = importlib.import_module({old!r}); "
            f"print(m is sys.modules[{new!r}])",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
    assert f"{old} has moved to {new} (the old path goes in {removed_in})" in done.stderr
    assert "MovedPathWarning" in done.stderr


@pytest.mark.parametrize("module", ["validator.kit", "validator.errors"])
def test_an_exceptions_earlier_name_is_the_one_class_with_a_warning(module):
    # One class, one name: `RecoverableException` is no longer listed (nor in dir), and reading
    # it warns, naming the class's name and the release that removes the old one.
    imported = importlib.import_module(module)
    assert "RecoverableException" not in dir(imported)
    with pytest.warns(_moved.MovedPathWarning, match=r"is now .*OperatorError .*goes in 0\.3"):
        assert imported.RecoverableException is errors.OperatorError
    with pytest.raises(AttributeError):
        _ = imported.NoSuchException


@pytest.mark.parametrize(
    "module, name, new",
    [(m, n, where[0]) for m, names in _moved.MOVED_NAMES.items() for n, where in names.items()],
)
def test_a_name_that_moved_to_another_module_is_the_same_object_with_a_warning(module, name, new):
    # kit.hub.fetch_base_model is kit/base_models.py's now: the old place names it still,
    # without importing the new one (which imports it).
    with pytest.warns(_moved.MovedPathWarning, match=rf"{module}.{name} is now {new}.{name}"):
        old = getattr(importlib.import_module(module), name)
    assert old is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        _ = importlib.import_module(module).no_such_name


def test_the_warning_points_at_the_line_that_imports_the_old_path():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.modules.pop("validator.exceptions", None)
        from validator.exceptions import SubmissionRejected  # noqa: F401
    (warning,) = [w for w in caught if issubclass(w.category, _moved.MovedPathWarning)]
    assert "validator.exceptions has moved to validator.errors" in str(warning.message)
    assert warning.filename == __file__  # the author's import line, not importlib's


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
    ]:
        assert f"{old} has moved to {new}" in result.stderr
    assert "validator.errors.RecoverableException is now validator.errors.OperatorError" in (
        result.stderr
    )
