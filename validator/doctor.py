"""`python -m validator doctor MODULE`: the doctor's checks from inside the module's image
(validator/observe/doctor_checks.py): the Fed Ledger and the key, the clock, the journal's and
the HF cache's disks, the Hub, the judge. `python run.py doctor MODULE` adds the host's rows."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from validator.errors import ConfigError, ExitCode
from validator.observe.doctor import exit_code, render
from validator.observe.doctor_checks import DEFAULT_HF_MIN_FREE_GB, Settings, service_rows
from validator.options import DEFAULT_API_URL, MIN_FREE_MB_OPTION, gathered_secrets, secret_names
from validator.registry import REPO_ROOT, load_module_spec


def default_hf_cache() -> Path:
    """Where huggingface_hub keeps its cache: HF_HOME (the image sets /data/hf-cache)."""
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("module", envvar="VALIDATOR_MODULE")
@click.option("--flock-api-key", envvar="FLOCK_API_KEY", help="Fed Ledger API key.")
@click.option("--hf-token", envvar="HF_TOKEN", help="HuggingFace token.")
@click.option("--api-url", envvar="FLOCK_API_URL", default=DEFAULT_API_URL, show_default=True)
@click.option("--task_ids", "--task-ids", "task_ids", envvar="TASK_IDS", default="")
@click.option(
    "--state-dir", envvar="VALIDATOR_STATE_DIR", type=click.Path(path_type=Path), default="state"
)
@click.option(
    "--config-dir",
    envvar="VALIDATOR_CONFIG_DIR",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=REPO_ROOT / "configs",
)
@click.option("--hf-cache-dir", type=click.Path(path_type=Path), default=None)
@MIN_FREE_MB_OPTION
@click.option(
    "--hf-min-free-gb",
    type=click.FloatRange(min=0),
    default=DEFAULT_HF_MIN_FREE_GB,
    show_default=True,
    help="Free space the HF cache needs for the next base.",
)
@click.option("--judge-model", "judge_models", multiple=True, help="A judge model to expect.")
def main(
    module: str,
    flock_api_key: str | None,
    hf_token: str | None,
    api_url: str,
    task_ids: str,
    state_dir: Path,
    config_dir: Path,
    hf_cache_dir: Path | None,
    min_free_mb: int,
    hf_min_free_gb: float,
    judge_models: tuple[str, ...],
) -> None:
    """Check what MODULE's validator needs, from here: one line per check."""
    try:
        spec = load_module_spec(module)
        secrets = gathered_secrets(secret_names(spec), flock_api_key, hf_token)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.USAGE))
    settings = Settings(
        spec,
        secrets.get("FLOCK_API_KEY"),
        secrets.get("HF_TOKEN"),
        api_url,
        tuple(part.strip() for part in task_ids.split(",") if part.strip()),
        config_dir,
        state_dir,
        hf_cache_dir or default_hf_cache(),
        min_free_mb,
        hf_min_free_gb,
        tuple(judge_models),
    )
    rows = service_rows(settings)
    print(render(rows, secrets.values()))
    sys.exit(exit_code(rows))
