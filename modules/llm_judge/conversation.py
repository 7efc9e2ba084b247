"""A validation set's lines as chat prompts for generation, reference answers and transcripts
for the judges (docs/llm-judge-scoring.md, "Prompts and references").

A line is `{"system"?, "tools"?, "conversations": [{"role", "content"}]}` with roles `user`,
`assistant`, `function_call` and `observation`, as in the lora sets. The set comes from the Fed
Ledger: a malformed line fails the assignment with a ValueError naming it, as upstream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from validator.safe_json import loads_bounded

MAX_LINES = 100_000
TRANSCRIPT_LABELS = {
    "system": "System",
    "user": "User",
    "assistant": "Assistant",
    "function_call": "Function Call",
    "observation": "Observation",
}


class Turn(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["user", "assistant", "function_call", "observation"]
    content: str


class Line(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    system: str | None = None
    tools: str | list[dict[str, Any]] | None = None
    conversations: list[Turn]


@dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, Any]]  # for the chat template
    tools: list[dict[str, Any]] | None  # for the chat template's `tools=`
    tools_text: str  # for the function-call rubric
    reference: str | None  # the answer the line ends with, removed from the prompt
    reference_kind: Literal["answer", "function_call"] | None
    transcript: str  # the prompt written out for the judges


def to_prompt(line: Line) -> Prompt:
    turns = list(line.conversations)
    reference, kind = None, None
    if turns and turns[-1].role == "assistant":
        reference, kind = turns.pop().content, "answer"
    elif turns and turns[-1].role == "function_call":
        reference, kind = render_calls(_calls(turns.pop().content)), "function_call"
    if not turns:
        raise ValueError("no prompt is left once the reference answer is taken out")
    tools, tools_text = _tools(line.tools)
    messages: list[dict[str, Any]] = []
    transcript: list[str] = []
    if line.system is not None:
        messages.append({"role": "system", "content": line.system})
        transcript.append(f"System: {line.system}")
    open_calls: list[str] = []  # ids of calls not answered yet, oldest first
    call_number = 0
    for turn in turns:
        transcript.append(f"{TRANSCRIPT_LABELS[turn.role]}: {turn.content}")
        if turn.role in ("user", "assistant"):
            messages.append({"role": turn.role, "content": turn.content})
        elif turn.role == "function_call":
            tool_calls = []
            for call in _calls(turn.content):
                call_id = f"call_{call_number}"
                call_number += 1
                open_calls.append(call_id)
                function = {"name": call["name"], "arguments": call["arguments"]}
                tool_calls.append({"id": call_id, "type": "function", "function": function})
            messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        else:
            message = {"role": "tool", "content": turn.content}
            if open_calls:
                message["tool_call_id"] = open_calls.pop(0)
            messages.append(message)
    return Prompt(messages, tools, tools_text, reference, kind, "\n".join(transcript))


def _calls(content: str) -> list[dict[str, Any]]:
    """A function_call turn's calls: one object or a list, each with a name and arguments
    (an object, or a JSON string of one)."""
    data = json.loads(content)
    calls = data if isinstance(data, list) else [data]
    parsed = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ValueError("a function call must be an object with a name")
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                pass  # kept as the text it is
        parsed.append({"name": call["name"], "arguments": arguments})
    return parsed


def render_calls(calls: list[dict[str, Any]]) -> str:
    """`<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>`
    per call, one per line; a string VALUE as it is, anything else as JSON."""
    rendered = []
    for call in calls:
        arguments = call["arguments"]
        if isinstance(arguments, dict):
            parameters = "".join(
                f"<parameter={key}>{_value(value)}</parameter>" for key, value in arguments.items()
            )
        else:
            parameters = _value(arguments)
        rendered.append(f"<tool_call><function={call['name']}>{parameters}</function></tool_call>")
    return "\n".join(rendered)


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _tools(raw: str | list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]] | None, str]:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None, ""
    tools = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise ValueError("tools must be a JSON list of tool objects")
    if not tools:
        return None, ""
    return tools, json.dumps(tools, ensure_ascii=False, indent=2)


def read_prompts(path: Path, max_lines: int = MAX_LINES) -> list[Prompt]:
    """Every line of the set as a Prompt, each parsed once; the first bad line raises a
    ValueError naming its number."""
    with Path(path).open(encoding="utf-8") as handle:
        raw_lines = handle.readlines()
    if not raw_lines:
        raise ValueError("validation set is empty")
    if len(raw_lines) > max_lines:
        raise ValueError(f"validation set has {len(raw_lines)} lines, over {max_lines}")
    prompts = []
    for number, text in enumerate(raw_lines, start=1):
        try:
            data = loads_bounded(text, f"line {number}")
            if not isinstance(data, dict):
                raise ValueError("must be a JSON object")
            prompts.append(to_prompt(Line.model_validate(data)))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "line"
            raise ValueError(f"validation set line {number}: {where}: {first['msg']}") from None
        except ValueError as exc:  # also json's and loads_bounded's refusals
            message = str(exc)
            prefix = "" if message.startswith(f"line {number}") else f"line {number}: "
            raise ValueError(f"validation set {prefix}{message}") from None
    return prompts
