"""The two programs' command lines (launcher/commands/program.py, validator/__main__.py): each
command's --help, every command line the docs show, a typo of a command's name, the earlier
spellings (each still works, with its warning), the command names no module may take, and what
`run.py --help` imports (options, not the loop). In this process (click's runner), but for the
imports, which only a fresh interpreter can show."""

from __future__ import annotations

import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from launcher.commands.program import COMMANDS as RUN_PY_COMMANDS
from launcher.commands.program import program
from tests.helpers.run_py import run_py, validator
from validator.__main__ import COMMANDS as VALIDATOR_COMMANDS
from validator.__main__ import program as validator_program
from validator._moved import ALIASES
from validator.errors import ConfigError
from validator.program import Program
from validator.spec import COMMANDS, REPO_ROOT, ModuleSpec, find_module_folders

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
PROGRAMS = {"python run.py": program, "python -m validator": validator_program}
# What the loop and the report bring, which the host's command line must not import.
LOOP = (
    "validator.runner",
    "validator.state.journal",
    "validator.observe.status_server",
    "validator.observe.telemetry",
    "matplotlib",
    "prometheus_client",
)


def each_command() -> list[tuple[str, list[str]]]:
    """(program, words naming a command) for every command and subcommand of both programs."""
    found = []
    for name, make in PROGRAMS.items():
        group = make()
        ctx = click.Context(group)
        for word in group.list_commands(ctx):
            command = group.get_command(ctx, word)
            found.append((name, [word]))
            if isinstance(command, click.Group):
                found += [(name, [word, sub]) for sub in command.list_commands(ctx)]
    return found


@pytest.mark.parametrize(
    ("name", "words"), each_command(), ids=lambda x: " ".join(x) if isinstance(x, list) else x
)
def test_every_command_has_its_help(name, words):
    result = (run_py if name == "python run.py" else validator)(*words, "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"Usage: {name} {' '.join(words)} ")


@pytest.mark.parametrize("name", PROGRAMS)
def test_the_programs_own_help_is_the_runs_with_the_commands(name):
    page = (run_py if name == "python run.py" else validator)("--help")
    assert page.exit_code == 0 and page.stdout.startswith(f"Usage: {name} run [OPTIONS] MODULE")
    if name == "python run.py":
        for listed in RUN_PY_COMMANDS.values():
            assert f"python run.py {listed.usage}" in page.stdout


# -- every documented command line ----------------------------------------------------------


def documented_lines() -> list[tuple[str, str]]:
    """(page, command line) for each `python run.py ...` and `python -m validator ...` in a code
    span or a code block of the README and docs/, less its comment, placeholders in brackets
    and what follows a `;`, `|` or redirection."""
    found = set()
    start = re.compile(r"python3? (?:run\.py|-m validator)\b")
    for page in PAGES:
        fenced = False
        for line in page.read_text().splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            shown = [re.sub(r"\s#.*", "", line)] if fenced else re.findall(r"`([^`]+)`", line)
            for code in shown:
                at = start.search(code)
                if at is None:
                    continue
                command = re.split(r"\s#|;|`|\||&&|\s>>?\s|\s2>", code[at.start() :])[0]
                command = re.sub(r"\[[^\]]*\]?", "", command).strip()
                found.add((page.name, command))
    return sorted(found)


def run_py_words(line: str) -> tuple[str, list[str]]:
    words = shlex.split(line)
    program_words = 2 if words[1] == "run.py" else 3
    return " ".join(["python", *words[1:program_words]]), words[program_words:]


def parsed(name: str, args: list[str]) -> click.Command:
    """The command `args` name, its options parsed and checked as a run would (a usage error
    raises); `...` given for an option's value, or a last option's value left out, stands for
    a value."""
    group = PROGRAMS[name]()
    ctx = group.make_context(name, list(args), resilient_parsing=False)
    words = [*ctx._protected_args, *ctx.args]
    _, command, rest = group.resolve_command(ctx, words)
    assert command is not None
    while isinstance(command, click.Group) and rest:
        _, command, rest = command.resolve_command(ctx, rest)
    values = {f for p in command.params if isinstance(p, click.Option) and not p.is_flag
              for f in p.opts}  # fmt: skip
    given = [
        "1" if word == "..." and i and rest[i - 1] in values else word
        for i, word in enumerate(rest)
    ]
    given = [word for word in given if word != "..."]
    if given and given[-1] in values:
        given.append("input.json")
    try:
        command.make_context(command.name, given, parent=ctx)
    except click.exceptions.Exit as exc:  # --help
        assert exc.exit_code == 0
    return command


LINES = documented_lines()
OLD = {alias.old for alias in ALIASES}


def test_the_docs_show_the_commands_of_both_programs():
    shown = {run_py_words(line)[0] for _, line in LINES}
    assert shown == set(PROGRAMS) and len(LINES) > 60


@pytest.mark.parametrize(("page", "line"), LINES, ids=[f"{p}: {line}" for p, line in LINES])
def test_every_documented_command_line_is_read_as_before(page, line, tmp_path, monkeypatch):
    """Parsed by the program the line names, its options checked as a run checks them; an
    earlier spelling (validator/_moved.py) is named only in the table of earlier spellings."""
    if line in OLD:
        return  # the spelling itself, as the table of earlier spellings lists it
    assert not line.startswith(("python -m validator new-module", "python -m launcher.")), line
    monkeypatch.chdir(tmp_path)
    (tmp_path / "input.json").write_text("{}")  # `--check input.json`, run.py's checks it is there
    name, args = run_py_words(line)
    args = ["lora" if re.fullmatch(r"MODULE|<\w+>", word) else word for word in args]
    words = [word for word in args if not word.startswith("-")][:2]
    assert not (len(words) == 2 and words[1] == "report" and name == "python run.py"), (
        f"{page}: {line} is an earlier spelling: python run.py report MODULE ..."
    )
    try:
        parsed(name, args)
    except (click.MissingParameter, click.exceptions.NoArgsIsHelpError):
        # A command named in prose (`python -m validator doctor`), not a command line.
        assert len(args) <= 1, f"{page}: {line}"


# -- typos, earlier spellings, names --------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "typo", "meant"),
    [(run_py, "docter", "doctor"), (run_py, "reprot", "report"), (validator, "repot", "report")],
)
def test_a_typo_of_a_commands_name_names_the_command(call, typo, meant):
    result = call(typo, "lora")
    assert result.exit_code == 2
    assert f"{typo!r} is neither a command nor a module: did you mean {meant!r}?" in result.stderr


