"""The llm_judge module: the submitted model (a LoRA adapter on a supported Qwen3.5 base, or a
full model) answers the validation set's prompts, LLM judges behind an OpenAI-compatible API
grade every answer, and `score` is the mean graded quality, as the network's llm_judge
validator computes it (docs/llm-judge-scoring.md)."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypedDict, TypeVar

import numpy as np
import torch
from transformers import PreTrainedModel

from modules.llm_judge.conversation import Prompt, read_prompts
from modules.llm_judge.generation import EndTokens, Request, Sampling, assignment_seed, generate
from modules.llm_judge.judge_texts import JudgeTexts, load_judge_texts
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
    ChildLimits,
    ConfigError,
    OperatorError,
    PenaltyKind,
    SubmissionRejected,
    WarmBase,
    WorkArea,
    current_run,
    current_scope,
    fetch_validation_set,
    short_commit,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class LlmJudgeModule(BaseValidationModule[LlmJudgeConfig, LlmJudgeInput]):
    config_schema = LlmJudgeConfig
    input_data_schema = LlmJudgeInput
    metrics_schema = LlmJudgeMetrics

    @classmethod
    def check_setup(cls, config: LlmJudgeConfig) -> str:
        """The judge texts can be had and the judge endpoint answers with its models, the
        configured judge models among them: the validator runs this before it asks for any
        assignment, the doctor for its row."""
        problems: list[str] = []  # every problem at once, not the first
        texts = _checked(read_judge_texts, config, problems)
        judge = _checked(endpoint_judge, config, problems)
        if texts is None or judge is None:
            raise OperatorError("; ".join(problems))
        return f"judge texts from {texts.source}; {judge.base_url} lists {len(judge.models)} models"

    @classmethod
    def child_limits(cls, config: LlmJudgeConfig) -> dict[str, ChildLimits]:
        keys = "template_cpu_seconds, template_memory_bytes and template_max_output_bytes"
        return {keys: TemplateLimits.of(config).for_items(0)}  # more CPU per item on top

    def __init__(self, config: LlmJudgeConfig) -> None:
        super().__init__(config)
        # The same as check_setup, which the validator ran at start: the texts and the judge
        # are kept here.
        self.texts = read_judge_texts(config)
        self.judge = endpoint_judge(config)
        self.sampling = Sampling(
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            max_new_tokens=config.max_new_tokens,
            token_budget=config.generation_token_budget,
            max_batch=config.max_generation_batch,
        )
        self._work = WorkArea("llm_judge", config.work_dir)
        # The base of LoRA submissions stays loaded between assignments, on the GPU when there
        # is one, merged into and restored bit for bit (the kit's WarmBase); scores are those of
        # a fresh load.
        device, dtype = device_and_dtype()
        self.warm = WarmBase(partial(read_model, dtype=dtype, device=device))

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
        commit = short_commit(submission.commit)
        log.info("scoring %s (%s) at commit %s", data.hg_repo_id, kind, commit)
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
        limits = TemplateLimits.of(config)
        bounded = _Bounded(submitted=full_model, limits=limits, work=work / "tokenizer")
        items = [(p.messages, p.tools, p.fallback) for p in prompts]
        encoded = encode_prompts(loaded.tokenizer_dir, items, **bounded)
        ends = EndTokens(encoded.eos_token_id, encoded.pad_token_id)
        _check_ids(loaded.model, encoded.ids, ends)
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


class _Bounded(TypedDict):
    """How the tokenizer's child runs (templating.py): whose tokenizer, its limits, its folder."""

    submitted: bool
    limits: TemplateLimits
    work: Path


def read_judge_texts(config: LlmJudgeConfig) -> JudgeTexts:
    """The rubric and judge-system texts: protocol data read at start-up (the network's wording
    by default); a source that cannot be had is an OperatorError. Fetched texts are cached in
    the run's state dir, for a start with the source down."""
    return load_judge_texts(
        config.prompt_source, current_run().state_dir, prompt_files=config.prompt_files
    )


def endpoint_judge(config: LlmJudgeConfig) -> Judge:
    """The judge endpoint, asked for its models now: a wrong or missing URL or key, an answer
    that is not a model list, or a configured judge model it does not list is an
    OperatorError (ConfigError for settings not given, all of them at once)."""
    missing = [
        name
        for name, value in (
            ("OPENAI_BASE_URL: the judge endpoint, e.g. https://.../v1", judge_base_url()),
            ("OPENAI_API_KEY: the judge endpoint's key", current_run().secret("OPENAI_API_KEY")),
        )
        if not value
    ]
    if missing:
        raise ConfigError("missing " + "; missing ".join(missing))
    try:
        judge = Judge.from_environment(config)
    except (TypeError, AttributeError, KeyError) as exc:  # the client read a listing's shape
        raise OperatorError(
            f"judge endpoint {judge_base_url()}: GET /models answered something that is not a "
            f"model list ({type(exc).__name__}: {exc}); check OPENAI_BASE_URL"
        ) from None
    absent = [model for model in config.judge_models if model not in judge.models]
    if absent:
        raise OperatorError(
            f"judge endpoint {judge.base_url} does not list the judge models "
            f"{', '.join(absent)} of judge_models (it lists {len(judge.models)}): serve them "
            "there, or point OPENAI_BASE_URL at an endpoint that does"
        )
    return judge


def judge_base_url() -> str:
    return os.environ.get("OPENAI_BASE_URL", "").strip()


def _penalty(kind: PenaltyKind, reason: str) -> LlmJudgeMetrics:
    """The network's -999 for a submission it cannot score. Why goes with the result
    (Scope.penalty: the journal, the status page, the report); the metrics are submitted as
    they are."""
    current_scope().penalty(kind, f"{reason}: score {PENALTY_SCORE:g}")
    return LlmJudgeMetrics(score=PENALTY_SCORE)


def _checked(
    check: Callable[[LlmJudgeConfig], T], config: LlmJudgeConfig, problems: list[str]
) -> T | None:
    """`check(config)`; None where it raised an OperatorError, its problem added."""
    try:
        return check(config)
    except OperatorError as exc:
        problems.append(str(exc))
        return None


def _check_ids(model: PreTrainedModel, ids: list[np.ndarray], ends: EndTokens) -> None:
    """Every prompt has ids, and every id the model will embed (the prompts', the padding's,
    the end of text's) is a row of its embeddings: past them, an index error on a CPU, a
    device-side assert (a restart) on a GPU. Only a hostile tokenizer fails this; the network
    cannot score it either. The assignment fails (SubmissionRejected), whoever's the tokenizer
    is (a LoRA's is its base's)."""
    # An attribute of whatever module embeds (nn.Embedding, or a subclass): read by name.
    rows: int = getattr(model.get_input_embeddings(), "num_embeddings")  # noqa: B009
    for index, prompt in enumerate(ids):
        if not len(prompt):
            raise SubmissionRejected(
                f"the tokenizer gives validation set prompt {index + 1} no token ids"
            )
        if int(prompt.max()) >= rows:
            raise SubmissionRejected(
                f"the tokenizer gives validation set prompt {index + 1} token id "
                f"{int(prompt.max())}, outside the model's {rows} embeddings"
            )
    for name in ("eos_token_id", "padding"):
        value = getattr(ends, name)
        if value is not None and value >= rows:
            raise SubmissionRejected(
                f"the tokenizer's {name} {value} is outside the model's {rows} embeddings"
            )


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
