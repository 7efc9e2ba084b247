"""Grading the generated answers with judge models behind an OpenAI-compatible API
(docs/llm-judge-scoring.md, "Judging").

Every judge call goes through the official `openai` client with its own retries off, so that
this module's policy applies: 429, 5xx, timeouts, lost connections and replies without a
parsable JSON score are retried with backoff. A judge that stays unreachable or refuses the key
is the operator's problem, never the submission's: RecoverableException, naming the endpoint
(never the key), keeps the assignment for later.
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

import openai

from validator.errors import ConfigError, RecoverableException

PROMPTS = Path(__file__).with_name("prompts")
RUBRIC_FILES = {1: "direct.txt", 2: "reference.txt", 3: "function_call.txt"}
MAX_RUBRIC_BYTES = 64 * 1024
MAX_RETRY_AFTER = 60.0
# Upstream's reading of a reply that never gives a score: the middle grade, with no weight.
UNPARSED = (5.0, 0.0)
JSON_OBJECT = re.compile(r"\{.*?\}", re.S)


@dataclass(frozen=True)
class Reply:
    score: float
    confidence: float
    parsed: bool


def load_rubrics(prompt_files: dict[int, str]) -> dict[int, Template]:
    """The three rubric prompts: the module's own, or the operator's files where the config
    names them (scores depend on the wording; other validators may use other files)."""
    rubrics = {}
    for prompt_id, name in RUBRIC_FILES.items():
        path = Path(prompt_files.get(prompt_id, PROMPTS / name))
        try:
            if path.stat().st_size > MAX_RUBRIC_BYTES:
                raise ConfigError(
                    f"rubric prompt {prompt_id}: {path} is over {MAX_RUBRIC_BYTES} bytes"
                )
            rubrics[prompt_id] = Template(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"rubric prompt {prompt_id}: {path} cannot be read: {exc}") from None
    return rubrics


def rubric_prompt(rubrics: dict[int, Template], prompt_id: int, prompt: Any, answer: str) -> str:
    """The judge's prompt for one answer; an unknown prompt id falls back to 1, as upstream.
    safe_substitute: conversations are full of `$` and braces."""
    rubric = rubrics.get(prompt_id, rubrics[1])
    return rubric.safe_substitute(
        conversation=prompt.transcript,
        answer=answer,
        reference=prompt.reference if prompt.reference is not None else "(none)",
        tools=prompt.tools_text or "(none)",
    )


def request_options(model: str) -> dict[str, Any]:
    """What a model name's dash-separated parts ask for: `low`/`high` a reasoning effort (the
    chat API's `reasoning_effort`), `thinking` thinking on (`chat_template_kwargs`, as
    vLLM- and SGLang-style servers take it)."""
    parts = model.lower().split("-")
    options: dict[str, Any] = {}
    for effort in ("low", "high"):
        if effort in parts:
            options["reasoning_effort"] = effort
    if "thinking" in parts:
        options["extra_body"] = {"chat_template_kwargs": {"enable_thinking": True}}
    return options


def parse_reply(text: str | None) -> tuple[float, float] | None:
    """(score, confidence) clamped to 1..10 and 0..1, from the first JSON object in the reply
    that has both; None when there is none (code fences and prose around it are fine)."""
    for candidate in JSON_OBJECT.findall(text or ""):
        try:
            data = json.loads(candidate)
            score, confidence = float(data["score"]), float(data["confidence"])
        except (ValueError, KeyError, TypeError):
            continue
        if score != score or confidence != confidence:  # NaN
            continue
        return min(max(score, 1.0), 10.0), min(max(confidence, 0.0), 1.0)
    return None


def aggregate(replies: list[Reply]) -> float:
    """The module's score: the mean over all replies of score × confidence, divided by 10."""
    if not replies:
        raise ValueError("no judge replies to aggregate")
    return sum(r.score * r.confidence for r in replies) / len(replies) / 10


class Judge:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float,
        retries: int,
        concurrency: int,
        backoff_seconds: float = 1.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries, self.concurrency, self.backoff = retries, concurrency, backoff_seconds
        self.client = openai.OpenAI(
            base_url=self.base_url, api_key=api_key, timeout=timeout, max_retries=0
        )
        self.models = self._list_models()

    @classmethod
    def from_environment(cls, config: Any) -> Judge:
        base_url = os.environ.get("OPENAI_BASE_URL", "").strip()
        api_key = os.environ.get("OPENAI_API_KEY", "")
        if not base_url:
            raise ConfigError("missing OPENAI_BASE_URL: the judge endpoint, e.g. https://.../v1")
        if not api_key:
            raise ConfigError("missing OPENAI_API_KEY: the judge endpoint's key")
        return cls(
            base_url,
            api_key,
            config.judge_timeout_seconds,
            config.judge_retries,
            config.judge_concurrency,
        )

    def _unusable(self, why: str) -> RecoverableException:
        return RecoverableException(f"judge endpoint {self.base_url}: {why}")

    def _list_models(self) -> list[str]:
        try:
            return sorted(model.id for model in self.client.models.list())
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise self._unusable(f"refused the key (HTTP {exc.status_code})") from None
        except openai.APIError as exc:
            raise self._unusable(f"cannot list its models: {type(exc).__name__}") from None

    def resolve_models(self, eval_model_list: list[str]) -> list[str]:
        """The task's judge models that the endpoint lists; every listed one if none is."""
        chosen = [name for name in eval_model_list if name in self.models]
        if chosen:
            return chosen
        if not self.models:
            raise self._unusable("lists no models")
        return list(self.models)

    def grade(self, text: str, model: str, temperature: float) -> Reply:
        failure = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self._wait(attempt, failure))
            try:
                response = self.client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": text}],
                    temperature=temperature,
                    **request_options(model),
                )
            except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
                raise self._unusable(f"refused the key (HTTP {exc.status_code})") from None
            except openai.RateLimitError as exc:
                failure = _retry_after(exc) or "HTTP 429"
                continue
            except openai.InternalServerError as exc:
                failure = f"HTTP {exc.status_code}"
                continue
            except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                failure = type(exc).__name__
                continue
            content = response.choices[0].message.content if response.choices else None
            parsed = parse_reply(content)
            if parsed is not None:
                return Reply(*parsed, parsed=True)
            failure = "unparsable"
        if failure == "unparsable":
            return Reply(*UNPARSED, parsed=False)
        raise self._unusable(f"model {model} failed {self.retries + 1} times (last: {failure})")

    def _wait(self, attempt: int, failure: str) -> float:
        if failure.startswith("retry-after "):
            return min(float(failure.split()[1]), MAX_RETRY_AFTER)
        return self.backoff * 2 ** (attempt - 1)

    def grade_all(
        self, texts: list[str], models: list[str], eval_require: int, temperature: float
    ) -> list[Reply]:
        """Every model grades every text `eval_require` times, `concurrency` calls at once;
        ordered by text, then model, then repeat."""
        jobs = [(text, model) for text in texts for model in models for _ in range(eval_require)]
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda job: self.grade(job[0], job[1], temperature), jobs))


def _retry_after(exc: openai.APIStatusError) -> str | None:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    try:
        return f"retry-after {float(value)}" if value is not None else None
    except ValueError:
        return None
