"""The network's grading rules, as plain functions (docs/llm-judge-scoring.md, "Judging"): which
judge names a task's list resolves to and what each call sends, which rubric a conversation is
graded with, how a reply is read, and how the grades become the score. Its behaviour is the
protocol, quirks included; each rule's quirk is said where it is kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modules.llm_judge.conversation import Prompt

if TYPE_CHECKING:  # the texts come from judge_texts at start-up
    from openai.types.chat import ChatCompletionMessageParam

    from modules.llm_judge.judge_texts import JudgeTexts

EFFORTS = ("low", "high")
THINKING = "thinking"
# Judges that take a fixed temperature: thinking off at 0.6, their `-thinking` names at 1.
KIMI = ("kimi-k2.5", "kimi-k2.6")
KIMI_TEMPERATURE = 0.6
KIMI_THINKING_TEMPERATURE = 1  # an int, as the network sends it
RUBRICS = frozenset({1, 2, 3})  # looked up by hash, as the network's registry
# A task's temperature as it gives it (schemas.EvalArgs): sent with its JSON type.
Temperature = float | str | None


@dataclass(frozen=True)
class Grade:
    score: float
    confidence: float

    @property
    def weighted(self) -> float:
        return self.score * self.confidence


# A reply whose JSON has no readable score: the middle grade with no weight.
NO_SCORE = Grade(5.0, 0.0)
# What a conversation the network cannot grade counts, once, in place of all its replies (a
# rubric it cannot write, a reply whose score is not a number, a refused request).
CONVERSATION_FAILED = Grade(5.0, 0.5)


# --- which judges, and what each call sends ---------------------------------------------------


def split_name(name: str) -> tuple[str, dict[str, Any]]:
    """A judge name's model and options: every dash-separated part equal to `low` or `high`
    (case-sensitive, wherever it stands) is a reasoning effort, a `thinking` part turns thinking
    on; the other parts, rejoined, are the model. The thinking switch goes in the request body
    under a key `extra_body` (the network nests it once more than the client needs)."""
    options: dict[str, Any] = {}
    parts = []
    for part in name.split("-"):
        if part in EFFORTS:
            options["reasoning_effort"] = part
        elif part == THINKING:
            options["thinking"] = {"type": "enabled"}
        else:
            parts.append(part)
    model = "-".join(parts) if parts else name
    if model in KIMI:
        options.setdefault("thinking", {"type": "disabled"})
    return model, options


def resolve_models(requested: list[str], available: list[str]) -> list[str]:
    """The task's judge names, kept as written, that the endpoint serves as they are or once
    their effort and thinking parts are taken off, each once; none (or an empty list): every
    model the endpoint lists."""
    chosen = [name for name in requested if name in available or split_name(name)[0] in available]
    return list(dict.fromkeys(chosen)) or list(available)


def call_parameters(name: str, temperature: Temperature) -> dict[str, Any]:
    """The chat completion's parameters for a judge name, besides the messages and the seed."""
    model, options = split_name(name)
    if name in KIMI:
        temperature = KIMI_TEMPERATURE
    elif name in {f"{kimi}-{THINKING}" for kimi in KIMI}:
        temperature = KIMI_THINKING_TEMPERATURE
    parameters: dict[str, Any] = {"model": model, "temperature": temperature}
    if "reasoning_effort" in options:
        parameters["reasoning_effort"] = options["reasoning_effort"]
    if "thinking" in options:
        # The openai client merges `extra_body` into the body: the body gets a key
        # "extra_body" holding {"thinking": ...}, as the network's requests carry it.
        parameters["extra_body"] = {"extra_body": {"thinking": options["thinking"]}}
    return parameters


# --- what the judges read ---------------------------------------------------------------------


