"""Grading the generated answers with judge models behind an OpenAI-compatible API
(docs/llm-judge-scoring.md, "Judging").

Every judge call goes through the official `openai` client with its own retries off, so that
this module's policy applies: 408, 409, 429, 5xx, timeouts, lost connections and replies without
a parsable JSON score are retried with backoff. A judge that stays unreachable or refuses the key
is the operator's problem, never the submission's: RecoverableException, naming the endpoint
(never the key), keeps the assignment for later.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any, TypeVar

import openai

from validator.errors import ConfigError, RecoverableException
from validator.progress import Progress

log = logging.getLogger(__name__)

PROMPTS = Path(__file__).with_name("prompts")
RUBRIC_FILES = {1: "direct.txt", 2: "reference.txt", 3: "function_call.txt"}
MAX_RUBRIC_BYTES = 64 * 1024
# Backoff before retry k (1-based): BACKOFF_SECONDS * 2**(k-1), a Retry-After instead when the
# server sends one; every wait is capped at MAX_WAIT_SECONDS. Module constants, read at call
# time, so that tests can make them small.
BACKOFF_SECONDS = 1.0
MAX_WAIT_SECONDS = 60.0
RETRIED_STATUSES = frozenset({408, 409, 429})  # and every 5xx
# Upstream's reading of a reply that never gives a score: the middle grade, with no weight.
UNPARSED = (5.0, 0.0)
UNPARSABLE = "no parsable score"
THINKING = re.compile(r"<think>.*?</think>", re.S)
MAX_REPLY_CHARS = 100_000  # of a judge's reply, searched for the JSON object
MAX_JSON_STARTS = 64  # `{` positions tried

T = TypeVar("T")


@dataclass(frozen=True)
class Reply:
    score: float
    confidence: float
    parsed: bool
    refused: str | None = None  # why the judge refused the request (a 4xx), if it did


@dataclass(frozen=True)
class _Failed:
    """One attempt that did not give a result: why, and how long the server asked us to wait."""

    why: str
    retry: bool = True
    wait: float | None = None


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
    """The judge's prompt for one answer to `prompt` (a conversation.Prompt: its `transcript`,
    `reference` and `tools_text`); an unknown prompt id falls back to 1, as upstream.
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
    vLLM- and SGLang-style servers take it, sent in the request body)."""
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
    that has both as numbers; None when there is none. `<think>` blocks are skipped; code
    fences, prose around the object, nesting and braces inside its strings are fine."""
    text = THINKING.sub("", (text or "")[:MAX_REPLY_CHARS])
    decoder = json.JSONDecoder()
    start = text.find("{")
    for _ in range(MAX_JSON_STARTS):
        if start < 0:
            break
        try:
            data, _end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            data = None
        found = _grade_in(data)
        if found is not None:
            return found
        start = text.find("{", start + 1)
    return None


def _grade_in(data: object) -> tuple[float, float] | None:
    if not isinstance(data, dict):
        return None
    try:
        values = [data["score"], data["confidence"]]
        if any(isinstance(v, bool) for v in values):
            return None
        score, confidence = (float(v) for v in values)
    except (KeyError, TypeError, ValueError):
        return None
    if math.isnan(score) or math.isnan(confidence):
        return None
    return min(max(score, 1.0), 10.0), min(max(confidence, 0.0), 1.0)


def aggregate(replies: list[Reply]) -> float:
    """The module's score: the mean over all replies of score × confidence, divided by 10."""
    if not replies:
        raise ValueError("no judge replies to aggregate")
    return sum(r.score * r.confidence for r in replies) / len(replies) / 10


