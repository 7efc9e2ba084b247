"""The failure contract (validator/errors.py): the exceptions, the verdicts classify() gives,
the one table from verdict to journal action and exit code, and the launcher's use of it."""

import ast
import errno
import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
import requests

from validator.errors import (
    MAX_SCORING_ATTEMPTS,
    OUTCOMES,
    ConfigError,
    DeviceError,
    ExitCode,
    JournalAction,
    OperatorError,
    SubmissionRejected,
    TransientError,
    UnknownModuleError,
    ValidatorError,
    Verdict,
    classify,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def http_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"HTTP {status}", response=response)


class OutOfMemoryError(RuntimeError):
    """Stands in for torch.cuda.OutOfMemoryError, which is classified by name (no torch here)."""


@pytest.mark.parametrize(
    ("exc", "verdict"),
    [
        (SubmissionRejected("adapter has no base model"), Verdict.REJECTED),
        (ValueError("adapter has no base model"), Verdict.REJECTED),
        (http_error(404), Verdict.REJECTED),
        (http_error(403), Verdict.REJECTED),
        (OperatorError("disk full"), Verdict.OPERATOR),
        (ConfigError("bad key"), Verdict.CONFIG),
        (TransientError("hub 503"), Verdict.TRANSIENT),
        (requests.ConnectionError("refused"), Verdict.TRANSIENT),
        (requests.Timeout("slow"), Verdict.TRANSIENT),
        (http_error(502), Verdict.TRANSIENT),
        (ConnectionResetError("reset"), Verdict.TRANSIENT),
        (DeviceError("gpu lost"), Verdict.DEVICE),
        (RuntimeError("CUDA error: device-side assert triggered"), Verdict.DEVICE),
        (OutOfMemoryError("CUDA out of memory"), Verdict.DEVICE),
        # Error texts can come from a submission: only a real errno says the disk is full.
        (ValueError("bad adapter: No space left on device"), Verdict.REJECTED),
        # Nor a missing file: not the operator's problem for that, but not known to be the
        # submission's either; an unexpected error, rescored a bounded number of times.
        (
            OSError(errno.ENOENT, "No such file or directory", "adapter_config.json"),
            Verdict.UNEXPECTED,
        ),
        # A bug, or an error nobody foresaw: never failed at once, never stops the validator.
        (TypeError("'NoneType' object is not subscriptable"), Verdict.UNEXPECTED),
        (AttributeError("'Tensor' object has no attribute 'foo'"), Verdict.UNEXPECTED),
        (KeyError("lm_head.weight"), Verdict.UNEXPECTED),
        (RuntimeError("something went wrong"), Verdict.UNEXPECTED),
        (Exception("plain"), Verdict.UNEXPECTED),
    ],
)
def test_classify(exc, verdict):
    assert classify(exc) is verdict


def wrapped(outer: Exception, inner: BaseException) -> Exception:
    """`outer` raised from `inner`, as a library re-raises a failed write."""
    try:
        raise outer from inner
    except Exception as exc:
        return exc


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOSPC, "No space left on device", "/data/hf-cache/blobs/x"),
        OSError(errno.EDQUOT, "Disk quota exceeded", "/tmp/work/adapter.safetensors"),
        wrapped(RuntimeError("download failed"), OSError(errno.ENOSPC, "No space left")),
        sqlite3.OperationalError("database or disk is full"),
    ],
)
def test_a_full_disk_is_the_operators_problem_not_a_failed_submission(exc):
    assert classify(exc) is Verdict.OPERATOR


def test_what_libraries_raise_for_bad_input_is_a_rejected_submission():
    class Shape(pydantic.BaseModel):
        r: int

    with pytest.raises(pydantic.ValidationError) as invalid:
        Shape.model_validate({"r": "four"})
    with pytest.raises(json.JSONDecodeError) as not_json:
        json.loads("{not json")
    with pytest.raises(UnicodeDecodeError) as not_utf8:
        b"\xff".decode()
    for exc in (invalid.value, not_json.value, not_utf8.value):
        assert classify(exc) is Verdict.REJECTED, exc


def test_a_device_fault_under_a_rejection_still_restarts_the_process():
    # peft's error while loading an adapter is wrapped as a rejection (modules/lora); a CUDA
    # fault or an out-of-memory under it is this host's, not the submission's.
    assert classify(wrapped(SubmissionRejected("bad adapter"), RuntimeError("CUDA error: x"))) is (
        Verdict.DEVICE
    )
    assert classify(wrapped(SubmissionRejected("bad"), OutOfMemoryError("oom"))) is Verdict.DEVICE
    # A rejection's own text comes from the submission and restarts nothing.
    assert classify(SubmissionRejected("mallory/CUDA error: repo not found")) is Verdict.REJECTED
    assert classify(wrapped(TypeError("bug"), SubmissionRejected("CUDA error"))) is (
        Verdict.UNEXPECTED
    )


