"""The llm_judge module: the submitted model (a LoRA adapter on a supported Qwen3.5 base, or a
full model) answers the validation set's prompts, LLM judges behind an OpenAI-compatible API
grade every answer, and `score` is the mean graded quality, as the network's llm_judge
validator computes it (docs/llm-judge-scoring.md)."""

from __future__ import annotations

import gc
import logging
from functools import partial
from pathlib import Path

import torch

from modules.llm_judge.conversation import Prompt, read_prompts
from modules.llm_judge.generation import EndTokens, Request, Sampling, assignment_seed, generate
from modules.llm_judge.judge_texts import load_judge_texts
from modules.llm_judge.judging import Judge, score_answers
from modules.llm_judge.loading import (
    LoadedModel,
    ModelCannotLoad,
    device_and_dtype,
    load,
    read_model,
)
from modules.llm_judge.schemas import (
    PENALTY_SCORE,
    LlmJudgeConfig,
    LlmJudgeInput,
    LlmJudgeMetrics,
)
from modules.llm_judge.submission import (
    OverMaxParams,
    Submission,
    check_max_params,
    fetch_submission,
)
from modules.llm_judge.templating import (
    TemplateLimits,
    TokenizerCannotLoad,
    decode_answers,
    encode_prompts,
)
from validator.kit import (
    BaseValidationModule,
    PenaltyKind,
    SubmissionRejected,
    WarmBase,
    WorkArea,
    current_run,
    current_scope,
    fetch_validation_set,
)

log = logging.getLogger(__name__)


class LlmJudgeModule(BaseValidationModule):
    config_schema = LlmJudgeConfig
    input_data_schema = LlmJudgeInput
    metrics_schema = LlmJudgeMetrics
    task_type = ""  # the Fed Ledger's type for these tasks is not known here: no check

    def __init__(self, config: LlmJudgeConfig) -> None:
        super().__init__(config)
        # The rubric and judge-system texts are protocol data read at start-up (the network's
        # wording by default): a source that cannot be had stops the validator here (exit 3).
        # Fetched texts are cached in the run's state dir, for a start with the source down.
        self.texts = load_judge_texts(
            config.prompt_source, current_run().state_dir, prompt_files=config.prompt_files
        )
        # Asks the endpoint for its models now: a wrong URL or key stops the validator at
        # start-up (exit 3), before any assignment is taken.
        self.judge = Judge.from_environment(config)
        self.sampling = Sampling(
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            max_new_tokens=config.max_new_tokens,
            token_budget=config.generation_token_budget,
            max_batch=config.max_generation_batch,
        )
        self._work = WorkArea("llm_judge", config.work_dir)
        # The base of LoRA submissions stays loaded between assignments on a CPU host, merged
        # into and restored bit for bit (the kit's WarmBase); scores are those of a fresh load.
        self.warm = WarmBase(partial(read_model, dtype=device_and_dtype()[1]))

    def validate(self, data: LlmJudgeInput) -> LlmJudgeMetrics:
        config = self.config
        work = self._work.new()
        with current_scope().host_work("download"):
            try:
                submission = fetch_submission(
                    data.hg_repo_id,
                    data.revision,
                    work / "submission",
                    config.supported_base_models,
                    config.max_adapter_total_bytes,
                    config.max_model_total_bytes,
                    data.max_params,
                )
            except OverMaxParams as exc:  # a full model, counted before its weights are fetched
                return _penalty("over_max_params", str(exc))
            except SubmissionRejected as exc:
                # The network scores a submission it cannot load (no such repo, an unsupported
                # base, weights that do not load) -999, a completed result.
                return _penalty("cannot_load", f"the submission cannot be loaded: {exc}")
        full_model = submission.base_model is None
        kind = "full model" if full_model else f"LoRA on {submission.base_model}"
        current_scope().note("commit", submission.commit)
        log.info("scoring %s (%s) at commit %s", data.hg_repo_id, kind, submission.commit)
        with current_scope().host_work("data"):
            path = fetch_validation_set(
                data.validation_set_url, work / "validation.jsonl", config.max_validation_set_bytes
            )
        # The model before the set is read, in the network's order: a submission that cannot
        # be loaded scores -999 there even when the set then turns out unusable.
        try:
            loaded = load(submission, self.warm, data.hg_repo_id)
        except ModelCannotLoad as exc:
            return _penalty("cannot_load", f"the model cannot be loaded: {exc}")
        try:
            # A LoRA's count is its merged model's (a full model's was checked before its
            # weights were fetched, and loads to the same count).
            check_max_params(loaded.parameter_count, data.max_params, data.hg_repo_id)
            with current_scope().host_work("data"):
                prompts = read_prompts(path)
                models = self.judge.resolve_models(data.eval_args.eval_model_list)
            answers = self._answers(data, submission, prompts, loaded, work)
        except OverMaxParams as exc:
            return _penalty("over_max_params", str(exc))
        except TokenizerCannotLoad as exc:
            # The network loads the tokenizer with the model: one that does not load is -999.
            return _penalty("cannot_load", f"the model cannot be loaded: {exc}")
        finally:
            # Whatever happened (answers, a penalty, a fault), the next submission must meet
            # the base as loaded: the merge is undone and the base checked, or dropped.
            self.warm.release(data.hg_repo_id)
            del loaded
            _free_memory()
        log.debug("%d answers generated; %d judge models: %s", len(answers), len(models), models)
        with current_scope().host_work("wait"):
            score = score_answers(self.judge, self.texts, data.eval_args, prompts, answers, models)
        return LlmJudgeMetrics(score=score)

    def _answers(
        self,
        data: LlmJudgeInput,
        submission: Submission,
        prompts: list[Prompt],
        loaded: LoadedModel,
        work: Path,
    ) -> dict[tuple[int, int], str]:
        """The loaded model's answers to every prompt, gen_require times each."""
        config = self.config
        full_model = submission.base_model is None
        seed = assignment_seed(data.hg_repo_id, submission.commit, data.validation_set_url)
        # The chat template and the tokenizer run in a bounded child (templating.py): a full
        # model's are the submission's own. A LoRA's are its supported base's. The texts are
        # tokenized as the network tokenizes them, and never shortened.
        bounded = {
            "submitted": full_model,
            "limits": TemplateLimits.of(config),
            "work": work / "tokenizer",
        }
        items = [(p.messages, p.tools, p.fallback) for p in prompts]
        encoded = encode_prompts(loaded.tokenizer_dir, items, **bounded)
        ends = EndTokens(encoded.eos_token_id, encoded.pad_token_id)
        _check_ids(loaded.model, encoded.ids, ends, full_model)
        requests = [
            Request(index, repeat, encoded.ids[index])
            for index in range(len(prompts))
            for repeat in range(data.eval_args.gen_require)
        ]
        generated = generate(loaded.model, requests, self.sampling, seed, ends)
        keys = list(generated)
        texts = decode_answers(loaded.tokenizer_dir, [generated[k] for k in keys], **bounded)
        return dict(zip(keys, texts, strict=True))

    def cleanup(self) -> None:
        self._work.clean()


