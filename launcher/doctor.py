"""`python run.py doctor [MODULE]`: the host's rows (the Docker engine, Compose v2, the NVIDIA
runtime and a GPU seen from inside the module's image, the image, the disk under Docker's
volumes), then the rows the validator would check itself (validator/observe/doctor_checks.py):
the Fed Ledger and the key, the clock, the Hub, the judge. One table; exit 0 when nothing
failed, 1 otherwise, 2 for usage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import docker
from docker.errors import APIError, DockerException, ImageNotFound

from launcher.errors import UsageError
from launcher.images import PRODUCTION_BASE, BuildSpec, source_hash
from validator.errors import ConfigError, ExitCode
from validator.observe.doctor import Row, exit_code, render
from validator.observe.doctor_checks import (
    DEFAULT_HF_MIN_FREE_GB,
    Settings,
    disk_row,
    service_rows,
)
from validator.options import DEFAULT_API_URL, gathered_secrets, secret_names
from validator.spec import REPO_ROOT, ModuleSpec, load_spec, module_folder

DEFAULT_MIN_GPU_GB = 16.0
GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.free", "--format=csv,noheader,nounits"]
GPU_PROBE_TIMEOUT = 120


def image_tag(
    spec: ModuleSpec,
    base_image: str = PRODUCTION_BASE,
    installer: str = "micromamba",
    pip_options: str = "",
) -> str:
    """The content-hash tag run.py would build or reuse for these sources (launcher/images.py)."""
    build = BuildSpec(spec.name, REPO_ROOT, base_image, installer, pip_options, spec.environment)
    return f"flock-validator-{spec.name.lower()}:{source_hash(build)[:12]}"


def engine_row() -> tuple[Row, docker.DockerClient | None]:
    try:
        client = docker.from_env()
        client.ping()
        version = client.version()
    except DockerException as exc:
        return (
            Row.failed(
                "Docker engine",
                f"unreachable ({type(exc).__name__})",
                "install and start Docker; add this user to the docker group",
            ),
            None,
        )
    return Row.ok("Docker engine", f"Docker {version.get('Version', '?')}"), client


def compose_row() -> Row:
    name = "Docker Compose v2"
    try:
        done = subprocess.run(
            ["docker", "compose", "version", "--short"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        done = None
        why = type(exc).__name__
    if done is not None and done.returncode == 0 and done.stdout.strip().lstrip("v")[:1] >= "2":
        return Row.ok(name, f"docker compose {done.stdout.strip()}")
    why = (done.stderr.strip()[:120] if done is not None else why) or "not installed"
    # run.py needs no Compose; `docker compose up` with compose.yaml does.
    return Row.warning(
        name, f"`docker compose` unavailable: {why}", "install docker-compose-plugin"
    )


def gpu_row(
    client: docker.DockerClient, spec: ModuleSpec | None, image: str | None, min_gpu_gb: float
) -> Row:
    name = "GPU"
    if spec is not None and not spec.gpu:
        return Row.ok(name, f"not needed: {spec.name} runs on the CPU")
    runtimes = sorted(client.info().get("Runtimes") or {})
    if "nvidia" not in runtimes and not _cdi_gpus(client):
        return Row.failed(
            name,
            f"this Docker engine has no NVIDIA runtime (runtimes: "
            f"{', '.join(runtimes) or 'none'}): no container here can see a GPU",
            "on a GPU host install the NVIDIA driver and Container Toolkit, then "
            "`sudo nvidia-ctk runtime configure --runtime=docker` and restart Docker",
        )
    if image is None:
        return Row.warning(name, "NVIDIA runtime present; no image to look from", "build the image")
    try:
        output = client.containers.run(
            image,
            GPU_QUERY,
            entrypoint=[],
            device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])],
            remove=True,
            stderr=True,
        ).decode(errors="replace")
    except (APIError, DockerException) as exc:
        return Row.failed(
            name,
            f"no GPU visible from inside {image}: {str(exc)[:160]}",
            "check `nvidia-smi` on the host and the toolkit's configuration",
        )
    return gpu_memory_row(output, min_gpu_gb)


def gpu_memory_row(nvidia_smi: str, min_gpu_gb: float) -> Row:
    """nvidia-smi's CSV (index, name, free MiB) against the module's need per GPU."""
    gpus = []
    for line in nvidia_smi.strip().splitlines():
        try:
            index, gpu, free_mib = (part.strip() for part in line.split(","))
        except ValueError:  # not the query's three columns
            continue
        if free_mib.isdigit():
            gpus.append((index, gpu, int(free_mib) / 1024))
    if not gpus:
        return Row.failed("GPU", "no GPU listed from inside the image", "check `nvidia-smi`")
    short = [f"GPU {index} ({free:.0f} GiB free)" for index, _, free in gpus if free < min_gpu_gb]
    found = ", ".join(f"{index}: {gpu} {free:.0f} GiB free" for index, gpu, free in gpus)
    if short:
        return Row.failed(
            "GPU",
            f"{'; '.join(short)} under the {min_gpu_gb:g} GiB needed; {found}",
            "stop what else uses those GPUs, or leave them out with --gpus",
        )
    return Row.ok("GPU", found)


def _cdi_gpus(client: docker.DockerClient) -> bool:
    """Newer engines hand out GPUs through CDI devices instead of a named runtime."""
    devices = client.info().get("DiscoveredDevices") or []
    return any("nvidia.com/gpu" in str(device.get("ID", "")) for device in devices)


def image_row(client: docker.DockerClient, spec: ModuleSpec, tag: str) -> Row:
    name = "image"
    try:
        client.images.get(tag)
        return Row.ok(name, f"{tag} is built from these sources")
    except ImageNotFound:
        pass
    repository = tag.partition(":")[0]
    older = [t for image in client.images.list(name=repository) for t in image.tags]
    found = f"{tag} not built; older: {', '.join(older[:3])}" if older else f"{tag} not built"
    return Row.warning(
        name,
        found,
        f"`python run.py {spec.name} --build-only` builds it now (run.py also builds it at start)",
    )


def docker_disk_row(client: docker.DockerClient, floor_mb: int) -> Row:
    """The journal and the HF cache are Docker volumes: they live under Docker's root dir."""
    root = Path(client.info().get("DockerRootDir") or "/var/lib/docker")
    return disk_row("disk: Docker volumes", root, floor_mb)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("module", required=False)
