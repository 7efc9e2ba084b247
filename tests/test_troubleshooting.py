"""docs/troubleshooting.md against the code: its exit-code table against `ExitCode`, where an
assignment's failure lands against `OUTCOMES` (the exception each row names, classified), and
each row of "By error line" against the error the code raises for it (the launcher's
LaunchError and its exit code; the validator's exception and the exit code its verdict has)."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

import click
import pytest
from docker.errors import APIError, DockerException, ImageNotFound

from launcher.engine import pulls
from launcher.engine.docker_errors import refused_to_run, unreachable
from launcher.engine.images import base_unavailable
from launcher.engine.supervisor import EXIT_MESSAGES, KILLED_EXIT, killed_in_a_row
from launcher.errors import LaunchError
from launcher.fleet.plan import FleetOptions, gpu_groups
from launcher.release.channel import Channel
from launcher.release.manifest import (
    MANIFEST,
    SIGNATURE,
    ReleaseManifest,
    ReleaseRefused,
    trusted_keys,
    verify,
)
from launcher.release.published import pull_release, pull_verified
from validator import errors
from validator.config import read_json_object, resolve_config
from validator.errors import ExitCode, outcome_of
from validator.options import missing_for_module
from validator.registry import load_module_class, load_module_spec
from validator.shard import parse_shard
from validator.spec import load_spec
from validator.state.journal import Journal
from validator.state.owner import StateDirLock

PAGE = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"
CODE_SPAN = re.compile(r"`([^`]+)`")
DIGEST = "sha256:" + "a" * 64


def cells(line: str) -> list[str]:
    """A table row's cells; a pipe inside a code span does not split."""
    found, cell, in_code = [], "", False
    for char in line.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            found.append(cell.strip())
            cell = ""
        else:
            cell += char
    return [*found, cell.strip()]


def table(heading: str) -> list[list[str]]:
    """The body rows of the first table under `## heading`."""
    section = PAGE.read_text(encoding="utf-8").split(f"\n## {heading}\n", 1)[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2, f"no table under {heading!r} in {PAGE.name}"
    return [cells(line) for line in rows[2:]]


def test_the_exit_code_table_is_exit_code():
    documented = {int(row[0]) for row in table("Exit codes")}
    assert documented == {int(code) for code in ExitCode}


def test_where_a_failure_lands_is_what_outcomes_says():
    rows = table("Where an assignment's failure lands")
    assert len(rows) == len(errors.OUTCOMES)  # a row per verdict
    seen = set()
    for raised, _assignment, validator in rows:
        name = CODE_SPAN.search(raised).group(1)  # the exception the row is about
        exc_type = getattr(errors, name, None) or __builtins__[name]
        outcome = outcome_of(exc_type("what a module raised"))
        seen.add(outcome.verdict)
        said = re.fullmatch(r"exits (\d+)|goes on", validator)
        assert said, validator
        code = int(said.group(1)) if said.group(1) else None
        assert code == outcome.exit_code, (name, validator, outcome)
    assert seen == set(errors.OUTCOMES)


# --- By error line: the code's error for each line the page names ------------------------------

Produced = tuple[str, int]  # the line, the exit code


def _launch(error: LaunchError) -> Produced:
    return str(error), int(error.exit_code)


def _validator(call: Callable[[], object]) -> Produced:
    """What `python -m validator` ends with when `call` raises: the exit code of the exception's
    verdict (validator/entrypoint.py's _exit_code_for)."""
    with pytest.raises(errors.OperatorError) as raised:
        call()
    code = outcome_of(raised.value).exit_code
    assert code is not None
    return str(raised.value), int(code)


def _missing(task_ids: str | None, secrets: dict[str, str], module: str = "lora") -> Produced:
    message = missing_for_module(task_ids, secrets, load_module_spec(module), environ={})
    assert message is not None
    return message, click.UsageError(message).exit_code  # the validator's CLI raises it


def _not_a_json_file(tmp_path: Path, name: str, make: Callable[[Path], object]) -> Produced:
    path = tmp_path / f"{name}.json"  # each span of a row its own: a FIFO would take a write
    make(path)
    return _validator(lambda: read_json_object(path, "of settings"))


def _input_without_a_field(tmp_path: Path) -> Produced:
    """--check's input without a field of the module's input schema (validator/check.py)."""
    from validator.check import run_check
    from validator.kit.base import BaseInputData, BaseValidationModule
    from validator.scoring import ModulePool

    class Input(BaseInputData):
        max_params: int

    class Module(BaseValidationModule):
        input_data_schema = Input

        def validate(self, data):
            raise AssertionError("never scored: the input does not fit")

    given = tmp_path / "input.json"
    given.write_text("{}")
    pool = ModulePool(Module, "mine", tmp_path)
    return _validator(lambda: run_check(pool, given))


def _check_unreached() -> Produced:
    """--check's line when the Hub cannot be reached (the kit's hub raises TransientError)."""
    from validator import check

    said: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = said.append  # type: ignore[method-assign]
    logging.getLogger(check.__name__).addHandler(handler)
    try:
        unreached = errors.TransientError("submission hub/x: could not reach the Hub: refused")
        code = check._told(unreached)
    finally:
        logging.getLogger(check.__name__).removeHandler(handler)
    return said[-1].getMessage(), int(code)


def _gpus(gpus: str, per_worker: int | None) -> Produced:
    options = FleetOptions("lora", gpus, True, per_worker, None, None, "1", None, None)
    with pytest.raises(LaunchError) as raised:
        gpu_groups(options)
    return _launch(raised.value)


def _state_in_use(tmp_path: Path) -> Produced:
    first = StateDirLock(tmp_path / "state")
    try:
        return _validator(lambda: StateDirLock(tmp_path / "state"))
    finally:
        first.release()


def _no_room(tmp_path: Path) -> Produced:
    journal = Journal(tmp_path / "state")
    try:
        refusal = journal.disk.refusal("below the free-space floor")
    finally:
        journal.close()

    def write() -> None:
        raise refusal

    return _validator(write)


def _broken_journal(tmp_path: Path) -> Produced:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "journal.sqlite3").write_bytes(b"not a database\n" * 100)
    return _validator(lambda: Journal(tmp_path / "state"))


