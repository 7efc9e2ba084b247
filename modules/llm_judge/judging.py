"""Grading the generated answers with judge models behind an OpenAI-compatible API, as the
network's llm_judge validator grades them (docs/llm-judge-scoring.md, "Judging").

What the judges are sent and how their replies count is the network's rule, quirks included
(`grading.py`: rubric choice, per-name parameters, reply reading). What a failing judge does is
ours: every call goes through the official `openai` client with its own retries off and the
kit's overall deadline per attempt (which also ends it shortly after a stop signal, the
assignment then kept as a transient fault), so that this module's policy applies; a judge that
gives no
completion (HTTP errors, transport errors, a body that is not a completion, no text) after the
retries is the operator's problem, never the submission's: OperatorError, naming the
endpoint (never the key), keeps the assignment for later. Only a completion whose text holds no
score counts as the network's 5 x 0.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2
import openai

from modules.llm_judge.conversation import Prompt
from modules.llm_judge.grading import (
    CONVERSATION_FAILED,
    NO_SCORE,
    Grade,
    Temperature,
    aggregate,
    call_parameters,
    conversation_grades,
    judge_messages,
    parse_reply,
    resolve_models,
)
from validator.kit import (
    ANSWER_CAPS,
    AnswerTooLarge,
    CallAbandoned,
    ConfigError,
    OperatorError,
    Progress,
    capped_event_hooks,
    current_run,
    overall_deadline,
    reading_at_most,
    wait_or_stop,
)

if TYPE_CHECKING:  # the texts come from judge_texts at start-up
    from openai.types.chat import ChatCompletionMessageParam

    from modules.llm_judge.judge_texts import JudgeTexts

log = logging.getLogger(__name__)

# Backoff before retry k (1-based): BACKOFF_SECONDS * 2**(k-1), a Retry-After instead when the
# server sends one; every wait is capped at MAX_WAIT_SECONDS. Module constants, read at call
# time, so that tests can make them small.
BACKOFF_SECONDS = 1.0
MAX_WAIT_SECONDS = 60.0
RETRIED_STATUSES = frozenset({408, 409, 429})  # and every 5xx
# Statuses of a `/models` that the endpoint does not implement: the network then judges with
# this one model, whatever the task lists.
NO_LISTING_STATUSES = frozenset({404, 405, 501})
FALLBACK_MODELS = ["gpt-4o"]
SEED_RANGE = (0, 10_000)  # each call's `seed`, drawn at random as the network draws it
# No idle connection is kept: the overall deadline covers the sockets a call connects, and a
# pooled one, connected by another call (in another thread), would escape it.
CONNECTION_LIMITS = httpx2.Limits(max_connections=1000, max_keepalive_connections=0)

T = TypeVar("T")


@dataclass(frozen=True)
class _Failed:
    """One attempt that did not give a result: why, and how long the server asked us to wait."""

    why: str
    retry: bool = True
    wait: float | None = None
    status: int | None = None  # the HTTP status, when the server answered one
    not_finite: bool = False  # a completion whose score or confidence is NaN or infinite


# A reply that stayed NaN or infinite through the retries. A submission's answer can talk a
# judge into one, so it is not the judge failing unless that judge gave nothing else in the
# assignment (ask_all): otherwise it counts as a reply without a usable score, NO_SCORE.
NOT_FINITE = Grade(math.nan, 0.0)


class Judge:
    """The judge endpoint: lists its models at construction (a wrong URL or key stops the
    validator at start-up), then sends judge requests to them."""

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
        self.retries, self.concurrency, self.timeout = retries, concurrency, timeout
        self.backoff = BACKOFF_SECONDS if backoff_seconds is None else backoff_seconds
        self._key = api_key  # only to keep it out of relayed server messages
        # Every answer read under the kit's caps (judge.completion; the listing its own).
        self.client = openai.OpenAI(
            base_url=self.base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=0,
            http_client=openai.DefaultHttpxClient(
                limits=CONNECTION_LIMITS,
                event_hooks=capped_event_hooks(ANSWER_CAPS["judge.completion"]),
            ),
        )
        self.models = self._list_models()

    @classmethod
    def from_environment(cls, config: Any) -> Judge:
        base_url = os.environ.get("OPENAI_BASE_URL", "").strip()
        api_key = current_run().secret("OPENAI_API_KEY") or ""
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

    def _unusable(self, why: str) -> OperatorError:
        return OperatorError(f"judge endpoint {self.base_url}: {why}")

    def _list_models(self) -> list[str]:
        def listing() -> list[str]:
            with reading_at_most(ANSWER_CAPS["judge.models"]):
                return [model.id for model in self.client.models.list()]

        result = self._with_retries(listing)
        if isinstance(result, _Failed):
            if result.status in NO_LISTING_STATUSES:
                log.warning(
                    "judge endpoint %s does not list its models (%s): judging with %s, as the "
                    "network does",
                    self.base_url,
                    result.why,
                    FALLBACK_MODELS,
                )
                return list(FALLBACK_MODELS)
            raise self._unusable(f"cannot list its models ({result.why})")
        if not result:
            raise self._unusable("lists no models")
        return result

    def resolve_models(self, eval_model_list: list[str]) -> list[str]:
        """The task's judge names that the endpoint serves (the network's rule)."""
        return resolve_models(eval_model_list, self.models)

    def ask(
        self, messages: list[ChatCompletionMessageParam], name: str, temperature: Temperature
    ) -> Grade | None:
        """One judge request: the reply's grade (`CONVERSATION_FAILED` for a reply the network
        cannot read, which costs the whole conversation), or None when the server refused the
        request itself (a 4xx other than 401/403/408/409/429, not retried), or NOT_FINITE for
        a score that stayed NaN or infinite (ask_all decides what it counts). A judge that
        gives no completion after every retry: OperatorError."""
        parameters = call_parameters(name, temperature)

        def call() -> Grade | _Failed:
            response = self.client.chat.completions.create(
                messages=messages, seed=random.randint(*SEED_RANGE), **parameters
            )
            choices = getattr(response, "choices", None)
            if not isinstance(choices, list):
                return _Failed(f"the reply is not a chat completion ({type(response).__name__})")
            if not choices:
                return _Failed("the completion has no choices")
            content = getattr(getattr(choices[0], "message", None), "content", None)
            if not isinstance(content, str):
                return _Failed("the completion has no text")
            grade = parse_reply(content)
            if grade is not CONVERSATION_FAILED and not math.isfinite(grade.weighted):
                return _Failed(
                    "the reply's score or confidence is not a finite number", not_finite=True
                )
            return grade

        result = self._with_retries(call)
        if isinstance(result, _Failed):
            if not result.retry:
                return None
            if result.not_finite:
                return NOT_FINITE
            raise self._unusable(
                f"model {parameters['model']} failed {self.retries + 1} times (last: {result.why})"
            )
        return result

    def ask_all(
        self, jobs: list[tuple[list[ChatCompletionMessageParam], str]], temperature: Temperature
    ) -> list[Grade | None]:
        """Every (messages, judge name) request, `concurrency` at once, in order. The first
        request that fails for good cancels those not started yet. A judge name whose every
        request was refused is misconfigured (a parameter it does not take, say), and one that
        gave no finite score in any reply is broken: OperatorError. Otherwise a reply
        that stayed NaN or infinite counts as one without a usable score (NO_SCORE)."""
        if not jobs:
            return []
        pool = ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(jobs))))
        try:
            futures = [
                pool.submit(self.ask, messages, name, temperature) for messages, name in jobs
            ]
            progress = Progress("judging", total=len(futures), unit="judge calls")
            grades = []
            for future in futures:
                grades.append(future.result())
                progress.advance()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        for name in dict.fromkeys(name for _, name in jobs):
            mine = [grade for (_, n), grade in zip(jobs, grades, strict=True) if n == name]
            if all(grade is None for grade in mine):
                raise self._unusable(f"model {name} refused every request")
            if all(grade is None or grade is NOT_FINITE for grade in mine):
                raise self._unusable(f"model {name} gave no finite score in any reply")
        return [NO_SCORE if grade is NOT_FINITE else grade for grade in grades]

    def _with_retries(self, call: Callable[[], T | _Failed]) -> T | _Failed:
        """`call` until it gives a result, at most 1 + retries times, or the last failure."""
        failed = _Failed("no attempt")
        for attempt in range(self.retries + 1):
            if attempt:
                wait_or_stop(self._wait(attempt, failed.wait), f"judge endpoint {self.base_url}")
            result = self._attempt(call)
            if not isinstance(result, _Failed):
                return result
            failed = result
            if not failed.retry:
                break
        return failed

    def _attempt(self, call: Callable[[], T | _Failed]) -> T | _Failed:
        """One call within the overall deadline, its errors sorted: a refused key raises at
        once, and so does a stop signal (CallAbandoned, a TransientError: the assignment is
        kept); the rest are failures, retried unless the server refused the request itself."""
        try:
            with overall_deadline(self.timeout, f"judge endpoint {self.base_url}"):
                return call()
        except CallAbandoned as exc:
            if exc.stopped:
                raise
            return _Failed(f"no complete answer within {self.timeout:g} s")
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise self._unusable(f"refused the key (HTTP {exc.status_code})") from None
        except openai.APIStatusError as exc:
            status = exc.status_code
            if status in RETRIED_STATUSES or status >= 500:
                return _Failed(f"HTTP {status}", wait=_retry_after(exc.response), status=status)
            message = self._scrub(_server_message(exc))
            return _Failed(f"HTTP {status}: {message}", retry=False, status=status)
        except AnswerTooLarge as exc:  # the kit's cap: read no further, never parsed
            return _Failed(str(exc))
        except openai.APIConnectionError as exc:  # timeouts included
            return _Failed(type(exc).__name__)
        except (openai.APIResponseValidationError, ValueError, AttributeError) as exc:
            return _Failed(f"the reply is not a chat completion ({type(exc).__name__})")

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


def score_answers(
    judge: Judge,
    texts: JudgeTexts,
    eval_args: Any,
    prompts: list[Prompt],
    answers: dict[tuple[int, int], str],
    models: list[str],
) -> float:
    """The assignment's score: every judge name grades every answer `eval_require` times; a
    conversation the network cannot grade counts once as CONVERSATION_FAILED."""
    keys = sorted(answers)
    if eval_args.eval_require == 0:
        # A count the network's range() cannot take: every conversation's task raises there.
        log.warning(
            "eval_require is not an integer: every conversation counts once as 5 x 0.5, as "
            "the network's grading fails on it"
        )
        return aggregate([[CONVERSATION_FAILED] for _ in keys])
    requests = {
        key: judge_messages(texts, eval_args.prompt_id, prompts[key[0]], answers[key])
        for key in keys
    }
    jobs = [
        (messages, model)
        for key in keys
        if (messages := requests[key]) is not None
        for model in models
        for _ in range(eval_args.eval_require)
    ]
    grades = iter(judge.ask_all(jobs, eval_args.temperature))
    per_answer = len(models) * eval_args.eval_require
    conversations = [
        conversation_grades([next(grades) for _ in range(per_answer)])
        if requests[key] is not None
        else [CONVERSATION_FAILED]
        for key in keys
    ]
    no_score = sum(grade is NO_SCORE for grades in conversations for grade in grades)
    failed = sum(grades == [CONVERSATION_FAILED] for grades in conversations)
    if no_score or failed:
        log.warning(
            "%d judge replies held no score (5 x 0); %d of %d conversations could not be "
            "graded (5 x 0.5 once each)",
            no_score,
            failed,
            len(conversations),
        )
    return aggregate(conversations)