def test_a_module_name_close_to_a_command_still_runs_the_module():
    group = Program("p", {"doctor": RUN_PY_COMMANDS["doctor"]}, "run", lambda: ["doctors"])
    assert group.for_default(["doctors", "--x"]) == ["run", "doctors", "--x"]
    with pytest.raises(click.UsageError, match="did you mean 'doctor'"):
        group.for_default(["docter"])


def test_the_earlier_report_spelling_runs_the_report_with_a_warning():
    result = run_py("rl", "--state-volume", "v", "report", "--json", "--html", "page.html")
    [warning, error] = result.stderr.splitlines()
    assert warning == (
        "[run.py] warning: python run.py MODULE report has moved to python run.py report MODULE "
        "(the old one goes in 0.3)"
    )
    assert error.startswith("[run.py] error: --json or --html, not both")  # the report's own
    assert result.exit_code == 2


def test_a_report_option_given_to_the_run_says_whose_it_is():
    result = run_py("lora", "--task_ids", "1", "--worker", "1", "--plan")
    assert result.exit_code == 2
    assert "--worker is the report's: python run.py report MODULE --worker" in result.stderr


@pytest.mark.parametrize(
    ("module", "new"),
    [
        ("launcher.compose", "compose"),
        ("launcher.kubernetes", "kubernetes"),
        ("launcher.release_cli", "release"),
        ("launcher.published", "release"),
    ],
)
def test_an_earlier_module_command_runs_its_new_one_with_a_warning(
    module, new, monkeypatch, capsys
):
    args = ["modules"] if new == "release" else ["--check"]
    monkeypatch.setattr(sys, "argv", [module, *args])
    with pytest.raises(SystemExit) as ended:
        runpy.run_module(module, run_name="__main__")
    assert ended.value.code == 0
    said = capsys.readouterr()
    assert said.err.splitlines()[0] == (
        f"[run.py] warning: python -m {module} has moved to python run.py {new} (the old one "
        "goes in 0.3)"
    )
    if new == "release":
        assert said.out == f"modules={list(find_module_folders())}\n".replace("'", '"')


def test_no_module_takes_a_commands_name():
    assert set(RUN_PY_COMMANDS) | set(VALIDATOR_COMMANDS) == COMMANDS
    for name in sorted(COMMANDS):
        with pytest.raises(ValueError, match=f"'{name}' is a command"):
            ModuleSpec(name=name)
    assert not COMMANDS & set(find_module_folders())


def test_a_module_folder_with_a_commands_name_is_refused_naming_it(tmp_path):
    from validator.spec import load_spec

    folder = tmp_path / "modules" / "report"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "module.yaml").write_text("name: report\n")
    with pytest.raises(ConfigError, match=r"'report' is a command \(python run.py report\)"):
        load_spec(folder)


# -- what the host imports ------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("args", [["--help"], ["doctor", "--help"]], ids=" ".join)
def test_run_pys_help_imports_options_not_the_loop(args):
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "run.py", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "validator.options" in imported  # the options, read from their one place
    assert sorted(imported & set(LOOP)) == []
    assert not {name for name in imported if name.split(".")[0] in ("docker", "cryptography")}
    assert Path(REPO_ROOT / "run.py").is_file()
