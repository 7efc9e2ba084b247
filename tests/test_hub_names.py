"""File names from a hostile or intercepted Hub (validator/kit/hub.py, `unsafe_name`):
huggingface_hub 0.29.1 joins a listed name to the download folder as it is (it looks for `..`
only on Windows), so `../../x` was written two levels above the folder. Every module's download
goes through the kit's `download`; a name that would land outside is refused, as the
submission's fault (the operator's for a base model), before any request for it. The local Hub
lists such names as they are and serves them wherever a request could land."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.hf_hub import LocalHub
from modules.rl.hub import fetch_policy
from validator.errors import OperatorError, SubmissionRejected
from validator.kit import fetch_base_model
from validator.kit import hub as kit_hub

PAYLOAD = b"written outside the download folder"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHub]:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "root" / "cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with LocalHub(tmp_path / "hub") as local:
        monkeypatch.setenv("HF_ENDPOINT", local.endpoint)
        yield local


def escaped(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("escaped*") if p.is_file())


def asked_for(hub: LocalHub) -> list[str]:
    return [path for _method, path, _status in hub.requests if "escaped" in path]


@pytest.mark.parametrize(
    "name",
    [
        "../../escaped.safetensors",
        "sub/../../escaped.safetensors",
        "{root}/escaped.safetensors",  # absolute
        "sub\\..\\escaped.safetensors",
        "escaped\0.safetensors",
        "link/escaped.safetensors",  # a link in the folder that leads out of it
    ],
)
def test_a_listed_name_leading_out_of_the_folder_is_the_submissions_and_never_asked_for(
    hub: LocalHub, tmp_path: Path, name: str
) -> None:
    root = tmp_path / "root"
    dest = root / "work" / "model"
    dest.mkdir(parents=True)
    (dest / "link").symlink_to(root)
    name = name.format(root=root)
    commit = hub.add_repo("trainer/evil", {"config.json": b"{}"})
    hub.list_name("trainer/evil", name, PAYLOAD)
    listed = kit_hub.file_sizes(kit_hub.model_info("trainer/evil", "x", submission=True))
    assert name in listed  # the Hub did list it

    with pytest.raises(SubmissionRejected, match="the Hub lists the file name"):
        kit_hub.download(
            "trainer/evil", name, "submission trainer/evil", submission=True, revision=commit,
            local_dir=dest, force_download=True, size=len(PAYLOAD),
        )  # fmt: skip
    assert escaped(tmp_path) == [] and asked_for(hub) == []


def test_a_plain_listed_name_in_a_subfolder_still_downloads(hub: LocalHub, tmp_path: Path) -> None:
    commit = hub.add_repo("trainer/ok", {"sub/dir/file.json": b"{}"})
    dest = tmp_path / "work"
    path = kit_hub.download(
        "trainer/ok", "sub/dir/file.json", "x", submission=True, revision=commit,
        local_dir=dest, force_download=True, size=2,
    )  # fmt: skip
    assert path == dest / "sub" / "dir" / "file.json" and path.read_bytes() == b"{}"


def test_an_rl_policy_named_out_of_the_folder_is_rejected(hub: LocalHub, tmp_path: Path) -> None:
    """rl's `model_filename` is the submitter's own field."""
    hub.add_repo("trainer/policy", {"model.onnx": b"onnx"})
    hub.list_name("trainer/policy", "../../escaped.onnx", PAYLOAD)
    dest = tmp_path / "root" / "work" / "policy"
    with pytest.raises(SubmissionRejected, match="'..' component"):
        fetch_policy("trainer/policy", "main", "../../escaped.onnx", dest, 10**6, 10**6)
    assert escaped(tmp_path) == [] and asked_for(hub) == []


def test_a_base_models_index_naming_a_shard_out_of_the_cache_is_the_operators(
    hub: LocalHub, tmp_path: Path
) -> None:
    index = {"weight_map": {"w": "../../../../escaped.safetensors"}}
    hub.add_repo(
        "org/base", {"config.json": b"{}", kit_hub.SAFETENSORS_INDEX: json.dumps(index).encode()}
    )
    hub.list_name("org/base", "../../../../escaped.safetensors", PAYLOAD)
    with pytest.raises(OperatorError, match="'..' component"):
        fetch_base_model("org/base")
    assert escaped(tmp_path) == [] and asked_for(hub) == []
