"""The rl module: scores a submitted ONNX allocation policy by its average reward on the
task's validation set, as the network's rl validator does (docs/rl-scoring.md), treating the
file as hostile (docs/rl-scoring.md, "What is refused")."""

from __future__ import annotations

import logging
import math

import numpy as np

from modules.rl.hub import fetch_policy
from modules.rl.inference import run_policy
from modules.rl.policy import inspect_policy, reader_limits
from modules.rl.reward import average_reward, rewards
from modules.rl.schemas import PENALTY_REWARD, RlConfig, RlInput, RlMetrics
from modules.rl.validation_set import load_validation_set
from validator.kit import (
    BaseValidationModule,
    ChildLimits,
    WorkArea,
    current_scope,
    fetch_validation_set,
    short_commit,
)

log = logging.getLogger(__name__)


def inference_limits(config: RlConfig) -> ChildLimits:
    """The policy's child: its wall clock and its memory."""
    return ChildLimits(
        wall_seconds=config.inference_seconds, memory_bytes=config.inference_memory_bytes
    )


class RlModule(BaseValidationModule[RlConfig, RlInput]):
    config_schema = RlConfig
    input_data_schema = RlInput
    metrics_schema = RlMetrics

    def __init__(self, config: RlConfig) -> None:
        super().__init__(config)
        self.limits = inference_limits(config)
        self._work = WorkArea("rl", config.work_dir)

    @classmethod
    def child_limits(cls, config: RlConfig) -> dict[str, ChildLimits]:
        return {
            "inference_memory_bytes": inference_limits(config),
            "max_model_bytes (its policy reader)": reader_limits(config.max_model_bytes),
        }

    def validate(self, data: RlInput) -> RlMetrics:
        config = self.config
        work = self._work.new()
        with current_scope().host_work("download"):
            policy = fetch_policy(
                data.hg_repo_id,
                data.revision,
                data.model_filename,
                work / "policy",
                config.max_model_bytes,
                config.max_external_data_bytes,
            )
        current_scope().note("commit", policy.commit)
        log.info(
            "scoring %s/%s at commit %s (revision %s)",
            data.hg_repo_id,
            data.model_filename,
            short_commit(policy.commit),
            data.revision,
        )
        graph = inspect_policy(
            policy.model, policy.folder, work / "inspect", config.max_model_bytes
        )
        if graph.parameter_count > data.max_params:
            current_scope().penalty(
                "over_max_params",
                f"{data.hg_repo_id} has {graph.parameter_count} parameters, over max_params "
                f"{data.max_params}: average_reward {PENALTY_REWARD:g}",
            )
            return RlMetrics(average_reward=PENALTY_REWARD)
        with current_scope().host_work("data"):
            path = fetch_validation_set(
                data.validation_set_url, work / "validation", config.max_validation_set_bytes,
                default_name="validation_set.npz",
            )  # fmt: skip
            validation = load_validation_set(path, config.max_validation_set_unpacked_bytes)
        log.debug(
            "validation set: %d rows, %d features, %d venues",
            validation.features.shape[0],
            validation.features.shape[1],
            validation.venues,
        )
        actions = run_policy(
            policy.model,
            validation.features,
            validation.venues,
            config.per_device_eval_batch_size,
            self.limits,
            work / "inference",
            config.inference_threads,
        )
        mean = average_reward(rewards(actions, validation.info))
        return RlMetrics(average_reward=_submitted(mean))

    def cleanup(self) -> None:
        self._work.clean()


def _submitted(value: np.float32) -> float:
    if not math.isfinite(float(value)):
        current_scope().penalty(
            "no_score", f"the average reward is {value}: average_reward {PENALTY_REWARD:g}"
        )
        return PENALTY_REWARD
    return float(value)


MODULE = RlModule
__all__ = ["MODULE", "RlConfig", "RlInput", "RlMetrics", "RlModule"]
