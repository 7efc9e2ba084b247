"""The rows of `python run.py doctor [MODULE]`: the host's (the Docker engine, Compose v2, the
NVIDIA driver against the module's CUDA, the NVIDIA runtime and a GPU seen from inside the
module's image, the NVIDIA Container Toolkit's version against its escape fixes, the image, the
images its validators run, the disk under Docker's volumes), then those the validator would
check itself (validator/doctor/checks.py), the module's own start-up checks run in its image. A
check that cannot run here is a row that says what it needs; the table comes within the
deadline whatever the servers do."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import docker

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
from launcher.engine.images import BuildSpec, source_hash
from launcher.options import DEFAULT_INSTALLER, DEFAULT_LOCK, PRODUCTION_BASE
from validator.doctor.checks import SETUP, Settings, service_checks
from validator.doctor.rows import Check, Row, run_checks
from validator.options import gathered_secrets, secret_names
from validator.spec import REPO_ROOT, ModuleSpec, load_spec, module_folder, readable_modules


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

    def present(client: docker.DockerClient) -> str | None:
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