def _penalty(kind: PenaltyKind, reason: str) -> LlmJudgeMetrics:
    """The network's -999 for a submission it cannot score. Why goes with the result
    (Scope.penalty: the journal, the status page, the report); the metrics are submitted as
    they are."""
    current_scope().penalty(kind, f"{reason}: score {PENALTY_SCORE:g}")
    return LlmJudgeMetrics(score=PENALTY_SCORE)


def _check_ids(model, ids: list, ends: EndTokens, submitted: bool) -> None:
    """Every prompt has ids, and every id the model will embed (the prompts', the padding's,
    the end of text's) is a row of its embeddings: past them, an index error on a CPU, a
    device-side assert (a restart) on a GPU. Only a hostile tokenizer fails this; the network
    cannot score it either."""
    rows = model.get_input_embeddings().num_embeddings
    error = SubmissionRejected if submitted else ValueError
    for index, prompt in enumerate(ids):
        if not len(prompt):
            raise error(f"the tokenizer gives validation set prompt {index + 1} no token ids")
        if int(prompt.max()) >= rows:
            raise error(
                f"the tokenizer gives validation set prompt {index + 1} token id "
                f"{int(prompt.max())}, outside the model's {rows} embeddings"
            )
    for name in ("eos_token_id", "padding"):
        value = getattr(ends, name)
        if value is not None and value >= rows:
            raise error(f"the tokenizer's {name} {value} is outside the model's {rows} embeddings")


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


MODULE = LlmJudgeModule
__all__ = [
    "MODULE",
    "LlmJudgeConfig",
    "LlmJudgeInput",
    "LlmJudgeMetrics",
    "LlmJudgeModule",
    "Prompt",
]