def test_the_table_is_the_documented_policy():
    # (journal action, exit code: None = the loop goes on), as docs/module-api.md and the
    # docs/troubleshooting.md "Where an assignment's failure lands" state it.
    policy = {verdict: (row.journal, row.exit_code) for verdict, row in OUTCOMES.items()}
    assert policy == {
        Verdict.REJECTED: (JournalAction.FAIL, None),
        Verdict.UNEXPECTED: (JournalAction.COUNT, None),
        Verdict.TRANSIENT: (JournalAction.KEEP, None),
        Verdict.DEVICE: (JournalAction.COUNT, ExitCode.RESTART),
        Verdict.OPERATOR: (JournalAction.KEEP, ExitCode.OPERATOR),
        Verdict.CONFIG: (JournalAction.KEEP, ExitCode.USAGE),
    }
    assert set(OUTCOMES) == set(Verdict)
    assert all(row.verdict is verdict for verdict, row in OUTCOMES.items())
    assert OUTCOMES[Verdict.UNEXPECTED].traceback  # a bug is logged with its traceback
    assert MAX_SCORING_ATTEMPTS == 3
    with pytest.raises(AttributeError):
        OUTCOMES[Verdict.REJECTED].exit_code = ExitCode.BUG  # type: ignore[misc]


def test_exit_codes_are_the_launchers_contract():
    assert {code.name: int(code) for code in ExitCode} == {
        "OK": 0,
        "BUG": 1,
        "USAGE": 2,
        "OPERATOR": 3,
        "RESTART": 100,
        "INTERRUPTED": 130,
    }


def test_one_exception_hierarchy():
    for cls in (SubmissionRejected, OperatorError, ConfigError, TransientError, DeviceError):
        assert issubclass(cls, ValidatorError)
    assert issubclass(SubmissionRejected, ValueError)  # modules may go on catching ValueError
    assert issubclass(UnknownModuleError, ConfigError)
    assert issubclass(ConfigError, OperatorError)


