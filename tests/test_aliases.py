"""Every earlier spelling (an import path, a name, a command, a config key, an argument) lives in
one table, validator/_moved.py, with the release that removes it: each still works with a
warning naming what to write instead, nothing else in the product keeps one of its own, and no
alias outlives its release."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from devkit.validator_cli import REPO_ROOT
from launcher.release.published import checkout_version
from validator import _moved, errors, kit
from validator._moved import ALIASES, MovedPathWarning

PRODUCT = [
    *(REPO_ROOT / "validator").rglob("*.py"),
    *(REPO_ROOT / "modules").rglob("*.py"),
    *(REPO_ROOT / "launcher").rglob("*.py"),
    REPO_ROOT / "run.py",
]
# What a compatibility shim of its own says: a deprecation warning, or a release it lasts until.
SHIM = re.compile(
    r"FutureWarning|DeprecationWarning|[Dd]eprecat|until \d+\.\d|goes in \d+\.\d|removed in \d"
)


def of_kind(kind: str) -> list[_moved.Alias]:
    return [alias for alias in ALIASES if alias.kind == kind]


def test_no_alias_outlives_its_release():
    # Fails on the release that removes an alias: remove it (its row, and what only it used).
    version = checkout_version(REPO_ROOT)
    overdue = [f"{alias.old} (goes in {alias.removed_in})" for alias in _moved.overdue(version)]
    assert overdue == [], f"package {version}: remove these aliases"


def test_an_alias_is_overdue_from_its_release_on():
    latest = max((alias.removed_in for alias in ALIASES), key=_moved.release)
    assert _moved.overdue(latest) and set(_moved.overdue("99")) == set(ALIASES)
    assert _moved.overdue("0.2.9") == [] and _moved.release("0.3") == (0, 3, 0)
    assert _moved.release("0.3.1rc1") > _moved.release("0.3")


def test_each_spelling_is_written_once_with_its_release():
    olds = [alias.old for alias in ALIASES]
    assert len(olds) == len(set(olds))
    assert all(_moved.release(alias.removed_in) > (0, 0, 0) for alias in ALIASES)


def test_no_compatibility_code_lives_outside_the_one_table():
    own = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in PRODUCT
        if path != REPO_ROOT / "validator" / "_moved.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if SHIM.search(line)
    ]
    assert own == [], "an alias goes in validator/_moved.py's table, with its release"


def test_each_spelling_alias_is_said_by_the_code_that_reads_it():
    code = "\n".join(path.read_text() for path in PRODUCT)
    said = {a.old for a in of_kind("spelling") for q in "'\"" if f"alias({q}{a.old}{q})" in code}
    assert said == {alias.old for alias in of_kind("spelling")}


def module_file(dotted: str) -> Path:
    path = REPO_ROOT.joinpath(*dotted.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def test_each_old_name_is_given_by_its_modules_getattr():
    missing = []
    for alias in of_kind("name"):
        module, _, _ = alias.old.rpartition(".")
        tree = ast.parse(module_file(module).read_text())
        getattrs = [
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
        ]
        calls = [
            call.func.id
            for node in getattrs
            for call in ast.walk(node)
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
        ]
        if "moved_name" not in calls:
            missing.append(alias.old)
    assert missing == []


def test_an_earlier_path_gives_the_module_itself_with_a_warning():
    finder = _moved._MovedFinder()
    for alias in of_kind("path"):
        assert finder.find_spec(alias.old) is not None, alias.old
        assert importlib.util.find_spec(alias.new) is not None, alias.new
    spec = finder.find_spec("validator.safe_json")
    with pytest.warns(MovedPathWarning) as caught:
        module = spec.loader.create_module(spec)
    assert module is importlib.import_module("validator.outbound.safe_json")
    (warning,) = caught
    assert str(warning.message) == (
        "validator.safe_json has moved to validator.outbound.safe_json; module authors import "
        "from validator.kit (the old one goes in 0.3)"
    )
    assert finder.find_spec("validator.kit.hub.fetch_base_model") is None  # a name, not a path


def test_the_warning_points_at_the_line_that_imports_the_old_path():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.modules.pop("validator.exceptions", None)
        from validator.exceptions import SubmissionRejected  # noqa: F401
    (warning,) = [w for w in caught if issubclass(w.category, MovedPathWarning)]
    assert "validator.exceptions has moved to validator.errors" in str(warning.message)
    assert warning.filename == __file__  # the author's import line, not importlib's
    assert sys.modules["validator.exceptions"] is errors


@pytest.mark.parametrize("module", ["validator.kit", "validator.errors"])
def test_an_exceptions_earlier_name_is_the_one_class_with_a_warning(module):
    imported = importlib.import_module(module)
    assert "RecoverableException" not in dir(imported)
    with pytest.warns(MovedPathWarning, match=r"RecoverableException has moved to .*OperatorError"):
        assert imported.RecoverableException is errors.OperatorError
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchException'"):
        _ = imported.NoSuchException


def test_a_name_that_moved_is_the_same_object_and_warns_at_the_readers_line():
    from validator.kit import base_models, hub, progress

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        moved = hub.fetch_base_model
    (warning,) = caught
    assert moved is base_models.fetch_base_model and warning.filename == __file__
    assert "validator.kit.hub.fetch_base_model has moved to validator.kit.fetch_base_model" in (
        str(warning.message)
    )
    with pytest.warns(MovedPathWarning, match="progress.Progress has moved"):
        assert progress.Progress is kit.Progress
    with pytest.raises(AttributeError):
        _ = hub.no_such_name


def test_the_earlier_scope_functions_act_on_the_current_scope(tmp_path):
    import validator.scope as scope
    from validator.state.phases import ScoringMarks

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MovedPathWarning)
        host_work, note = scope.host_work, scope.note
    with ScoringMarks(tmp_path).scoring("a1") as times:
        with host_work("load"):
            note("commit", "abc")
    assert times.facts == {"commit": "abc"}


def test_a_name_that_is_gone_says_what_replaced_it():
    gone = next(alias for alias in ALIASES if alias.gone)
    module, _, name = gone.old.rpartition(".")
    with pytest.raises(AttributeError, match=f"{name} is replaced by {re.escape(gone.new)}"):
        _moved.moved_name(module, name)


def test_an_alias_of_a_spelling_warns_naming_both_and_its_release():
    said = _moved.alias("python -m validator new-module")
    assert said.line == (
        "python -m validator new-module has moved to python -m devkit.scaffold NAME "
        "(the old one goes in 0.3)"
    )
    with pytest.raises(KeyError):
        _moved.alias("no such spelling")


# What a module could import from the kit's former face files, one name of each.
FACE_IMPORTS = {
    "validator.kit.errors": "SubmissionRejected",
    "validator.kit.outbound": "capped_session",
    "validator.kit.run_context": "current_run",
    "validator.kit.sandbox": "run_child",
    "validator.kit.scope": "current_scope",
    "validator.kit.text": "one_line",
}


@pytest.mark.parametrize("old", sorted(FACE_IMPORTS))
def test_a_name_imported_from_a_former_face_file_is_the_kits_with_a_warning(old):
    name = FACE_IMPORTS[old]
    script = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "import validator.kit as kit\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        f"    from {old} import {name} as given\n"
        f"assert given is getattr(kit, {name!r}), given\n"
        "import sys\n"
        f"target = sys.modules[{old!r}]\n"
        f"assert target.__spec__.name == target.__name__ != {old!r}, target.__spec__\n"
        "assert kit.__spec__.name == 'validator.kit', kit.__spec__\n"
        "print(*(str(w.message) for w in caught), sep='\\n')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{old} has moved to "), done.stdout
