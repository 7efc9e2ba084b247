"""`python -m validator doctor MODULE`: the doctor's checks from inside the module's image
(validator/doctor/checks.py): the settings, the configs, the module's own start-up
checks, the Fed Ledger and the key, the clock, the journal's and the HF cache's disks, the Hub.
`python run.py doctor MODULE` adds the host's rows, and reads this one's module row back
(`--only "module setup" --json`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from validator.config import with_class_task_type
from validator.doctor.checks import Settings, service_checks
from validator.doctor.options import (
    DEADLINE_OPTION,
    JUDGE_MODEL_OPTION,
    hf_free_gb_option,
    service_options,
)
from validator.doctor.rows import exit_code, render, render_json, run_checks
from validator.errors import ConfigError, ExitCode
from validator.options import (
    CONFIG_DIR_ENV,
    MIN_FREE_MB_OPTION,
    config_dir_option,
    gathered_secrets,
    secret_names,
    state_dir_option,
)
from validator.registry import load_module_class, load_module_spec, module_roots
from validator.run_context import RunContext, running
from validator.spec import module_folder, readable_modules


def default_hf_cache() -> Path:
    """Where huggingface_hub keeps its cache: HF_HOME (the image sets /data/hf-cache)."""
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("module", envvar="VALIDATOR_MODULE")
@service_options
@state_dir_option("The journal's folder: its disk, and the judge texts cached there.")
@config_dir_option("Module and task configs [default: ./configs].", CONFIG_DIR_ENV)
@click.option(
    "--hf-cache-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="The HF cache's folder, for its disk [default: $HF_HOME].",
)
@MIN_FREE_MB_OPTION
@hf_free_gb_option("--hf-min-free-gb", "Free space the HF cache needs for the next base.")
@JUDGE_MODEL_OPTION
@DEADLINE_OPTION
@click.option("--json", "as_json", is_flag=True, help="The rows as JSON, for machines.")
@click.option("--only", "only", multiple=True, hidden=True)  # run.py: the rows it reads back
def main(
    module: str,
    flock_api_key: str | None,
    hf_token: str | None,
    api_url: str,
    task_ids: list[str] | None,
    state_dir: Path,
    config_dir: Path,
    hf_cache_dir: Path | None,
    min_free_mb: int,
    hf_min_free_gb: float,
    judge_models: tuple[str, ...],
    deadline: float,
    as_json: bool,
    only: tuple[str, ...],
) -> None:
    """Check what MODULE's validator needs, from here: one line per check."""
    try:
        spec = load_module_spec(module)
        secrets = gathered_secrets(secret_names(spec), flock_api_key, hf_token)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.USAGE))
    try:
        module_cls = load_module_class(module)
    except Exception as exc:  # noqa: BLE001 - its row says why the module's checks cannot run
        print(f"warning: {exc}", file=sys.stderr)
        module_cls = None
    if module_cls is not None:
        spec = with_class_task_type(spec, module_cls)
    settings = Settings.given(
        spec,
        secrets,
        api_url,
        task_ids,
        config_dir,
        state_dir=state_dir,
        hf_cache_dir=hf_cache_dir or default_hf_cache(),
        min_free_mb=min_free_mb,
        hf_min_free_gb=hf_min_free_gb,
        judge_models=tuple(judge_models),
        module_cls=module_cls,
        folder=module_folder(module, *module_roots()),
        modules=readable_modules(*module_roots()),
    )
    checks = [c for c in service_checks(settings) if not only or set(c.names) & set(only)]
    # The module's checks read the state dir and their secrets from the run context, as in a
    # run; only while they run (a test or an embedding calls the doctor in its own process).
    with running(RunContext(state_dir, None, {k: v for k, v in secrets.items() if v})):
        rows = run_checks(checks, deadline)
    print(render_json(rows, secrets.values()) if as_json else render(rows, secrets.values()))
    sys.exit(exit_code(rows))