def _bad_config(tmp_path: Path, monkeypatch) -> Produced:
    monkeypatch.chdir(tmp_path)
    Path("configs").mkdir()
    Path("configs/rl.json").write_text(json.dumps({"no_such_key": 1}))
    schema = load_module_class("rl").config_schema
    return _validator(lambda: resolve_config(schema, Path("configs"), "rl"))


def _no_spec(tmp_path: Path) -> Produced:
    (tmp_path / "modules" / "mine").mkdir(parents=True)
    return _validator(lambda: load_spec(tmp_path / "modules" / "mine"))


def _unverified(tmp_path: Path, change: str) -> Produced:
    """The line of a release that does not verify (launcher/release/manifest.py), signed with a key
    made
    here: by a key this checkout does not trust, or a manifest changed after signing."""
    from devkit.release_channel import ReleaseKey

    made, checkout = ReleaseKey(), tmp_path / change
    (checkout / "launcher" / "release").mkdir(parents=True)
    (ReleaseKey() if change == "untrusted" else made).trust_in(checkout)
    files = made.release("0.1.1", {"rl": DIGEST}).files
    manifest = files[MANIFEST]
    if change == "tampered":
        manifest = manifest.replace(DIGEST.encode(), ("sha256:" + "b" * 64).encode())
    keys = trusted_keys(checkout / "launcher" / "release" / "release_keys.json")
    with pytest.raises(ReleaseRefused) as raised:
        verify(manifest, files[SIGNATURE], "0.1.1", keys)
    return _launch(raised.value)


class _Registry:
    """An engine whose pull of a digest ends in `error` (what Docker's SDK gives for a registry
    that no longer holds the digest a release signed, or that nobody answers at; the real
    registry's cases are tests/test_released_images.py)."""

    def __init__(self, error: str) -> None:
        self.images, self.api = self, self
        self.error = error

    def get(self, reference):
        raise ImageNotFound(reference)

    def pull(self, name, tag, stream, decode):
        yield json.dumps({"error": self.error.format(name=name, tag=tag)}).encode() + b"\n"


def _not_pulled(error: str) -> Produced:
    from devkit.release_channel import ReleaseKey

    manifest = ReleaseManifest.model_validate_json(
        ReleaseKey().release("0.1.1", {"rl": DIGEST}).files[MANIFEST]
    )
    # The pull's own connection to the engine is the fake's API.
    own_api = mock.patch.object(pulls, "own_api", lambda client: nullcontext(client.api))
    with own_api, pytest.raises(ReleaseRefused) as raised:
        pull_release(_Registry(error), "127.0.0.1:5000/flock", "rl", manifest)
    return _launch(raised.value)