@click.option("--flock-api-key", envvar="FLOCK_API_KEY", help="Fed Ledger API key.")
@click.option("--hf-token", envvar="HF_TOKEN", help="HuggingFace token.")
@click.option("--api-url", envvar="FLOCK_API_URL", default=DEFAULT_API_URL, show_default=True)
@click.option("--task_ids", "--task-ids", "task_ids", envvar="TASK_IDS", default="")
@click.option(
    "--config-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=REPO_ROOT / "configs",
)
@click.option("--base-image", envvar="VALIDATOR_BASE_IMAGE", default=PRODUCTION_BASE)
@click.option("--env-installer", envvar="VALIDATOR_ENV_INSTALLER", default="micromamba")
@click.option("--pip-options", envvar="VALIDATOR_PIP_OPTIONS", default="")
@click.option(
    "--min-free-gb",
    type=click.FloatRange(min=0),
    default=DEFAULT_HF_MIN_FREE_GB,
    show_default=True,
    help="Free space Docker's volumes (the HF cache, the journal) need.",
)
@click.option(
    "--min-gpu-gb",
    type=click.FloatRange(min=0),
    default=DEFAULT_MIN_GPU_GB,
    show_default=True,
    help="Free memory each GPU needs for the module's bases.",
)
@click.option("--judge-model", "judge_models", multiple=True, help="A judge model to expect.")
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
    task_ids: str,
    config_dir: Path,
    base_image: str,
    env_installer: str,
    pip_options: str,
    min_free_gb: float,
    min_gpu_gb: float,
    judge_models: tuple[str, ...],
) -> tuple[list[Row], list[str | None]]:
    """The rows: the host's, then (with a module) the services'; and the secrets to redact."""
    spec = load_spec(module_folder(module)) if module else None
    secrets = gathered_secrets(
        secret_names(spec) if spec else ["FLOCK_API_KEY", "HF_TOKEN"], flock_api_key, hf_token
    )
    engine, client = engine_row()
    rows = [engine, compose_row()]
    tag = image_tag(spec, base_image, env_installer, pip_options) if spec else None
    if client is not None:
        present = tag if tag and _exists(client, tag) else None
        rows.append(gpu_row(client, spec, present, min_gpu_gb))
        if spec is not None and tag is not None:
            rows.append(image_row(client, spec, tag))
        rows.append(docker_disk_row(client, int(min_free_gb * 1024)))
    if spec is None:
        return rows, list(secrets.values())
    settings = Settings(
        spec,
        secrets.get("FLOCK_API_KEY"),
        secrets.get("HF_TOKEN"),
        api_url,
        tuple(part.strip() for part in task_ids.split(",") if part.strip()),
        config_dir,
        judge_models=tuple(judge_models),
        env=dict(os.environ),
    )
    return rows + service_rows(settings), list(secrets.values())


def _exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except ImageNotFound:
        return False
