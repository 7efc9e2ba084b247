"""A container registry on 127.0.0.1 for the tests of released images (`run.py --pull`): Debian's
`docker-registry` (the CNCF distribution registry), run from a config in a temporary folder,
its storage and its access log there too. Docker engines talk plain HTTP to a registry on
127.0.0.0/8 without any setting, so nothing here leaves the machine."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import requests

BINARY = "/usr/bin/docker-registry"
CONFIG = """\
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: {root}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class LocalRegistry:
    """`with LocalRegistry(folder) as registry:` a registry at `registry.address`
    (127.0.0.1:PORT); `registry.requests()` is its access log so far."""

    def __init__(self, folder: Path) -> None:
        if not Path(BINARY).is_file():
            raise RuntimeError(
                f"{BINARY} is missing: install Debian's docker-registry (`sudo make registry`)"
            )
        self.folder = folder
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = folder / "registry.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalRegistry:
        config = self.folder / "config.yml"
        config.write_text(CONFIG.format(root=self.folder / "data", port=self.port))
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [BINARY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"docker-registry exited: {self.log.read_text()[-2000:]}")
            try:
                if requests.get(f"http://{self.address}/v2/", timeout=2).status_code == 200:
                    return self
            except requests.ConnectionError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(
            f"docker-registry did not answer in 30 s: {self.log.read_text()[-2000:]}"
        )

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def requests(self) -> list[str]:
        """The request lines it answered, e.g. `GET /v2/x/manifests/1.0 HTTP/1.1" 200`."""
        return [
            line.split('"', 1)[1]
            for line in self.log.read_text(errors="replace").splitlines()
            if '"' in line and " HTTP/1.1" in line
        ]


def push_image(engine, image: str, name: str) -> str:
    """Pushes the engine's `image` as `name` (REGISTRY/REPO:TAG), then drops that name here, as
    a release workflow's push leaves nothing on the host that pulls it; returns the digest the
    registry answered (what a release signs)."""
    engine.images.get(image).tag(name)
    pushed = list(engine.api.push(name, stream=True, decode=True))
    errors = [line for line in pushed if "error" in line]
    if errors:
        raise RuntimeError(f"push of {name} failed: {errors}")
    engine.images.remove(name)
    return next(line["aux"]["Digest"] for line in pushed if "Digest" in line.get("aux", {}))