def rubric_id(prompt_id: Any, reference: str | None, tools_text: str | None) -> int | None:
    """The rubric a conversation is graded with, or None when the network cannot write one (the
    conversation then counts as CONVERSATION_FAILED). `prompt_id` is the task's value as given
    (absent: 0); it compares as Python compares (1.0 and True are 1, "2" is not 2). Rubric 2
    needs a reference, rubric 3 a reference and tools; other ids use rubric 1."""
    if prompt_id == 1:
        return 1
    if reference and prompt_id == 2:
        return 2
    if reference and tools_text and prompt_id == 3:
        return 3
    try:
        known = prompt_id in RUBRICS
    except TypeError:  # a list or an object: not a key the network can look up
        return None
    return None if known else 1


def judge_messages(
    texts: JudgeTexts, prompt_id: Any, prompt: Prompt, answer: str
) -> list[ChatCompletionMessageParam] | None:
    """The messages of a judge request for one answer: the rubric as a user message, then the
    judge system message (in that order, as the network sends them); None when the rubric
    cannot be written. The answer is stripped, as the network strips what it generates."""
    chosen = rubric_id(prompt_id, prompt.reference, prompt.tools_text)
    if chosen is None:
        return None
    fields: dict[str, Any] = {
        "conversation_context": prompt.transcript,
        "assistant_response": answer.strip(),
    }
    if chosen >= 2:
        fields["reference_response"] = prompt.reference
    if chosen == 3:
        fields["tools"] = prompt.tools_text
    return [
        {"role": "user", "content": texts.rubric_text(chosen, **fields)},
        {"role": "system", "content": texts.system},
    ]


# --- reading a reply --------------------------------------------------------------------------


def first_score_object(text: str) -> str | None:
    """The first `{...}` with no `}` inside that contains `"score"`: the leftmost `{` whose
    stretch up to the next `}` holds `"score"`. Linear in the text, where a backtracking regex
    for the same rule is quadratic on a reply full of `{`."""
    end = -1
    while True:
        start = text.find("{", end + 1)
        if start < 0:
            return None
        end = text.find("}", start)
        if end < 0:
            return None
        # Every `{` between `start` and `end` ends at the same `}`: the first one that has
        # "score" after it is `start` itself whenever any has.
        if '"score"' in text[start + 1 : end]:
            return text[start : end + 1]


def parse_reply(text: str) -> Grade:
    """A judge reply's grade, read as the network reads it: the first flat object holding
    "score" (think blocks and code fences are not skipped), decoded as JSON; its `score` and
    `confidence` taken with float() where present, not clamped. No such object, or JSON that
    does not decode: NO_SCORE; a score that float() refuses as text keeps the defaults from
    there on. A value float() cannot take at all (null, a list, an object, an integer past
    floats), or an object nested past the decoder's depth, fails the whole conversation."""
    found = first_score_object(text)
    if found is None:
        return NO_SCORE
    try:
        data = json.loads(found)
    except ValueError:
        return NO_SCORE
    except RecursionError:  # nested past the decoder's depth: the network's call raises there
        return CONVERSATION_FAILED
    score, confidence = NO_SCORE.score, NO_SCORE.confidence
    try:
        if "score" in data:
            score = float(data["score"])
        if "confidence" in data:
            confidence = float(data["confidence"])
    except ValueError:
        pass  # what was read so far stands
    except (TypeError, OverflowError):
        return CONVERSATION_FAILED
    return Grade(score, confidence)


# --- the score --------------------------------------------------------------------------------


def conversation_grades(grades: list[Grade | None]) -> list[Grade]:
    """One conversation's grades as they count: all of them, or CONVERSATION_FAILED once when
    any of its requests was refused (None) or its reply failed the conversation."""
    if any(grade is None or grade is CONVERSATION_FAILED for grade in grades):
        return [CONVERSATION_FAILED]
    return [grade for grade in grades if grade is not None]


def aggregate(conversations: list[list[Grade]]) -> float:
    """The module's score: the mean of score x confidence over every grade that counts, divided
    by 10; with no grade at all, the network's 5.0, so 0.5."""
    weighted = [grade.weighted for grades in conversations for grade in grades]
    return (sum(weighted) / len(weighted) if weighted else 5.0) / 10
