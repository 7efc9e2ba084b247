"""`python run.py doctor [MODULE]`: the host's rows (the Docker engine, Compose v2, the NVIDIA
driver against the module's CUDA, the NVIDIA runtime and a GPU seen from inside the module's
image, the NVIDIA Container Toolkit's version against its escape fixes, the image, the images
its validators run (Compose's and run.py's), the disk under Docker's volumes), then the rows the
validator would check itself (validator/doctor/checks.py): the settings, the configs, the Fed
Ledger and the key, the clock, the task types, the Hub, and the module's own start-up checks,
run in its image. A check that
cannot run here is a row that says what it needs. One table, within the deadline whatever the
servers do; exit 0 when nothing failed, 1 otherwise, 2 for usage."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import click
import docker

from launcher.commands.build_options import (
    base_image_option,
    env_installer_option,
    lock_option,
    pip_options_option,
)
from launcher.doctor.deployed_images import NAME as IMAGES_ROW
from launcher.doctor.deployed_images import deployed_images_row
from launcher.doctor.rows import (
    compose_row,
    docker_disk_row,
    driver_row,
    engine_row,
    gpu_row,
    image_exists,
    image_row,
    journals_row,
    setup_in_image,
)
from launcher.doctor.toolkit import NAME as TOOLKIT
from launcher.doctor.toolkit import toolkit_row
from launcher.engine.images import (
    DEFAULT_INSTALLER,
    DEFAULT_LOCK,
    PRODUCTION_BASE,
    BuildSpec,
    source_hash,
)
from launcher.errors import UsageError
from validator.doctor.checks import SETUP, Settings, service_checks
from validator.doctor.command import (
    DEADLINE_OPTION,
    JUDGE_MODEL_OPTION,
    hf_free_gb_option,
    service_options,
)
from validator.doctor.rows import Check, Row, exit_code, render, run_checks
from validator.errors import ConfigError, ExitCode
from validator.options import config_dir_option, finite, gathered_secrets, secret_names
from validator.spec import REPO_ROOT, ModuleSpec, load_spec, module_folder, readable_modules

DEFAULT_MIN_GPU_GB = 16.0


def image_tag(
    spec: ModuleSpec,
    base_image: str = PRODUCTION_BASE,
    installer: str = DEFAULT_INSTALLER,
    pip_options: str = "",
    lock: str = DEFAULT_LOCK,
) -> str:
    """The content-hash tag run.py would build or reuse for these sources
    (launcher/engine/images.py)."""
    build = BuildSpec(
        spec.name, REPO_ROOT, base_image, installer, pip_options, spec.environment, lock
    )
    return f"flock-validator-{spec.name.lower()}:{source_hash(build)[:12]}"


class Once:
    """A value computed once, by the first thread that asks; the others wait for it."""

    def __init__(self, make: Callable[[], tuple[Row, docker.DockerClient | None]]) -> None:
        self._make, self._lock = make, threading.Lock()
        self._value: tuple[Row, docker.DockerClient | None] | None = None

    def __call__(self) -> tuple[Row, docker.DockerClient | None]:
        with self._lock:
            if self._value is None:
                self._value = self._make()
            return self._value


def host_checks(
    spec: ModuleSpec | None,
    tag: str | None,
    engine: Once,
    min_gpu_gb: float,
    min_free_mb: int,
    pip_options: str = "",
) -> list[Check]:
    """The host's checks: the engine first, the rows that need it after it (or skipped)."""
    engine_fix = "check the Docker engine (systemctl status docker)"

    def with_engine(name: str, row: Callable[[docker.DockerClient], Row]) -> Check:
        def run() -> list[Row]:
            client = engine()[1]
            if client is None:
                return [Row.skipped(name, "the Docker engine (see its row)")]
            return [row(client)]

        return Check((name,), run, engine_fix)

    checks = [
        Check(("Docker engine",), lambda: [engine()[0]], engine_fix),
        Check(("Docker Compose v2",), lambda: [compose_row()], engine_fix),
    ]
    if spec is not None:
        checks.append(Check(("NVIDIA driver",), lambda: [driver_row(spec)], "check nvidia-smi"))

    def present(client):
        return tag if tag and image_exists(client, tag) else None

    checks.append(with_engine("GPU", lambda c: gpu_row(c, spec, present(c), min_gpu_gb)))

    def toolkit() -> list[Row]:
        client = engine()[1]  # the runtime Docker runs, where the engine names it
        runtimes = (client.info().get("Runtimes") or {}) if client is not None else {}
        return [toolkit_row(spec, (runtimes.get("nvidia") or {}).get("path"))]

    checks.append(Check((TOOLKIT,), toolkit, "check `nvidia-ctk --version`"))
    if spec is not None and tag is not None:
        checks.append(with_engine("image", lambda c: image_row(c, spec, tag)))
        checks.append(with_engine(IMAGES_ROW, lambda c: deployed_images_row(c, spec, pip_options)))
    checks.append(with_engine("disk: Docker volumes", lambda c: docker_disk_row(c, min_free_mb)))
    if spec is not None:
        checks.append(with_engine("journal volumes", lambda c: journals_row(c, spec)))
    return checks


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
def main(module: str | None, **options) -> None:
    """Check this host for MODULE (or only Docker and the GPUs): one line per check."""
    try:
        rows, secrets = doctor(module, **options)
    except (UsageError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.USAGE))
    print(render(rows, secrets))
    sys.exit(exit_code(rows))


def doctor(
    module: str | None,
    *,
    flock_api_key: str | None,
    hf_token: str | None,
    api_url: str,
    task_ids: list[str] | None,
    config_dir: Path,
    base_image: str,
    env_installer: str,
    pip_options: str,
    lock: str,
    min_free_gb: float,
    min_gpu_gb: float,
    judge_models: tuple[str, ...],
    deadline: float,
) -> tuple[list[Row], list[str | None]]:
    """The rows: the host's, then (with a module) the services'; and the secrets to redact."""
    spec = load_spec(module_folder(module)) if module else None
    secrets = gathered_secrets(
        secret_names(spec) if spec else ["FLOCK_API_KEY", "HF_TOKEN"], flock_api_key, hf_token
    )
    engine = Once(lambda: engine_row(deadline))
    tag = image_tag(spec, base_image, env_installer, pip_options, lock) if spec else None
    checks = host_checks(spec, tag, engine, min_gpu_gb, int(min_free_gb * 1024), pip_options)
    if spec is None or tag is None:
        return run_checks(checks, deadline), list(secrets.values())
    settings = Settings.given(
        spec,
        secrets,
        api_url,
        task_ids,
        config_dir,
        judge_models=tuple(judge_models),
        env=dict(os.environ),
        folder=module_folder(spec.name),
        modules=readable_modules(REPO_ROOT),
    )

    def setup() -> list[Row]:
        client = engine()[1]
        if client is None:
            return [Row.skipped(SETUP, "the Docker engine (the module's code runs in its image)")]
        if not image_exists(client, tag):
            return [
                Row.skipped(
                    SETUP,
                    f"the module's image {tag}",
                    f"`python run.py {spec.name} --build-only` builds it; then run the doctor "
                    "again",
                )
            ]
        return [setup_in_image(client, spec, tag, settings, secrets, deadline)]

    service = [
        check if check.names != (SETUP,) else Check((SETUP,), setup, check.fix)
        for check in service_checks(settings)
    ]
    return run_checks([*checks, *service], deadline), list(secrets.values())
