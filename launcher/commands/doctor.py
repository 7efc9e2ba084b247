"""`python run.py doctor [MODULE]`: this host checked for MODULE (or only Docker and the GPUs),
then the services the validator would check itself, one line per check (launcher/doctor/);
exit 0 when nothing failed, 1 otherwise, 2 for usage."""

from __future__ import annotations

import sys
from typing import Any

import click

from launcher.errors import UsageError
from launcher.options import (
    base_image_option,
    env_installer_option,
    lock_option,
    pip_options_option,
)
from validator.doctor.options import (
    DEADLINE_OPTION,
    JUDGE_MODEL_OPTION,
    hf_free_gb_option,
    service_options,
)
from validator.errors import ConfigError, ExitCode
from validator.options import config_dir_option, finite

DEFAULT_MIN_GPU_GB = 16.0


@click.command(
    "doctor", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.argument("module", required=False)
@service_options
@config_dir_option("The configs run.py will mount [default: ./configs].")
@base_image_option("The base run.py builds the module's image on (names the image checked).")
@env_installer_option("As run.py's (names the image checked).")
@pip_options_option("As run.py's (names the image checked).")
@lock_option("As run.py's (names the image checked).")
@hf_free_gb_option("--min-free-gb", "Free space Docker's volumes (the HF cache, the journal) need.")
@click.option(
    "--min-gpu-gb",
    type=finite(0),
    default=DEFAULT_MIN_GPU_GB,
    show_default=True,
    help="Free memory each GPU needs for the module's bases.",
)
@JUDGE_MODEL_OPTION
@DEADLINE_OPTION
def doctor(module: str | None, **options: Any) -> None:
    """Check this host for MODULE (or only Docker and the GPUs): one line per check."""
    # The checks (Docker's client, the Fed Ledger's, the Hub's): only once the options are read.
    from launcher.doctor.host import doctor as rows_of  # noqa: PLC0415
    from validator.doctor.rows import exit_code, render  # noqa: PLC0415

    try:
        rows, secrets = rows_of(module, **options)
    except (UsageError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.USAGE))
    print(render(rows, secrets))
    sys.exit(exit_code(rows))
