"""Every container of the validator rotates its log: run.py's (launcher/engine/containers.py), on an
engine whose default driver is Docker's own json-file (which never rotates), and every service
of the committed Compose files (launcher/deploy/compose_services.py), at 5 files of 10 MB unless the
host's environment says otherwise. The engine's view of both: tests/test_docker_launcher.py and
tests/test_docker_compose.py; Kubernetes pods: the kubelet's rotation (docs/kubernetes.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launcher.engine.containers import ContainerSpec

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILES = ("compose.yaml", "compose.gpus.yaml")
ROTATED = {
    "driver": "json-file",
    "options": {
        "max-size": "${VALIDATOR_LOG_MAX_SIZE:-10m}",
        "max-file": "${VALIDATOR_LOG_MAX_FILES:-5}",
    },
}


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_every_compose_service_rotates_its_log(name):
    services = yaml.safe_load((REPO / name).read_text())["services"]
    assert services
    for service, body in services.items():
        assert body.get("logging") == ROTATED, service


def spec(**host_env: str) -> ContainerSpec:
    return ContainerSpec("image", "rl", [], {}, REPO / "configs", {}, host_env=host_env)


def test_run_py_containers_rotate_their_log_on_dockers_default_driver():
    kwargs = spec().run_kwargs("json-file")
    assert kwargs["log_config"] == {
        "type": "json-file",
        "config": {"max-size": "10m", "max-file": "5"},
    }
    sized = spec(VALIDATOR_LOG_MAX_SIZE="50m", VALIDATOR_LOG_MAX_FILES="2").run_kwargs()
    assert sized["log_config"]["config"] == {"max-size": "50m", "max-file": "2"}
    # A driver the operator chose for the engine (journald, local, a shipper) is left to it.
    for driver in ("journald", "local", "fluentd"):
        assert "log_config" not in spec().run_kwargs(driver)
