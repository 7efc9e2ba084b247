"""The production base, and the launcher's words for a base image the engine cannot get,
without an engine: the engine's own error texts, and a stand-in client for the paths a real
engine reaches only with a registry (a base that vanishes between the check and the FROM step)."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from devkit.validator_cli import REPO_ROOT
from launcher.engine import pulls
from launcher.engine.images import (
    PRODUCTION_BASE,
    BuildSpec,
    base_unavailable,
    ensure_given_image,
    ensure_image,
    input_files,
    pull_failure_reason,
    source_hash,
)
from launcher.errors import LaunchError

BASE = "mambaorg/micromamba:2.3.3-cuda12.6.3-ubuntu22.04"
# The same base named by a digest: what a build needs (a tag is what a registry can move).
PINNED = f"{BASE}@sha256:{'a' * 64}"


def test_the_production_base_is_one_tag_everywhere():
    # run.py, a plain `docker build` and compose must build on the same base.
    assert f"ARG BASE_IMAGE={PRODUCTION_BASE}\n" in (REPO_ROOT / "docker/Dockerfile").read_text()
    compose = (REPO_ROOT / "compose.yaml").read_text()
    assert f"BASE_IMAGE: ${{VALIDATOR_BASE_IMAGE:-{PRODUCTION_BASE}}}\n" in compose
    assert f"`{PRODUCTION_BASE}`" in (REPO_ROOT / "docs/images.md").read_text()


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (
            'Get "https://registry-1.docker.io/v2/": dial tcp: lookup registry-1.docker.io on '
            "10.255.255.53:53: no such host",
            "the registry cannot be reached",
        ),
        (
            "pull access denied for local/does-not-exist, repository does not exist or may "
            "require 'docker login': denied: requested access to the resource is denied",
            "no such repository, or a private one",
        ),
        (
            "manifest for mambaorg/micromamba:2.3.3-cuda99-ubuntu22.04 not found: manifest "
            "unknown: manifest unknown",
            "no such tag",
        ),
        (
            "no matching manifest for linux/arm64/v8 in the manifest list entries",
            "no image for this machine's platform",
        ),
        ("invalid reference format: repository name must be lowercase", "not a valid image name"),
        (
            "toomanyrequests: You have reached your pull rate limit.",
            "the registry's pull rate limit; docker login raises it",
        ),
        ("something new\nand a second line", "something new"),
    ],
)
def test_pull_errors_become_a_few_words(error, reason):
    assert pull_failure_reason(error) == reason


def test_the_message_is_one_line_naming_the_tag_and_the_way_out():
    error = base_unavailable("local/nope:1", "line one\nline two")
    assert error.exit_code == 3  # as every other launch error the operator has to fix
    message = str(error)
    assert "\n" not in message
    assert message.startswith("base image 'local/nope:1' cannot be pulled (line one); ")
    assert "--base-image / VALIDATOR_BASE_IMAGE" in message
    assert 'docs/images.md "The base image"' in message


class StandInImage:
    def __init__(self, repo_digests: list[str]) -> None:
        self.attrs = {"RepoDigests": repo_digests}


class StandInImages:
    def __init__(self, present: set[str], pulled_from: dict[str, str]) -> None:
        self.present = present
        self.pulled_from = pulled_from  # name -> the digest reference a registry gave it

    def get(self, name: str) -> StandInImage:
        if name not in self.present:
            raise ImageNotFound(f"No such image: {name}")
        held = self.pulled_from.get(name)
        return StandInImage([held] if held else [])


class StandInAPI:
    def __init__(self, build_chunks: list[dict], pull_chunks: list[dict]) -> None:
        self.build_chunks = build_chunks
        self.pull_chunks = pull_chunks
        self.pulled: list[tuple[str, str]] = []
        self.built: list[dict] = []

    def build(self, **kwargs):
        self.built.append(kwargs)
        yield from self.build_chunks

    def pull(self, repository: str, tag: str, **_kwargs):
        self.pulled.append((repository, tag))
        yield from (json.dumps(chunk).encode() + b"\n" for chunk in self.pull_chunks)


class StandInClient:
    def __init__(self, present=(), build_chunks=(), pull_chunks=(), pulled_from=None) -> None:
        self.images = StandInImages(set(present), pulled_from or {})
        self.api = StandInAPI(list(build_chunks), list(pull_chunks))


def test_a_pull_error_in_the_stream_is_the_one_line_and_no_build_starts(
    tmp_path, capsys, monkeypatch
):
    # The pull's own connection to the engine (launcher/engine/pulls.py) is the stand-in's API.
    monkeypatch.setattr(pulls, "own_api", lambda client: nullcontext(client.api))
    client = StandInClient(
        pull_chunks=[{"status": "Pulling from mambaorg/micromamba"}, {"error": "toomanyrequests"}],
        build_chunks=[{"stream": "Step 1/2 : FROM x\n"}],
    )
    with pytest.raises(LaunchError, match=r"^base image '.*' cannot be pulled \(the registry's"):
        ensure_image(client, BuildSpec("fixture", tmp_path, base_image=PINNED))
    assert client.api.pulled == [(BASE, f"sha256:{'a' * 64}")]  # the engine pulls the digest
    assert "Step " not in capsys.readouterr().err


def test_an_image_given_with_image_is_pulled_through_the_paced_pull(monkeypatch):
    monkeypatch.setattr(pulls, "own_api", lambda client: nullcontext(client.api))
    client = StandInClient(pull_chunks=[{"error": "manifest unknown"}])
    with pytest.raises(
        LaunchError, match=r"^image 'me/v:1' is not present and cannot be pulled \(no such tag\)$"
    ):
        ensure_given_image(client, "me/v:1")
    assert client.api.pulled == [("me/v", "1")]


def test_a_base_named_by_tag_is_built_on_the_digest_the_engine_holds_it_as(tmp_path, capsys):
    # A tag is what its registry can move: every build on this host stands on the bytes the
    # engine pulled once, named by digest, and says so.
    held = f"mambaorg/micromamba@sha256:{'b' * 64}"
    client = StandInClient(
        present={BASE}, pulled_from={BASE: held}, build_chunks=[{"stream": "ok\n"}]
    )
    spec = BuildSpec("fixture", tmp_path, base_image=BASE)
    tag = ensure_image(client, spec)
    assert tag == f"flock-validator-fixture:{source_hash(spec)[:12]}"
    (built,) = client.api.built
    assert built["buildargs"]["BASE_FROM"] == held
    assert built["buildargs"]["BASE_IMAGE"] == BASE  # the hash, and so the tag, name the tag
    assert client.api.pulled == []
    assert f"building on the digest this engine holds it as, {held}" in capsys.readouterr().err


def test_a_base_made_on_this_machine_needs_no_digest(tmp_path):
    # The CI stand-in (scripts/local-base-image.sh) comes from no registry: nothing can move it.
    client = StandInClient(present={"local/base:bookworm"}, build_chunks=[{"stream": "ok\n"}])
    tag = ensure_image(client, BuildSpec("fixture", tmp_path, base_image="local/base:bookworm"))
    assert tag.startswith("flock-validator-fixture:")


def test_a_present_base_is_not_pulled(tmp_path):
    client = StandInClient(present={PINNED}, build_chunks=[{"stream": "Step 1/2 : FROM x\n"}])
    tag = ensure_image(client, BuildSpec("fixture", tmp_path, base_image=PINNED))
    assert tag.startswith("flock-validator-fixture:")
    assert client.api.pulled == []


def test_a_failing_from_step_names_the_base(tmp_path):
    client = StandInClient(
        present={PINNED},
        build_chunks=[
            {"stream": "Step 2/21 : FROM ${BASE_IMAGE}\n"},
            {"error": "manifest for x not found: manifest unknown"},
        ],
    )
    with pytest.raises(LaunchError) as caught:
        ensure_image(client, BuildSpec("fixture", tmp_path, base_image=PINNED))
    assert str(caught.value).startswith(f"base image {PINNED!r} cannot be pulled (no such tag); ")


def test_a_failing_later_step_is_a_build_failure(tmp_path):
    client = StandInClient(
        present={PINNED},
        build_chunks=[
            {"stream": "Step 2/21 : FROM ${BASE_IMAGE}\n"},
            {"stream": "Step 9/21 : RUN sh /opt/flock/install-env.sh\n"},
            {"error": "The command returned a non-zero code: 1"},
        ],
    )
    with pytest.raises(LaunchError) as caught:
        ensure_image(client, BuildSpec("fixture", tmp_path, base_image=PINNED))
    assert caught.value.exit_code == 1
    assert str(caught.value).startswith("building flock-validator-fixture:")


def _image_inputs(root):
    """A repository in miniature: what images are made of, and the dev tools beside it."""
    files = {
        "configs/fixture.json": "{}",
        "docker/Dockerfile": "FROM scratch\n",
        "requirements.txt": "click\n",
        "validator/__init__.py": "",
        "modules/fixture/__init__.py": "",
        "modules/other/__init__.py": "",
        "devkit/simulator/server.py": "",
        "wheels/click-8.0-py3-none-any.whl": "wheel",
        "bench/lora_bench.py": "",
        "tests/test_x.py": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return BuildSpec("fixture", root, base_image=BASE)


@pytest.mark.parametrize(
    ("changed", "tag_changes"),
    [
        ("devkit/simulator/server.py", False),
        ("devkit/new_tool.py", False),
        ("wheels/click-8.0-py3-none-any.whl", False),
        ("wheels/torch-2.0-cp311-cp311-linux_x86_64.whl", False),
        ("bench/lora_bench.py", False),
        ("tests/test_x.py", False),
        ("modules/other/__init__.py", False),
        ("validator/__init__.py", True),
        ("validator/new.py", True),
        ("docker/Dockerfile", True),
        ("requirements.txt", True),
        ("configs/fixture.json", True),
        ("modules/fixture/__init__.py", True),
    ],
)
def test_the_image_tag_follows_what_the_image_holds(tmp_path, changed, tag_changes):
    spec = _image_inputs(tmp_path)
    before = source_hash(spec)
    path = tmp_path / changed
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write("# changed\n")
    assert (source_hash(spec) != before) is tag_changes


def test_the_repositorys_image_inputs_hold_no_dev_tools_and_no_wheelhouse():
    inputs = [
        path.relative_to(REPO_ROOT)
        for path in input_files(BuildSpec("lora", REPO_ROOT, base_image=BASE))
    ]
    assert {path.parts[0] for path in inputs} == {
        "configs",
        "docker",
        "modules",
        "requirements.txt",
        "validator",
    }
    assert Path("docker/Dockerfile") in inputs
    assert not [path for path in inputs if path.suffix == ".whl" or "simulator" in path.parts]
