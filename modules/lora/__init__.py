"""The lora module: scores a submitted LoRA adapter by validation loss in bits per character,
as the network's reference does (docs/lora-scoring.md), treating the submission as hostile
(docs/lora-scoring.md, "Untrusted submissions")."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

from modules.lora.adapter_shapes import check_against_base
from modules.lora.adapters import AdapterRejected, attacher, plan_adapter
from modules.lora.base_models import gpu_type, read_base
from modules.lora.dataset import EncodedSet, EncodedSetCache
from modules.lora.forward import default_max_batch_size, example_losses
from modules.lora.host_memory import keep_freed_memory
from modules.lora.hub import DownloadLimits, FetchedSubmission, fetch_adapter
from modules.lora.metrics import (
    check_token_byte_ratio,
    eval_loss,
    high_loss_metrics,
    score_metrics,
)
from modules.lora.precision import pick_precision
from modules.lora.reading import read_adapter
from modules.lora.schemas import LoraConfig, LoraInput, LoraMetrics
from modules.lora.templates import get_template
from validator.kit import (
    BaseValidationModule,
    ConfigError,
    HeldBase,
    SubmissionRejected,
    WarmBase,
    WorkArea,
    check_adapter_patterns,
    current_scope,
    fetch_base_model,
    fetch_validation_set,
    pick_device,
    short_commit,
)

log = logging.getLogger(__name__)


class LoraModule(BaseValidationModule[LoraConfig, LoraInput]):
    config_schema = LoraConfig
    input_data_schema = LoraInput
    metrics_schema = LoraMetrics

    def __init__(self, config: LoraConfig) -> None:
        super().__init__(config)
        if not config.lora_only:
            raise ConfigError("lora_only=false (scoring full models) is not supported yet")
        self.device = pick_device()
        if self.device == "cpu":
            keep_freed_memory()  # a CPU merge otherwise spends most of its time in page faults
        if config.quantization != "none":
            if self.device == "cpu":
                raise ConfigError(f"quantization {config.quantization!r} needs a CUDA GPU")
            log.warning(
                "%s quantization is on: scores will differ from other validators",
                config.quantization,
            )
        self.precision = pick_precision(self.device, config.fp16)
        log.debug("scoring precision: %s", self.precision.describe())
        if not self.precision.matches_network:
            log.warning("fp16 is false: bf16 scores differ from the network's (fp16 on GPU)")
        self.merge = config.merge_adapter and config.quantization == "none"
        self.max_batch_size = config.max_batch_size or default_max_batch_size(self.device)
        # Bases stay loaded across assignments; a merge or restore that fails is a device fault
        # (strict): the process restarts and the assignment is rescored.
        read = partial(
            read_base,
            fetch=fetch_base_model,
            device=self.device,
            dtype=self.precision.weights,
            quantization=config.quantization,
        )
        self.bases = WarmBase(read, capacity=config.cached_base_models, strict=True)
        self.limits = DownloadLimits(
            max_file_bytes=config.max_adapter_file_bytes,
            max_total_bytes=config.max_adapter_total_bytes,
            max_validation_set_bytes=config.max_validation_set_bytes,
        )
        self._work = WorkArea("lora", config.work_dir)
        self._encoded = EncodedSetCache()

    def validate(self, data: LoraInput) -> LoraMetrics:
        get_template(data.base_model)  # an unknown key fails before anything is downloaded
        work = self._work.new()
        submission = self._fetch(data, work)
        # The one child that parses the submission's files (docs/lora-scoring.md, "Reading the
        # adapter"): this process gets plain values back.
        what = f"submission {data.hg_repo_id}@{short_commit(submission.commit)}"
        adapter = read_adapter(submission.path, work / "reading", what)
        plan = plan_adapter(adapter.config, self.config.supported_base_models, adapter.dropped_keys)
        if plan.dropped_keys:
            log.debug("ignored empty adapter_config keys: %s", ", ".join(plan.dropped_keys))
        with current_scope().host_work("load"):
            base = self.bases.get(plan.base_model)
        if base.parameter_count > data.max_params:
            current_scope().penalty(
                "over_max_params",
                f"{plan.base_model} has {base.parameter_count} parameters, over max_params "
                f"{data.max_params}: loss 999",
            )
            return LoraMetrics(**high_loss_metrics(), gpu_type=gpu_type(self.device))
        # Before peft allocates a layer: a hostile rank would make it allocate gigabytes.
        check_against_base(plan, base.model, adapter.tensors)
        # peft runs the config's module patterns against the base's names in this process.
        check_adapter_patterns(
            submission.path / "adapter_config.json", base.model, work / "patterns"
        )
        with current_scope().host_work("data"):
            encoded = self._encode(data, base, work)
        # Whatever happens in the block (a score, a refusal, a fault), the next submission
        # meets the base as loaded: the adapter is undone and the base checked, or dropped.
        with self.bases.applied(
            attacher(submission.path, plan),
            user=data.hg_repo_id,
            merge=self.merge,
            reload=plan.needs_base_reload,
        ) as model:
            losses = example_losses(
                model,
                encoded.examples,
                token_budget=self.config.token_budget,
                max_batch_size=self.max_batch_size,
                pad_token_id=base.extra.pad_token_id,  # extra: the base's tokenizer
                autocast=self.precision.autocast,
                packing=self.config.packing,
            )
        return self._metrics(eval_loss(losses), encoded.total_target_tokens, encoded.total_bytes)

    def _fetch(self, data: LoraInput, work: Path) -> FetchedSubmission:
        """The submission's files, an adapter's (a full model is refused: lora_only)."""
        with current_scope().host_work("download"):
            submission = fetch_adapter(
                data.hg_repo_id, data.revision, work / "adapter", self.limits
            )
        current_scope().note("commit", submission.commit)
        # The scoring line names the repo and the result's line the commit: this is --debug's.
        log.debug(
            "scoring %s at commit %s (revision %s)",
            data.hg_repo_id,
            submission.commit,
            data.revision,
        )
        if submission.ignored_files:
            log.debug("not downloaded (not needed): %s", ", ".join(submission.ignored_files))
        if not submission.is_lora:
            raise SubmissionRejected(
                f"{data.hg_repo_id} has no adapter_config.json: a full model, and lora_only is set"
            )
        return submission

    def _encode(self, data: LoraInput, base: HeldBase, work: Path) -> EncodedSet:
        path = fetch_validation_set(
            data.validation_set_url,
            work / "validation.jsonl",
            self.limits.max_validation_set_bytes,
        )
        encoded = self._encoded.get(  # the base's key is its repo id: its tokenizer's name
            path, data.base_model, str(base.key), base.extra, data.context_length
        )
        log.debug("validation set: %d examples", len(encoded.examples))
        check_token_byte_ratio(encoded.total_target_tokens, encoded.total_bytes)
        return encoded

    def _metrics(self, loss: float, target_tokens: int, total_bytes: int) -> LoraMetrics:
        values = score_metrics(loss, target_tokens, total_bytes)
        return LoraMetrics(**values, gpu_type=gpu_type(self.device))

    def cleanup(self) -> None:
        self._work.clean()


MODULE = LoraModule
__all__ = [
    "MODULE",
    "AdapterRejected",
    "LoraConfig",
    "LoraInput",
    "LoraMetrics",
    "LoraModule",
]