def _release_not_had(monkeypatch) -> Produced:
    """run.py --pull when this checkout trusts no release key yet (nothing is asked)."""
    monkeypatch.setattr("launcher.release.channel.trusted_keys", dict)
    channel = Channel("https://github.com/FLock-io/flock-validator")
    with pytest.raises(ReleaseRefused) as raised:
        pull_verified(None, "ghcr.io/flock-io", "rl", "0.1.0", channel)  # type: ignore[arg-type]
    return _launch(raised.value)


def _run_py_usage(*args: str) -> Produced:
    """What run.py's command line says of `args` (launcher/commands/run.py; one line, exit 2)."""
    from launcher.commands.run import run

    with pytest.raises(click.UsageError) as raised:
        run.make_context("run.py", list(args))
    return raised.value.format_message(), raised.value.exit_code


def _host_config(tmp_path: Path) -> Produced:
    from launcher.commands.launch import check_configs

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "rl.json").write_text(json.dumps({"seeed": 1}))
    with pytest.raises(LaunchError) as raised:
        check_configs(load_module_spec("rl"), tmp_path / "configs", [])
    return _launch(raised.value)


def _old_driver(monkeypatch) -> Produced:
    """What run.py says of an R535 driver (nvidia-smi cannot run here: its reading stands in)."""
    from launcher.doctor import driver

    monkeypatch.setattr(driver, "read_driver", lambda: ((535, 183, 1), ""))
    verdict = driver.check_driver(load_module_spec("lora"))
    assert not verdict.ok and verdict.known
    return verdict.line, int(ExitCode.OPERATOR)  # launcher/commands/run.py raises it as LaunchError


def _setup_fails() -> Produced:
    """The validator's line when a module's check_setup refuses (entrypoint: headline: why)."""
    from validator.config import check_module_setup
    from validator.kit.base import BaseConfig, BaseValidationModule

    class Refusing(BaseValidationModule):
        @classmethod
        def check_setup(cls, config):
            raise errors.OperatorError("missing OPENAI_BASE_URL: the judge endpoint")

    with pytest.raises(errors.OperatorError) as raised:
        check_module_setup(Refusing, "llm_judge", [BaseConfig()])
    outcome = outcome_of(raised.value)
    return f"{outcome.headline}: {raised.value}", int(outcome.exit_code)


def _task_of_another_module() -> Produced:
    """The validator's line for rl started on a lora task (validator/ledger/task_types.py)."""
    import threading

    from validator.ledger.answers import Task
    from validator.ledger.task_types import check_task_types_at_start
    from validator.spec import REPO_ROOT, find_modules

    modules = find_modules(REPO_ROOT)
    listed = [Task(id="56", task_type="training")]
    with pytest.raises(errors.OperatorError) as raised:
        check_task_types_at_start(
            lambda: listed, ["56"], modules["rl"], modules, threading.Event(), 1.0
        )
    outcome = outcome_of(raised.value)
    return f"{outcome.headline}: {raised.value}", int(outcome.exit_code)


def _unfit_bound(monkeypatch) -> Produced:
    """The line at start when a child's bound is above the validator's hard RLIMIT_AS (this
    process's own cannot be lowered and raised back: the hard limit the check reads stands in;
    tests/test_child_bounds.py lowers a real one)."""
    from validator.config import check_module_setup
    from validator.kit.base import BaseConfig, BaseValidationModule
    from validator.sandbox import child_bounds
    from validator.sandbox.child_result import ChildLimits

    class Bounded(BaseValidationModule):
        @classmethod
        def child_limits(cls, config):
            return {"inference_memory_bytes": ChildLimits(60, memory_bytes=8 * 1024**3)}

    monkeypatch.setattr(child_bounds, "may_raise_hard_limits", lambda: False)
    monkeypatch.setattr(child_bounds.resource, "getrlimit", lambda _: (8 * 1024**3,) * 2)
    with pytest.raises(errors.OperatorError) as raised:
        check_module_setup(Bounded, "rl", [BaseConfig()])
    outcome = outcome_of(raised.value)
    return f"{outcome.headline}: {raised.value}", int(outcome.exit_code)


def _refused_limit() -> Produced:
    """The line when a child's set-up could not take its limit (what it said, then the rest)."""
    from validator.sandbox.child_bounds import refused

    said = "RLIMIT_AS of 8606711808 bytes (its 16777216 after the preloads, and memory_bytes) is "
    said += "above the hard limit of 8589934592 it inherited (not allowed to raise maximum limit)"

    def child() -> None:
        raise refused(said)

    line, code = _validator(child)
    return f"assignment 1 kept for a retry after you fix this: {line}", code


