"""The llm_judge module's config, input and metrics schemas (docs/llm-judge-scoring.md).

`LlmJudgeConfig` holds every operator setting's default; `configs/llm_judge.json` sets the
supported base models. `EvalArgs` is what a task's `eval_args` may say, with upstream's
defaults.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from modules.llm_judge.judge_texts import NETWORK_COMMIT, PromptSource
from validator.kit import BaseConfig, BaseInputData, BaseMetrics

GIB = 1024**3
# What upstream submits for a model over max_params or one that cannot be loaded.
PENALTY_SCORE = -999.0


class EvalArgs(BaseModel):
    """A task's `eval_args`; keys it does not know are ignored, as upstream ignores them."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    gen_require: int = Field(1, ge=1, le=16)  # answers generated per prompt
    # Grades per judge model per answer; 0 stands for a value the network's range() cannot
    # take (text, a fraction, a list): there every conversation counts once as 5 x 0.5.
    eval_require: int = Field(3, ge=0, le=16)
    # The judges' sampling temperature, sent as the task gives it (an int stays an int, a
    # number in text stays text, null is null), as the network sends it.
    temperature: Any = 0.1
    # 1 direct, 2 against the reference answer, 3 function call; kept as the task gives it
    # (any JSON value), since the network compares it as Python does (grading.rubric_id).
    prompt_id: Any = 0
    eval_model_list: list[str] = Field(default_factory=list)  # empty: every model listed

    @field_validator("gen_require", mode="before")
    @classmethod
    def _a_count_the_network_can_range_over(cls, value: Any) -> Any:
        """The network generates `range(gen_require)` times: an int (or a bool, which Python
        takes as 0 or 1); anything else makes it raise, and the input is refused (not the lax
        reading of "2" or 2.0 as 2)."""
        if not isinstance(value, int):
            raise ValueError(f"gen_require must be an integer, not {type(value).__name__}")
        return int(value)

    @field_validator("eval_require", mode="before")
    @classmethod
    def _grades_the_network_can_count(cls, value: Any) -> Any:
        """The network grades `range(eval_require)` times inside each conversation's task:
        text, a fraction or a list fail every task, so every conversation counts 5 x 0.5
        (0 here); null or an object make its whole assignment raise (refused); an int (or a
        bool) is the count, and outside 1..16 is refused (a departure: bounded cost)."""
        if isinstance(value, int):
            if not 1 <= value <= 16:
                raise ValueError("eval_require must be 1 to 16")
            return int(value)
        if isinstance(value, (str, float, list)):
            return 0
        raise ValueError(f"eval_require must be an integer, not {type(value).__name__}")

    @field_validator("temperature", mode="before")
    @classmethod
    def _a_temperature_kept_as_given(cls, value: Any) -> Any:
        """Kept as given when its number is 0 to 2 (a departure past that: bounded, sensible
        judging); a bool, a list or an object are refused."""
        if value is None:
            return None
        number = value
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                raise ValueError("temperature: text that is not a number") from None
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ValueError(f"temperature must be a number, not {type(value).__name__}")
        if not 0 <= number <= 2:
            raise ValueError("temperature must be 0 to 2")
        return value

    @field_validator("eval_model_list", mode="before")
    @classmethod
    def _as_the_network_iterates(cls, value: Any) -> Any:
        """The network reads the list by truth and iteration: any empty value (null, "", {},
        0, false) means every listed model, text is its characters, an object its keys. Other
        values (a number, true) make the network raise: refused here."""
        if not value and not isinstance(value, list):
            return []
        if isinstance(value, (str, dict)):
            return list(value)
        return value


class LlmJudgeConfig(BaseConfig):
    supported_base_models: list[str] = Field(min_length=1)
    # Generation (the submitted model): upstream's sampling.
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.8, gt=0, le=1)
    top_k: int = Field(20, ge=0)
    max_new_tokens: int = Field(2048, gt=0)
    generation_token_budget: int = Field(65536, gt=0)  # prompt + new tokens per batch
    max_generation_batch: int = Field(64, gt=0)
    # Judging.
    judge_timeout_seconds: float = Field(120.0, gt=0)
    judge_retries: int = Field(3, ge=0)  # upstream's count
    judge_concurrency: int = Field(8, gt=0)  # judge calls in flight at once
    # Judge models this validator's tasks name: the start-up checks (and the doctor) stop when
    # the endpoint does not list one. Empty: any listing will do.
    judge_models: list[str] = Field(default_factory=list)
    # Where the rubric and judge-system texts come from (judge_texts.py): a commit of the
    # network's validator (default: the pinned one), a folder URL, a local checkout, `builtin`.
    prompt_source: PromptSource = NETWORK_COMMIT
    # An alias (validator/_moved.py): files (`$` syntax) replacing rubrics by id.
    prompt_files: dict[int, str] = Field(default_factory=dict)
    # Downloads.
    max_adapter_total_bytes: int = Field(4 * GIB, gt=0)
    max_model_total_bytes: int = Field(80 * GIB, gt=0)
    max_validation_set_bytes: int = Field(1 * GIB, gt=0)
    # The chat template renders in a child process with these limits (templating.py); past
    # one, a full model is rejected. Honest templates need seconds for thousands of prompts.
    template_cpu_seconds: float = Field(60.0, gt=0)  # after the child's imports
    template_memory_bytes: int = Field(2 * GIB, gt=0)  # address space after its imports
    template_wall_seconds: float = Field(300.0, gt=0)  # the whole child, imports included
    # Per prompt rendered or answer decoded, on top of the CPU limit (twice on the wall's):
    # a set of 20,000 prompts takes ~2 ms each here, so the set's size never rejects.
    template_seconds_per_item: float = Field(0.01, ge=0)
    template_max_output_bytes: int = Field(256 * 1024**2, gt=0)  # all rendered texts
    work_dir: str | None = None


class LlmJudgeInput(BaseInputData):
    submitter_fields = frozenset({"hg_repo_id", "revision"})
    url_fields = frozenset({"validation_set_url"})

    hg_repo_id: str
    revision: str = "main"
    validation_set_url: str
    base_model: str
    # As the network reads them: context_length is never used (prompts are not shortened),
    # and a max_params of 0 or less is a bound no model meets (-999), not a refused input.
    context_length: int
    max_params: int
    eval_args: EvalArgs = Field(default_factory=EvalArgs)


class LlmJudgeMetrics(BaseMetrics):
    score: float
