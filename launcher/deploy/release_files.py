"""A release's Compose files and Kubernetes base, its images named by the digests its signed
manifest holds: published beside the manifest by the release workflow, and written into a
checkout by `python run.py release pin`."""

from __future__ import annotations

from pathlib import Path

from launcher.deploy import kubernetes
from launcher.deploy.compose_gpus import GPUS_FILE, HOSTS_FILE, load_hosts, render_gpus
from launcher.deploy.compose_services import (
    COMPOSE_FILE,
    CPU_OVERRIDE_FILE,
    render,
    specs_with_files,
)
from launcher.release.manifest import ReleaseManifest


def deploy_files(repo_root: Path, manifest: ReleaseManifest) -> dict[Path, str]:
    """The release's Compose files and Kubernetes base, its images by digest, by path in a
    checkout."""
    specs = specs_with_files(repo_root)
    compose, cpu = render(specs, manifest.images)
    files = {Path(COMPOSE_FILE): compose, Path(CPU_OVERRIDE_FILE): cpu}
    hosts = repo_root / HOSTS_FILE
    if hosts.is_file():
        files[Path(GPUS_FILE)] = render_gpus(specs, load_hosts(hosts, specs), manifest.images)
    for path, text in kubernetes.render(specs, manifest.images).items():
        files[kubernetes.OUTPUT_DIR / path] = text
    return files


def write_files(root: Path, files: dict[Path, str]) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
