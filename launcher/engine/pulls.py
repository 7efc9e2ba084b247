"""Every read of a registry the launcher makes, through the Docker engine, under the validator's
deadline (validator/outbound/deadline.py) and bounded reader: the base image's pull before a
build, a released image's pull by digest, an `--image` pulled when missing, a manifest's digest
read for `pin-base`.

The engine reads the registry with no deadline of its own, so a registry that trickles would
hold the pull, and run.py with it, for as long as it trickles. Each pull runs on a connection
of its own to the engine, made inside the deadline (which can end only what it saw connect):
once the pull falls behind its pace (`PullPace`) the connection is shut, which makes the engine
cancel the pull, and the pull is named as abandoned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import docker
from docker.errors import APIError, DockerException
from docker.utils import kwargs_from_env
from requests.exceptions import RequestException

from validator.errors import AnswerTooLarge, JsonRefused
from validator.outbound.answer_caps import ANSWER_CAPS
from validator.outbound.bounded_reader import json_lines
from validator.outbound.deadline import CallAbandoned, overall_deadline

# A pull may take PULL_BASE_S, plus a second for each PULL_MIN_RATE bytes of its layers that
# arrived (and as many again to extract them): a registry that trickles is abandoned, however
# slowly it trickles, by the time the layers' sizes (the manifest's, which for a release is the
# signed digest's, so no registry can inflate them) would have come at that rate; PULL_MOST_S
# in any case.
PULL_BASE_S = 300.0
PULL_MIN_RATE = 512 * 1024
PULL_MOST_S = 6 * 3600.0
# Reading one manifest (a digest for `pin-base`): a few kilobytes.
MANIFEST_READ_S = 60.0


class PullPace:
    """What a pull has earned of time: the engine's progress lines give, per layer and step
    (Downloading, Extracting), the bytes done out of the layer's size."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._done: dict[tuple[str, str], int] = {}
        self.done = 0  # bytes, all layers and steps; read by the deadline's watcher thread

    def add(self, line: object) -> None:
        if not isinstance(line, dict):
            return
        detail = line.get("progressDetail")
        if not isinstance(detail, dict):
            return
        current, total = detail.get("current"), detail.get("total")
        if not isinstance(current, int) or current < 0:
            return
        if isinstance(total, int) and total > 0:
            current = min(current, total)  # never more than the layer's size
        key = (str(line.get("status")), str(line.get("id")))
        self.done += current - self._done.get(key, 0)
        self._done[key] = current

    def over(self) -> str | None:
        elapsed = time.monotonic() - self.started
        if elapsed <= PULL_BASE_S + self.done / PULL_MIN_RATE:
            return None
        return (
            f"abandoned after {elapsed:.0f} s, {self.done} bytes of its layers in: slower than "
            f"{PULL_MIN_RATE // 1024} KiB/s after its first {PULL_BASE_S:g} s"
        )


@contextmanager
def own_api(client: docker.DockerClient) -> Iterator[docker.APIClient]:
    """A low-level client of the engine `client` speaks to (the launcher's clients are all
    docker.from_env()'s), with a connection of its own: the shared client's pool would hand
    the pull a connection made before, out of its deadline's reach."""
    api = docker.APIClient(version=client.api.api_version, **kwargs_from_env())
    if api.base_url != client.api.base_url:
        api.close()
        raise DockerException(f"the engine at {client.api.base_url} is not the environment's")
    try:
        yield api
    finally:
        api.close()


def pull(
    client: docker.DockerClient,
    repository: str,
    tag: str,
    on_line: Callable[[dict], None] | None = None,
) -> str | None:
    """Pulls `repository` at `tag` (a tag, or a digest `sha256:...`) within its pace: the
    engine's error, or why it was abandoned, as text; None once pulled. `on_line` sees each
    progress line the engine sends."""
    pace = PullPace()
    try:
        with own_api(client) as api, overall_deadline(PULL_MOST_S, "the pull", guard=pace.over):
            # Errors found before the download starts are HTTP errors; later ones are stream
            # items, each line read within the registry.pull cap.
            stream = api.pull(repository, tag=tag, stream=True, decode=False)
            what = f"pulling {repository}@{tag}" if ":" in tag else f"pulling {repository}:{tag}"
            for line in json_lines(stream, ANSWER_CAPS["registry.pull"], what):
                if isinstance(line, dict) and "error" in line:
                    return str(line["error"])
                pace.add(line)
                if on_line is not None and isinstance(line, dict):
                    on_line(line)
    except CallAbandoned as exc:  # past its pace: the engine's stream closed, the pull with it
        return str(exc)
    except APIError as exc:
        return str(exc.explanation or exc)
    except (DockerException, RequestException) as exc:  # e.g. the engine's answer timed out
        return str(exc)
    except (AnswerTooLarge, JsonRefused) as exc:  # a pull stream past its cap: not pulled
        return str(exc)[:300]
    return None


def registry_digest(client: docker.DockerClient, image: str) -> str:
    """The digest the registry holds for `image`'s tag, read through the engine within
    MANIFEST_READ_S (CallAbandoned past it)."""
    with own_api(client) as api, overall_deadline(MANIFEST_READ_S, f"reading {image}'s manifest"):
        return str(api.inspect_distribution(image)["Descriptor"]["digest"])
