"""The host's rows of `python run.py doctor` (launcher/doctor/host.py): the Docker engine, Compose
v2, the NVIDIA driver, the NVIDIA runtime and a GPU seen from inside the module's image, the
image, the disk under Docker's volumes, the journal volumes, and the module's own start-up
checks run in its image."""

from __future__ import annotations

import subprocess
from pathlib import Path

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from pydantic import ValidationError

from launcher.doctor.driver import check_driver
from launcher.engine.containers import PASSED_ENV, state_volume_name
from launcher.fleet.volumes import old_volumes
from validator.doctor.checks import SETUP, Settings, disk_row
from validator.doctor.rows import ROWS, Row
from validator.spec import CONFIG_PATH, REPO_ROOT, STATE_PATH, ModuleSpec

GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.free", "--format=csv,noheader,nounits"]
GPU_PROBE_TIMEOUT = 120


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


def journals_row(client: docker.DockerClient, spec: ModuleSpec) -> Row:
    """The journals run.py, Compose and Kubernetes read (one name per worker), and any that an
    earlier compose.gpus.yaml named after a GPU: what they hold is read by nothing until run.py
    moves it (launcher/fleet/volumes.py)."""
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


def image_exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except (ImageNotFound, NotFound):
        return False