class _Engine:
    """An engine holding an old-named journal that a container still uses, or whose move into
    the worker's volume fails (the real engine's moves: tests/faults/test_moves.py)."""

    def __init__(self, used: bool) -> None:
        self.used = used
        self.containers = self

    def list(self, filters=None, **_):
        if "label" in (filters or {}):  # no move of it left by an earlier start
            return []
        found = type("Container", (), {"name": "flock-validator-lora-gpu0-1", "labels": {}})
        return [found] if self.used else []

    def create(self, *_args, **_kwargs):
        return _FailedMove()


class _FailedMove:
    """The move's container, which answers that the worker's volume has no room."""

    def attach(self, **_):
        return iter([(b'{"outcome": "failed", "problem": "No space left on device"}\n', None)])

    def start(self) -> None:
        pass


def _old_volume(used: bool) -> Produced:
    from launcher.fleet.plan import Worker
    from launcher.fleet.volumes import _move

    worker = Worker(0, "flock-validator-lora", "0", "flock-validator-lora-state", None, None)
    with pytest.raises(LaunchError) as raised:
        _move(_Engine(used), "image", "lora", "flock-validator-lora-gpu0-state", worker)
    return _launch(raised.value)


# Keyed by a code span of the page's first column (the row's whole first cell where it has
# none): each gives the line and the exit code the code has for it.
PRODUCERS: dict[str, Callable[[Path, pytest.MonkeyPatch], Produced]] = {
    "cannot reach the Docker engine (...)": lambda *_: _launch(
        unreachable(DockerException("Error while fetching server API version"))
    ),
    "GPUs were requested but this Docker engine cannot provide them": lambda *_: _launch(
        refused_to_run(APIError("500", explanation='could not select device driver ""'))
    ),
    "the NVIDIA container runtime could not give the container its GPUs": lambda *_: _launch(
        refused_to_run(APIError("500", explanation="nvidia-container-cli: initialization error"))
    ),
    "base image '...' cannot be pulled (...)": lambda *_: _launch(
        base_unavailable("example/base:1", "manifest unknown")
    ),
    "missing --task_ids / TASK_IDS": lambda *_: _missing(None, {}),
    "missing --flock-api-key / FLOCK_API_KEY": lambda *_: _missing("1", {}),
    "missing --hf-token / HF_TOKEN": lambda *_: _missing("1", {"FLOCK_API_KEY": "k"}),
    "missing OPENAI_BASE_URL: ...": lambda *_: _missing(
        "1", {"FLOCK_API_KEY": "k", "HF_TOKEN": "h", "OPENAI_API_KEY": "o"}, "llm_judge"
    ),
    "Invalid value for '--assignment-lookup-interval': 'nan' is not a finite number": (
        lambda *_: _run_py_usage(
            "rl", "--task_ids", "1", "--assignment-lookup-interval", "nan", "--plan"
        )
    ),
    "... is a FIFO, not a regular file: give a JSON file": lambda tmp, _: _not_a_json_file(
        tmp, "fifo", os.mkfifo
    ),
    "...: JSON nested deeper than 32 levels": lambda tmp, _: _not_a_json_file(
        tmp, "deep", lambda path: path.write_text("[" * 33 + "]" * 33)
    ),
    "...: NaN is not a number JSON has: give a finite number": lambda tmp, _: _not_a_json_file(
        tmp, "nan", lambda path: path.write_text('{"seed": NaN}')
    ),
    "...: assignment input does not fit <module_class>: missing field '...'": lambda tmp, _: (
        _input_without_a_field(tmp)
    ),
    "transient fault, not the submission's: ...; ... then run --check again": lambda *_: (
        _check_unreached()
    ),
    "--gpus ...: use all, none, or device ids such as 0,1": lambda *_: _gpus("0,x", None),
    "--gpus-per-worker ...": lambda *_: _gpus("0,1", 0),
    "state directory ... is in use by another validator process": lambda tmp, _: _state_in_use(tmp),
    "state dir ... cannot take journal writes (...)": lambda tmp, _: _no_room(tmp),
    "a journal that is not SQLite, damaged or of another schema": lambda tmp, _: _broken_journal(
        tmp
    ),
    "--shard ...": lambda *_: _validator(lambda: parse_shard("2/2")),
    "configs/<module>.json: ...": _bad_config,
    "... is missing: every module has a spec": lambda tmp, _: _no_spec(tmp),
    "release v... which this checkout does not trust": lambda tmp, _: _unverified(tmp, "untrusted"),
    "... the signature ... is wrong": lambda tmp, _: _unverified(tmp, "tampered"),
    "the registry holds no ...@sha256:...": lambda *_: _not_pulled(
        "manifest for {name}@{tag} not found: manifest unknown"
    ),
    "release v... cannot be verified (...): nothing was run; ...": lambda _, patch: (
        _release_not_had(patch)
    ),
    "published image ... not pulled (...): nothing was run; ...": lambda *_: _not_pulled(
        "Get https://127.0.0.1:5000/v2/: dial tcp 127.0.0.1:5000: connect: connection refused"
    ),
    "No such option '--gpu'. (Did you mean one of: '--gpus', ...?)": lambda *_: _run_py_usage(
        "lora", "--gpu", "0", "--task_ids", "1", "--plan"
    ),
    "'abc' is not a task id: ...": lambda *_: _run_py_usage("rl", "--task_ids", "abc", "--plan"),
    "invalid config: .../configs/<module>.json: unknown key 'seeed' (did you mean 'seed'?)": (
        lambda tmp, _: _host_config(tmp)
    ),
    "NVIDIA driver 535.183.01: lora's CUDA 13.0 needs driver R580 (580.65.06) or newer": (
        lambda _, patch: _old_driver(patch)
    ),
    "operator action needed: module <module>'s start-up checks: ...": lambda *_: _setup_fails(),
    "operator action needed: task 56 has type 'training', the lora module's, not rl's: validate "
    "it with python run.py lora --task_ids 56; ...": lambda *_: _task_of_another_module(),
    "... (compose.gpus.yaml's name before for a journal) is used by ...": lambda *_: _old_volume(
        True
    ),
    "... could not be moved to ...": lambda *_: _old_volume(False),
    "the validator hit a fault only a new process recovers from (exit 100)": lambda *_: (
        EXIT_MESSAGES[ExitCode.RESTART],
        int(ExitCode.RESTART),
    ),
    "operator action needed: ...: a bounded child needs ..., more than this process's hard ... "
    "leaves": lambda _, patch: _unfit_bound(patch),
    "... a bounded child could not take its limits: ...": lambda *_: _refused_limit(),
    "the validator was killed by SIGXCPU (exit 152) ... times in a row; see its log above": (
        lambda *_: (killed_in_a_row(152, 6), 152)
    ),
    "the validator was killed (exit 137): out of memory, or killed from outside": lambda *_: (
        EXIT_MESSAGES[KILLED_EXIT],
        KILLED_EXIT,
    ),
}
# Lines that end nothing by themselves: the exit column is empty, or a worker's own code.
PASSED_ON = {
    "published image ... not pulled (...): staying on v..., pulled again at the next look": "",
    "following releases: this look failed (...); looking again later": "",
    "could not list tasks (...): no task is looked up before its type is checked; asking again "
    "in ...": "",
    "task ... has type '...', which no module declares (...): looked up all the same": "",
    "... cannot be opened whole (...): its ... readable rows are moved into ...": "",
    "...: a validator left running by a run.py that ended without stopping it (...)": "",
    "worker flock-validator-<module>-K stopped for good (exit N); ... go on": "N",
    "...: the answer nests deeper than the 64 levels any answer may have": "",
    "warning: ... workers share ... task ids: ...": "",
    "the validator was killed (exit N); restarting in ...s (SIG..., not sent by run.py)": "",
}