def test_the_contract_and_the_launcher_import_nothing_heavy():
    # run.py imports both on the host, where only docker, click, requests and pydantic are.
    code = (
        "import sys, validator.errors, launcher.commands.program, launcher.commands.run; "
        "print(sorted(m for m in ('torch', 'transformers', 'peft', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# --- no bare exit codes in the launcher --------------------------------------------------------

EXIT_CODE_NUMBERS = {int(c) for c in ExitCode} - {ExitCode.OK, ExitCode.BUG}
CODE_NAMES = ("code", "exit", "status")


def bare_exit_codes(source: str) -> list[int]:
    """Lines where one of 2, 3, 100, 130 is written as a number where an exit code goes: an
    argument of sys.exit/exit/SystemExit, a returned value, an operand of a comparison, a dict
    key, the value of a name or keyword about codes, or a default of such a parameter."""
    tree = ast.parse(source)
    suspects: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name in ("sys.exit", "exit", "SystemExit"):
                suspects += node.args
            suspects += [kw.value for kw in node.keywords if _about_codes(kw.arg)]
        elif isinstance(node, ast.Return) and node.value is not None:
            suspects.append(node.value)
        elif isinstance(node, ast.Compare):
            suspects += [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            suspects += [key for key in node.keys if key is not None]
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_about_codes(ast.unparse(t)) for t in targets) and node.value is not None:
                suspects.append(node.value)
        elif isinstance(node, ast.arguments):
            params = [*node.posonlyargs, *node.args]
            defaults = dict(
                zip(params[len(params) - len(node.defaults) :], node.defaults, strict=True)
            )
            defaults.update(
                (a, d)
                for a, d in zip(node.kwonlyargs, node.kw_defaults, strict=True)
                if d is not None
            )
            suspects += [d for a, d in defaults.items() if _about_codes(a.arg)]
    numbers = [n for suspect in suspects for n in _numbers(suspect)]
    return sorted({n.lineno for n in numbers if n.value in EXIT_CODE_NUMBERS})


def _numbers(expr: ast.AST) -> list[ast.Constant]:
    """The int constants that are `expr`'s value, as in `130 if ... else (0 if ... else code)`
    or `(0, 143)`; not those inside calls or subscripts (`dump(x, width=100)`, `digest[:12]`)."""
    if isinstance(expr, ast.Constant):
        return [expr] if type(expr.value) is int else []
    if isinstance(expr, ast.IfExp):
        return _numbers(expr.body) + _numbers(expr.orelse)
    if isinstance(expr, ast.BoolOp):
        return [n for value in expr.values for n in _numbers(value)]
    if isinstance(expr, ast.Tuple | ast.List | ast.Set):
        return [n for element in expr.elts for n in _numbers(element)]
    return []


def _about_codes(name: str | None) -> bool:
    return name is not None and any(word in name.lower() for word in CODE_NAMES)


@pytest.mark.parametrize(
    "source",
    [
        "import sys\nsys.exit(3)",
        "def f(signals):\n    return 130 if signals > 1 else 0",
        "def f(code):\n    if code != 100:\n        return code",
        "MESSAGES = {2: 'usage'}",
        "RESTART_EXIT = 100",
        "def f():\n    code = 3\n    return code",
        "class E(Exception):\n    def __init__(self, m, exit_code=3):\n        pass",
        "raise E('m', exit_code=2)",
        "def f(code):\n    return 0 if code in (0, 143, 3) else code",
    ],
)
def test_the_scan_finds_bare_exit_codes(source):
    assert bare_exit_codes(source) != []


def test_the_launcher_names_its_exit_codes():
    files = [REPO_ROOT / "run.py", *sorted((REPO_ROOT / "launcher").glob("*.py"))]
    found = {
        str(path.relative_to(REPO_ROOT)): lines
        for path in files
        if (lines := bare_exit_codes(path.read_text()))
    }
    assert found == {}, "use validator.errors.ExitCode, not numbers"


def test_the_reason_at_the_attempt_limit_names_the_last_error():
    from validator.runner import _attempts_used_up
    from validator.state.entry import Entry, State

    def entry(error: str | None) -> Entry:
        return Entry(
            id="1",
            module="m",
            task_id="1",
            state=State.SCORING,
            input={},
            metrics=None,
            outcome=None,
            error=error,
            attempts=3,
            not_before=0.0,
            received_at=0.0,
            updated_at=0.0,
        )

    crashed = ("scoring ended the process 3 times (crash or device fault)", "crashed")
    assert _attempts_used_up(entry(None)) == crashed
    assert _attempts_used_up(entry("transient: hub 503")) == crashed
    assert _attempts_used_up(entry("unexpected error in the module: TypeError: x")) == (
        "3 scoring attempts without a result (unexpected errors, then the process ended); the "
        "last error recorded: unexpected error in the module: TypeError: x",
        "unexpected",
    )


def test_the_public_exceptions_live_in_errors_and_the_old_imports_still_work():
    from validator import errors
    from validator.errors import (
        JournalBroken,
        JournalLocked,
        JournalUnwritable,
        MalformedSecret,
        ModuleCannotStart,
        RequestNotSendable,
    )

    moved = [
        MalformedSecret,
        RequestNotSendable,
        ModuleCannotStart,
        JournalUnwritable,
        JournalLocked,
        JournalBroken,
    ]
    for cls in moved:
        assert getattr(errors, cls.__name__) is cls
        assert cls.__module__ == "validator.errors"
    assert issubclass(MalformedSecret, ConfigError) and issubclass(JournalLocked, OperatorError)


def drawn_tree(doc: str) -> dict[str, tuple[str | None, tuple[str, ...]]]:
    """The exceptions errors.py's docstring draws: name -> (its base in the tree, or None at
    the top; the built-in bases in brackets)."""
    drawn: dict[str, tuple[str | None, tuple[str, ...]]] = {}
    parents: list[str] = []
    for line in doc.splitlines():
        if not line.startswith("    ") or not line.strip():
            continue
        depth = (len(line) - len(line.lstrip()) - 4) // 2
        names = re.split(r"\s{2,}", line.strip())[0].split(", ")
        parents = parents[:depth]
        for entry in names:
            name, _, extra = entry.partition(" [")
            drawn[name] = (parents[-1] if parents else None, tuple(filter(None, [extra[:-1]])))
        parents.append(names[0] if len(names) == 1 else "")
    return drawn


def test_errors_py_opens_with_the_tree_of_every_exception_it_defines():
    import validator.errors as errors_module

    real = {}
    for name, value in vars(errors_module).items():
        if isinstance(value, type) and issubclass(value, BaseException):
            if value.__module__ == errors_module.__name__:
                ours = [b.__name__ for b in value.__bases__ if b.__module__ == value.__module__]
                builtin = [
                    b.__name__ for b in value.__bases__ if b.__module__ == "builtins"
                    and b is not Exception
                ]  # fmt: skip
                real[name] = (ours[0] if ours else None, tuple(builtin))
    assert drawn_tree(errors_module.__doc__ or "") == real