class Judge:
    """The judge endpoint: lists its models at construction (a wrong URL or key stops the
    validator at start-up), then grades rubric prompts with them."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float,
        retries: int,
        concurrency: int,
        backoff_seconds: float | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries, self.concurrency = retries, concurrency
        self.backoff = BACKOFF_SECONDS if backoff_seconds is None else backoff_seconds
        self._key = api_key  # only to keep it out of relayed server messages
        self.client = openai.OpenAI(
            base_url=self.base_url, api_key=api_key, timeout=timeout, max_retries=0
        )
        self.models = self._list_models()

    @classmethod
    def from_environment(cls, config: Any) -> Judge:
        base_url = os.environ.get("OPENAI_BASE_URL", "").strip()
        api_key = os.environ.get("OPENAI_API_KEY", "").strip()
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
        result = self._with_retries(lambda: [m.id for m in self.client.models.list()])
        if isinstance(result, _Failed):
            raise self._unusable(f"cannot list its models ({result.why})")
        return sorted(result)

    def resolve_models(self, eval_model_list: list[str]) -> list[str]:
        """The task's judge models that the endpoint lists; every listed one if none is."""
        chosen = [name for name in eval_model_list if name in self.models]
        if chosen:
            return chosen
        if not self.models:
            raise self._unusable("lists no models")
        return list(self.models)

    def grade(self, text: str, model: str, temperature: float) -> Reply:
        """One judge reply to the rubric prompt `text`. Unparsable after every retry: 5 × 0;
        refused (a 4xx other than 401/403/408/409/429, not retried): 5 × 0, marked refused;
        anything else still failing: RecoverableException."""

        def ask() -> tuple[float, float] | _Failed:
            response = self.client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": text}],
                temperature=temperature,
                **request_options(model),
            )
            content = response.choices[0].message.content if response.choices else None
            return parse_reply(content) or _Failed(UNPARSABLE)

        result = self._with_retries(ask)
        if not isinstance(result, _Failed):
            return Reply(*result, parsed=True)
        if result.why == UNPARSABLE:
            return Reply(*UNPARSED, parsed=False)
        if not result.retry:
            return Reply(*UNPARSED, parsed=False, refused=result.why)
        raise self._unusable(f"model {model} failed {self.retries + 1} times (last: {result.why})")

    def grade_all(
        self, texts: list[str], models: list[str], eval_require: int, temperature: float
    ) -> list[Reply]:
        """Every model grades every text `eval_require` times, `concurrency` calls at once;
        ordered by text, then model, then repeat. The first call that fails for good cancels
        the calls not started yet. A model that refused every one of its requests is
        misconfigured (e.g. a temperature it does not take): RecoverableException."""
        jobs = [(text, model) for text in texts for model in models for _ in range(eval_require)]
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(jobs))))
        try:
            futures = [pool.submit(self.grade, text, model, temperature) for text, model in jobs]
            progress = Progress("judging", total=len(futures), unit="judge calls")
            replies = []
            for future in futures:
                replies.append(future.result())
                progress.advance()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        for model in models:
            mine = [reply for (_, m), reply in zip(jobs, replies, strict=True) if m == model]
            if mine and all(reply.refused for reply in mine):
                raise self._unusable(f"model {model} refused every request ({mine[0].refused})")
        unparsed = sum(not reply.parsed for reply in replies)
        if unparsed:
            log.warning(
                "%d of %d judge replies gave no score (counted as 5 x 0)", unparsed, len(replies)
            )
        return replies

    def _with_retries(self, call: Callable[[], T | _Failed]) -> T | _Failed:
        """`call` until it gives a result, at most 1 + retries times, or the last failure."""
        failed = _Failed("no attempt")
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self._wait(attempt, failed.wait))
            result = self._attempt(call)
            if not isinstance(result, _Failed):
                return result
            failed = result
            if not failed.retry:
                break
        return failed

    def _attempt(self, call: Callable[[], T | _Failed]) -> T | _Failed:
        """One call, its errors sorted: a refused key raises at once; the rest are failures,
        retried unless the server refused the request itself."""
        try:
            return call()
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise self._unusable(f"refused the key (HTTP {exc.status_code})") from None
        except openai.APIStatusError as exc:
            status = exc.status_code
            if status in RETRIED_STATUSES or status >= 500:
                return _Failed(f"HTTP {status}", wait=_retry_after(exc.response))
            return _Failed(f"HTTP {status}: {self._scrub(_server_message(exc))}", retry=False)
        except openai.APIConnectionError as exc:  # timeouts included
            return _Failed(type(exc).__name__)
        except openai.APIResponseValidationError:
            return _Failed(UNPARSABLE)

    def _wait(self, attempt: int, asked: float | None) -> float:
        wait = self.backoff * 2 ** (attempt - 1) if asked is None else asked
        return min(max(wait, 0.0), MAX_WAIT_SECONDS)

    def _scrub(self, message: str) -> str:
        """A server's error message, short and without the key (some servers echo it)."""
        return message.replace(self._key, "***")[:200] if self._key else message[:200]


def _retry_after(response: Any) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (a number; an HTTP date is ignored)."""
    if response is None:
        return None
    for header, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            value = float(response.headers.get(header, ""))
        except ValueError:
            continue
        if math.isfinite(value):
            return value / scale
    return None


def _server_message(exc: openai.APIStatusError) -> str:
    """The `message` of an OpenAI-style error body, else the client's text for the error."""
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"]
    return exc.message