def pattern(span: str) -> re.Pattern:
    """A span of the page as a pattern: `...` and `<name>` stand for any text."""
    parts = re.split(r"(\.\.\.|<[a-z_]+>)", span)
    return re.compile(
        "".join(".+" if p == "..." or p.startswith("<") else re.escape(p) for p in parts)
    )


ERROR_LINES = table("By error line")


@pytest.mark.parametrize("row", ERROR_LINES, ids=[row[0][:50] for row in ERROR_LINES])
def test_each_error_line_has_the_exit_code_the_code_gives_it(row, tmp_path, monkeypatch):
    first, exit_column, _what = row
    spans = CODE_SPAN.findall(first) or [first]
    if spans[0] in PASSED_ON:
        assert exit_column == PASSED_ON[spans[0]]
        return
    for span in spans:
        assert span in PRODUCERS, f"no error in the code found for {span!r}: add it to PRODUCERS"
        line, code = PRODUCERS[span](tmp_path, monkeypatch)
        if span != first:  # a span is the line's own words
            assert pattern(span).search(line), f"the page says {span!r}, the code {line!r}"
        assert exit_column == str(code), f"{span!r}: the page says exit {exit_column}, not {code}"


def test_every_error_line_the_test_knows_is_on_the_page():
    on_page = {span for row in ERROR_LINES for span in CODE_SPAN.findall(row[0]) or [row[0]]}
    assert set(PRODUCERS) | set(PASSED_ON) == on_page
