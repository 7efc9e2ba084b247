"""Command-line rules shared by the inner CLI and the launcher, so both say the same thing.

The options that more than one command takes (run.py, its doctor, `python -m validator`, its
doctor) are declared here once: the flag names, variable, default and value check are one
idea wherever they appear. Only the help is a command's own, where it says what that command
does with the value; the factories take it.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from validator.disk import DEFAULT_MIN_FREE_MB
from validator.secrets import normalise_secret
from validator.spec import CORE_SECRETS, REPO_ROOT, ModuleSpec

# The Fed Ledger the validator and its doctor talk to unless --api-url / FLOCK_API_URL says.
DEFAULT_API_URL = "https://fed-ledger-prod.flock.io/api/v1"
TASK_IDS_OPTION = "--task_ids / TASK_IDS"
FLOCK_API_KEY_OPTION = "--flock-api-key / FLOCK_API_KEY"
HF_TOKEN_OPTION = "--hf-token / HF_TOKEN"
# The variables of --hf-cache-max-gb and --state-dir: the entrypoint puts the options' values in
# the run context (validator/run_context.py), which reads the variables outside a run.
HF_CACHE_BUDGET_ENV = "VALIDATOR_HF_CACHE_MAX_GB"
# The disk guard's floor for the state dir (validator/disk.py): one declaration for the loop and
# its doctor, which checks the same floor.
MIN_FREE_MB_OPTION = click.option(
    "--min-free-mb",
    envvar="VALIDATOR_MIN_FREE_MB",
    type=click.IntRange(min=0),
    default=DEFAULT_MIN_FREE_MB,
    show_default=True,
    help="Free space (MiB) the state dir's file system must have before each lookup or "
    "scoring; below it, or when a test write fails, exit 3 without asking for work.",
)
# How long a finished assignment stays in the journal in full (validator/state/upkeep.py).
DEFAULT_JOURNAL_KEEP_DAYS = 30
JOURNAL_KEEP_DAYS_OPTION = click.option(
    "--journal-keep-days",
    envvar="VALIDATOR_JOURNAL_KEEP_DAYS",
    type=click.IntRange(min=0),
    default=DEFAULT_JOURNAL_KEEP_DAYS,
    show_default=True,
    help="Days a finished assignment stays in the journal in full (input, metrics, reason, "
    "events); older ones are compacted once a day into the counts and scores per hour and task "
    "that the report shows (0: keep every row).",
)
STATE_DIR_ENV = "VALIDATOR_STATE_DIR"
# The validator's configs folder; run.py and its doctor read none (the folder they name is
# mounted as the container's), so only the validator's commands pass it.
CONFIG_DIR_ENV = "VALIDATOR_CONFIG_DIR"
# Secrets that also have an option; a module's other secrets are env vars only.
SECRET_OPTIONS = {"FLOCK_API_KEY": FLOCK_API_KEY_OPTION, "HF_TOKEN": HF_TOKEN_OPTION}
# The Fed Ledger's task ids are positive whole numbers; 18 digits keep one far from any limit.
TASK_ID = re.compile(r"[1-9][0-9]{0,17}")
# What an option factory's decorator takes and gives back: a command's function.
F = TypeVar("F", bound=Callable[..., Any])


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange that also refuses `nan`, `inf` and `-inf`: nan passes every
    comparison of a range (a lookup interval of nan made a busy loop that /healthz called
    healthy), and no setting of the validator means anything at infinity."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


def finite(min: float, *, min_open: bool = False, max: float | None = None) -> FiniteFloatRange:
    """A float option's type: finite, at least `min` (over it with `min_open`), at most `max`."""
    return FiniteFloatRange(min=min, min_open=min_open, max=max)


# Seconds that only a positive number makes sense of (a wait, an interval).
POSITIVE_SECONDS = finite(0, min_open=True)


def task_id_list(value: str) -> list[str]:
    """`--task_ids` / TASK_IDS as a list, duplicates dropped, order kept; raises
    click.BadParameter naming the first id that is not a positive whole number. One rule for
    run.py, the validator and both doctors, so that a mistake is refused at the door."""
    ids = [part.strip() for part in value.split(",")]
    if not all(ids):
        raise click.BadParameter(f"{value!r} has an empty task id; give e.g. 12,34")
    for task_id in ids:
        if not TASK_ID.fullmatch(task_id):
            raise click.BadParameter(
                f"{task_id!r} is not a task id: give the Fed Ledger's task ids, positive whole "
                "numbers separated by commas, e.g. 12,34"
            )
    return list(dict.fromkeys(ids))


