"""`python run.py doctor [MODULE]`: the host's rows (the Docker engine, Compose v2, the NVIDIA
driver against the module's CUDA, the NVIDIA runtime and a GPU seen from inside the module's
image, the image, the disk under Docker's volumes), then the rows the validator would check
itself (validator/observe/doctor_checks.py): the settings, the configs, the Fed Ledger and the
key, the clock, the Hub, and the module's own start-up checks, run in its image. A check that
cannot run here is a row that says what it needs. One table, within the deadline whatever the
servers do; exit 0 when nothing failed, 1 otherwise, 2 for usage."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import click
import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from pydantic import ValidationError

from launcher.containers import PASSED_ENV, state_volume_name
from launcher.driver import check_driver
from launcher.errors import UsageError
from launcher.images import PRODUCTION_BASE, BuildSpec, source_hash
from launcher.volumes import old_volumes
from validator.doctor import DEADLINE_OPTION, JUDGE_MODEL_OPTION
from validator.errors import ConfigError, ExitCode
from validator.observe.doctor import ROWS, Check, Row, exit_code, render, run_checks
from validator.observe.doctor_checks import (
    DEFAULT_HF_MIN_FREE_GB,
    SETUP,
    Settings,
    disk_row,
    service_checks,
)
from validator.options import DEFAULT_API_URL, gathered_secrets, parse_task_ids, secret_names
from validator.spec import CONFIG_PATH, REPO_ROOT, STATE_PATH, ModuleSpec, load_spec, module_folder

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


def engine_row(timeout: float = 30) -> tuple[Row, docker.DockerClient | None]:
    try:
        client = docker.from_env(timeout=max(1, int(timeout)))
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


def driver_row(spec: ModuleSpec) -> Row:
    verdict = check_driver(spec)
    if verdict.ok:
        return Row.ok("NVIDIA driver", verdict.line)
    if not verdict.known:
        return Row.warning("NVIDIA driver", verdict.line, "check `nvidia-smi` on this host")
    line, _, fix = verdict.line.partition(" -> ")
    return Row.failed("NVIDIA driver", line, fix)


def setup_in_image(
    client: docker.DockerClient,
    spec: ModuleSpec,
    tag: str,
    settings: Settings,
    secrets: dict[str, str | None],
    deadline: float,
) -> Row:
    """The module's own start-up checks (`check_setup`), run where its code runs: `python -m
    validator doctor MODULE --only "module setup" --json` in its image, with the configs, the
    journal volume (the judge texts' cache) and the environment run.py gives the validator."""
    inner = max(1.0, round(deadline * 0.6, 1))
    command = ["doctor", spec.name, "--only", SETUP, "--json", "--timeout", f"{inner:g}"]
    command += ["--state-dir", STATE_PATH, "--config-dir", CONFIG_PATH]
    command += ["--task_ids", ",".join(settings.task_ids)] if settings.task_ids else []
    for model in settings.judge_models:
        command += ["--judge-model", model]
    names = (*PASSED_ENV, *spec.env)
    environment = {k: v for k, v in settings.env.items() if k in names and v}
    environment.update({k: v for k, v in secrets.items() if v})
    volumes = {str(Path(settings.config_dir or REPO_ROOT / "configs").resolve()): {
        "bind": CONFIG_PATH, "mode": "ro"}}  # fmt: skip
    state = state_volume_name(spec.name)
    if client.volumes.list(filters={"name": state}):  # never made here: run.py makes it
        volumes[state] = {"bind": STATE_PATH, "mode": "rw"}
    container = client.containers.run(
        tag, command, environment=environment, volumes=volumes, network_mode="host", detach=True
    )
    try:
        container.wait(timeout=deadline * 0.9)
        output = container.logs(stdout=True, stderr=False)
        said = container.logs(stdout=False, stderr=True).decode(errors="replace").strip()
    except (requests.RequestException, DockerException):
        return Row.failed(SETUP, f"no answer from {tag} within {deadline * 0.9:g} s", "")
    finally:
        try:
            container.remove(force=True)
        except DockerException:
            pass
    try:
        rows = [row for row in ROWS.validate_json(output) if row.check == SETUP]
    except ValidationError:
        rows = []
    if not rows:
        last = said.splitlines()[-1] if said else "no output"
        return Row.failed(SETUP, f"the doctor in {tag} gave no row: {last}", "")
    return rows[0]


def host_checks(
    spec: ModuleSpec | None, tag: str | None, engine: Once, min_gpu_gb: float, min_free_mb: int
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
        return tag if tag and _exists(client, tag) else None

    checks.append(with_engine("GPU", lambda c: gpu_row(c, spec, present(c), min_gpu_gb)))
    if spec is not None and tag is not None:
        checks.append(with_engine("image", lambda c: image_row(c, spec, tag)))
    checks.append(with_engine("disk: Docker volumes", lambda c: docker_disk_row(c, min_free_mb)))
    if spec is not None:
        checks.append(with_engine("journal volumes", lambda c: journals_row(c, spec)))
    return checks


def journals_row(client: docker.DockerClient, spec: ModuleSpec) -> Row:
    """The journals run.py, Compose and Kubernetes read (one name per worker), and any that an
    earlier compose.gpus.yaml named after a GPU: what they hold is read by nothing until run.py
    moves it (launcher/volumes.py)."""
    name = "journal volumes"
    old = old_volumes(client, spec.name)
    if old:
        return Row.failed(
            name,
            f"{', '.join(old)}: journals named after a GPU by an earlier compose.gpus.yaml; "
            "nothing reads them now",
            f"`python run.py {spec.name} --gpus <ids> ...` moves them into its workers' "
            "journals at start and submits what they hold",
        )
    base = state_volume_name(spec.name)
    found = sorted(v.name for v in client.volumes.list(filters={"name": base}))
    found = [v for v in found if v == base or v.removeprefix(base + "-").isdigit()]
    return Row.ok(name, ", ".join(found) if found else f"none yet ({base} at the first start)")


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("module", required=False)
@click.option("--flock-api-key", envvar="FLOCK_API_KEY", help="Fed Ledger API key.")
@click.option("--hf-token", envvar="HF_TOKEN", help="HuggingFace token.")
@click.option(
    "--api-url",
    envvar="FLOCK_API_URL",
    default=DEFAULT_API_URL,
    show_default=True,
    help="Fed Ledger base URL.",
)
@click.option(
    "--task_ids",
    "--task-ids",
    "task_ids",
    envvar="TASK_IDS",
    callback=parse_task_ids,
    help="The task ids the validator will look up (their configs are checked too), e.g. 12,34.",
)
@click.option(
    "--config-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=REPO_ROOT / "configs",
    help="The configs run.py will mount [default: ./configs].",
)
@click.option(
    "--base-image",
    envvar="VALIDATOR_BASE_IMAGE",
    default=PRODUCTION_BASE,
    show_default=True,
    help="The base run.py builds the module's image on (names the image checked).",
)
@click.option(
    "--env-installer",
    envvar="VALIDATOR_ENV_INSTALLER",
    default="micromamba",
    type=click.Choice(["micromamba", "pip"]),
    show_default=True,
    help="As run.py's (names the image checked).",
)
@click.option(
    "--pip-options",
    envvar="VALIDATOR_PIP_OPTIONS",
    default="",
    help="As run.py's (names the image checked).",
)
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
    tag = image_tag(spec, base_image, env_installer, pip_options) if spec else None
    checks = host_checks(spec, tag, engine, min_gpu_gb, int(min_free_gb * 1024))
    if spec is None or tag is None:
        return run_checks(checks, deadline), list(secrets.values())
    settings = Settings(
        spec,
        secrets.get("FLOCK_API_KEY"),
        secrets.get("HF_TOKEN"),
        api_url,
        tuple(task_ids or ()),
        config_dir,
        judge_models=tuple(judge_models),
        env=dict(os.environ),
        secrets={name: secrets.get(name) for name in secrets if spec.needs(name)},
        folder=module_folder(spec.name),
    )

    def setup() -> list[Row]:
        client = engine()[1]
        if client is None:
            return [Row.skipped(SETUP, "the Docker engine (the module's code runs in its image)")]
        if not _exists(client, tag):
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


def _exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except (ImageNotFound, NotFound):
        return False
