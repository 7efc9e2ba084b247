"""The rl module's config, input and metrics schemas (docs/rl-scoring.md).

`RlConfig` holds every operator setting's default; `configs/rl.json` keeps upstream's two keys.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from validator.kit import BaseConfig, BaseInputData, BaseMetrics

MIB = 1024**2
GIB = 1024**3
# What upstream submits for a policy over max_params, and what a NaN or infinite average gives.
PENALTY_REWARD = -999.0


class RlConfig(BaseConfig):
    # Rows per inference call; the reward does not depend on it (rows are independent).
    per_device_eval_batch_size: int = Field(512, gt=0)
    # Upstream's key, kept so that its configs load: evaluation is deterministic, it changes
    # nothing.
    seed: int = 42
    max_model_bytes: int = Field(1 * GIB, gt=0)  # the .onnx file
    max_external_data_bytes: int = Field(2 * GIB, gt=0)  # its .onnx.data file
    max_validation_set_bytes: int = Field(256 * MIB, gt=0)  # the .npz as downloaded
    # The arrays unpacked: a small .npz can hold a huge compressed array.
    max_validation_set_unpacked_bytes: int = Field(2 * GIB, gt=0)
    # The policy runs in a child process with these limits; past them the submission fails.
    inference_threads: int = Field(2, gt=0)
    inference_seconds: float = Field(300.0, gt=0)  # wall clock for all rows of one assignment
    inference_memory_bytes: int = Field(8 * GIB, gt=0)  # address space of the child
    work_dir: str | None = None  # where submissions are downloaded; the system temp dir if unset


class RlInput(BaseInputData):
    submitter_fields = frozenset({"hg_repo_id", "model_filename", "revision"})
    url_fields = frozenset({"validation_set_url"})

    hg_repo_id: str
    model_filename: str = "model.onnx"
    revision: str = "main"
    validation_set_url: str
    max_params: int = Field(gt=0)

    @field_validator("model_filename")
    @classmethod
    def _plain_onnx_name(cls, name: str) -> str:
        # A file in the repo root, named as a file: never a path that could leave the download
        # folder or pick another file of the repo.
        if (
            not name.endswith(".onnx")
            or name in (".onnx",)
            or name.startswith(".")
            or any(sep in name for sep in ("/", "\\", "\0", ":"))
            or name != name.strip()
        ):
            raise ValueError(f"{name!r} must be a plain .onnx file name in the repo root")
        return name


class RlMetrics(BaseMetrics):
    average_reward: float