def parse_task_ids(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> list[str] | None:
    """The click callback of every `--task_ids` option (TASK_IDS included: click passes the
    variable's value through it too). None or empty: not given."""
    return task_id_list(value) if value else None


def task_ids_option(help: str) -> Callable[[F], F]:
    """`--task_ids` (and `--task-ids`) / TASK_IDS, checked at the door by parse_task_ids."""
    return click.option(
        "--task_ids",
        "--task-ids",
        "task_ids",
        envvar="TASK_IDS",
        callback=parse_task_ids,
        help=help,
    )


def flock_api_key_option() -> Callable[[F], F]:
    """`--flock-api-key` / FLOCK_API_KEY."""
    return click.option("--flock-api-key", envvar="FLOCK_API_KEY", help="Fed Ledger API key.")


def hf_token_option(help: str = "HuggingFace token.") -> Callable[[F], F]:
    """`--hf-token` / HF_TOKEN; the commands that run a module say which need it."""
    return click.option("--hf-token", envvar="HF_TOKEN", help=help)


def api_url_option() -> Callable[[F], F]:
    """`--api-url` / FLOCK_API_URL, the Fed Ledger's production address unless given."""
    return click.option(
        "--api-url",
        envvar="FLOCK_API_URL",
        default=DEFAULT_API_URL,
        show_default=True,
        help="Fed Ledger base URL.",
    )


def config_dir_option(help: str, envvar: str | None = None) -> Callable[[F], F]:
    """`--config-dir`: an existing folder, the checkout's configs/ unless given (shown as
    ./configs, not as this checkout's absolute path)."""
    return click.option(
        "--config-dir",
        envvar=envvar,
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=REPO_ROOT / "configs",
        help=help,
    )


def state_dir_option(help: str) -> Callable[[F], F]:
    """`--state-dir` / VALIDATOR_STATE_DIR: the journal's folder, ./state unless given."""
    return click.option(
        "--state-dir",
        envvar=STATE_DIR_ENV,
        type=click.Path(path_type=Path),
        default=Path("state"),
        show_default=True,
        help=help,
    )


def secret_label(name: str) -> str:
    """How the operator gives secret `name`: its option and variable, or the variable."""
    return SECRET_OPTIONS.get(name, name)


def secret_names(spec: ModuleSpec) -> list[str]:
    """Every secret a validator of this module takes: the core's, the HF token (used when given,
    required only where declared), and the module's own."""
    return list(dict.fromkeys([*CORE_SECRETS, "HF_TOKEN", *spec.secrets]))


def normalise_named_secrets(values: Mapping[str, str | None]) -> dict[str, str | None]:
    """The secrets as they are to be used and redacted, by variable name; raises
    MalformedSecret (a ConfigError) naming the variable of a value no header could carry."""
    return {name: normalise_secret(value, secret_label(name)) for name, value in values.items()}


def gathered_secrets(
    names: Iterable[str], flock_api_key: str | None, hf_token: str | None
) -> dict[str, str | None]:
    """The secrets `names`, normalised, by variable name: the two with options from the command
    line (click has already read their variables), a module's own from the environment only."""
    given = {"FLOCK_API_KEY": flock_api_key, "HF_TOKEN": hf_token}
    return normalise_named_secrets({name: given.get(name, os.environ.get(name)) for name in names})


def given_unstripped(secrets: Mapping[str, str | None], environ: Mapping[str, str]) -> list[str]:
    """The secrets whose variable holds surrounding whitespace: a module that reads it from
    `os.environ` (the earlier API; the validator no longer writes the stripped value there)
    gets it as given, `current_run().secret(name)` stripped."""
    return [
        name
        for name, value in secrets.items()
        if value and environ.get(name, value) != value and environ[name].strip() == value
    ]


def missing_settings(
    task_ids: object,
    secrets: Mapping[str, str | None],
    spec: ModuleSpec,
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """Every setting that only `--check` may leave out and that is not given, each as the
    operator gives it (its option and variable, and what it is for): the task ids, the
    secrets, and the module's `required_env` as `environ` (this process's) holds them."""
    environ = os.environ if environ is None else environ
    missing = [] if task_ids else [TASK_IDS_OPTION]
    for name in (*CORE_SECRETS, *spec.secrets):
        if not secrets.get(name):
            needed = "" if name in CORE_SECRETS else f": {spec.secrets[name]}, for {spec.name}"
            missing.append(f"{secret_label(name)}{needed}")
    for name, what in spec.required_env.items():
        if not environ.get(name, "").strip():
            missing.append(f"{name}: {what}, for {spec.name}")
    return missing


def missing_for_module(
    task_ids: object,
    secrets: Mapping[str, str | None],
    spec: ModuleSpec,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """One line naming every missing setting at once (a fix, then the next refusal, is a slow
    way to learn them), or None."""
    missing = missing_settings(task_ids, secrets, spec, environ)
    if not missing:
        return None
    them = "it" if len(missing) == 1 else "them"
    return f"missing {'; missing '.join(missing)} (only --check runs without {them})"
