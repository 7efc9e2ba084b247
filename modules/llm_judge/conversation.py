"""A validation set's lines as chat prompts for generation, with the reference answers and the
transcripts the judges read (docs/llm-judge-scoring.md, "Prompts and references").

A line is `{"system"?, "tools"?, "conversations": [{"role", "content"}]}` with roles `user`,
`assistant`, `function_call` and `observation`, as in the lora sets. Each line is decoded and
validated once, at the boundary, into the models below; what comes out is a `Prompt` of plain
data. The set comes from the Fed Ledger: a malformed line fails the assignment with a
ValueError that names its number, as upstream fails it.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from validator.safe_json import loads_bounded

MAX_LINES = 100_000
MAX_LINE_BYTES = 8 * 1024 * 1024  # real lines are a few KiB
MAX_TEXT_CHARS = 1024 * 1024  # any one string: the system text, the tools, a turn's content
MAX_TURNS = 1024  # turns in one conversation
MAX_CALLS = 64  # calls in one function_call turn
MAX_NAME_CHARS = 256  # a called function's name

Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
Role = Literal["user", "assistant", "function_call", "observation"]
LABELS = {
    "system": "System",
    "user": "User",
    "assistant": "Assistant",
    "function_call": "Function Call",
    "observation": "Observation",
}


class Turn(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    role: Role
    content: Text


class Line(BaseModel):
    """One JSONL line. Keys it does not know are ignored, as upstream ignores them."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    system: Text | None = None
    tools: Any = None  # a JSON list as text (a list is taken too); checked by _tools
    conversations: list[Turn] = Field(min_length=1, max_length=MAX_TURNS)


class Call(BaseModel):
    """One call of a function_call turn. `arguments` is an object, a JSON string of one, or
    absent, null or blank (no arguments)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    arguments: Any = None  # checked by _arguments


@dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, Any]]  # for the chat template, without the reference
    tools: list[dict[str, Any]] | None  # for the chat template's `tools=`; None: no tools
    tools_text: str  # the tools as the line gives them, for the function-call rubric; "": none
    reference: str | None  # the answer the line ends with, taken out of `messages`
    reference_kind: Literal["answer", "function_call"] | None
    transcript: str  # the conversation in `messages`, written out for the judges


def to_prompt(line: dict[str, Any]) -> Prompt:
    """One decoded line as a Prompt; a malformed line raises ValueError saying what is wrong
    (the caller adds where)."""
    parsed = _validate(Line, line, "")
    turns = [(i, turn.role, turn.content.strip()) for i, turn in enumerate(parsed.conversations)]
    reference: str | None = None
    kind: Literal["answer", "function_call"] | None = None
    index, role, content = turns[-1]
    if role == "assistant":
        reference, kind = content, "answer"
        turns.pop()
    elif role == "function_call":
        reference, kind = _render_calls(_calls(content, index)), "function_call"
        turns.pop()
    if not turns:
        raise ValueError("conversations: nothing is left to prompt with once the reference is out")

    messages: list[dict[str, Any]] = []
    blocks: list[str] = []
    system = (parsed.system or "").strip()
    if system:
        messages.append({"role": "system", "content": system})
        blocks.append(f"{LABELS['system']}: {system}")
    open_calls: deque[str] = deque()  # ids of the calls not answered yet, oldest first
    count = 0  # ids are call_1, call_2, ... over the conversation's calls, from 1 as upstream's
    for index, role, content in turns:
        blocks.append(f"{LABELS[role]}: {content}")
        if role in ("user", "assistant"):
            messages.append({"role": role, "content": content})
        elif role == "function_call":
            tool_calls = []
            for name, arguments in _calls(content, index):
                count += 1
                call_id = f"call_{count}"
                open_calls.append(call_id)
                function = {"name": name, "arguments": arguments}
                tool_calls.append({"id": call_id, "type": "function", "function": function})
            messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        else:  # an observation answers the oldest open call; one with none open answers none
            message = {"role": "tool", "content": content}
            if open_calls:
                message["tool_call_id"] = open_calls.popleft()
            messages.append(message)
    tools, tools_text = _tools(parsed.tools)
    # One "Label: content" block per turn, blank lines between them, as upstream writes it.
    return Prompt(messages, tools, tools_text, reference, kind, "\n\n".join(blocks))


def read_prompts(path: Path, max_lines: int = MAX_LINES) -> list[Prompt]:
    """Every line of a validation set as a Prompt, each decoded and validated once. Blank lines
    are skipped, as upstream skips them, but counted in the line numbers; the first malformed
    line raises ValueError naming its number. Lines end at "\\n" only: JSON allows U+2028 and
    the like raw inside strings."""
    prompts = []
    with Path(path).open("rb") as handle:
        number = 0
        while raw := handle.readline(MAX_LINE_BYTES + 1):
            number += 1
            where = f"validation set line {number}"
            if number > max_lines:
                raise ValueError(f"validation set: more than {max_lines} lines")
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise ValueError(f"{where}: longer than {MAX_LINE_BYTES} bytes")
            if not raw.strip():
                continue
            data = loads_bounded(raw, where)  # its refusals name the line already
            if not isinstance(data, dict):
                raise ValueError(f"{where}: not a JSON object")
            try:
                prompts.append(to_prompt(data))
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from exc
    if not prompts:
        raise ValueError("validation set: no lines")
    return prompts


# --- parts ------------------------------------------------------------------------------------


def _validate(model: type[BaseModel], data: Any, where: str) -> Any:
    """`model` from `data`, or a ValueError naming the first faulty field under `where`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in (*([where] if where else []), *first["loc"]))
        raise ValueError(f"{path or 'line'}: {first['msg']}") from exc


def _calls(content: str, index: int) -> list[tuple[str, dict[str, Any]]]:
    """A function_call turn's calls as (name, arguments): its content is JSON, one call or a
    non-empty list of them."""
    where = f"conversations.{index}"
    data = loads_bounded(content, f"{where}.content")
    items = data if isinstance(data, list) else [data]
    if not 1 <= len(items) <= MAX_CALLS:
        raise ValueError(f"{where}: a function call turn holds 1 to {MAX_CALLS} calls")
    calls = []
    for n, item in enumerate(items):
        at = f"{where}.content" + (f"[{n}]" if isinstance(data, list) else "")
        call = _validate(Call, item, at)
        calls.append((call.name, _arguments(call.arguments, f"{at}.arguments")))
    return calls


def _arguments(arguments: Any, where: str) -> dict[str, Any]:
    """A call's arguments as an object, never as JSON text: Qwen3.5's chat template iterates
    them as a mapping (`arguments|items`), which a string would make fail."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        arguments = loads_bounded(arguments, where, max_bytes=MAX_TEXT_CHARS)
    if not isinstance(arguments, dict):
        raise ValueError(f"{where}: must be a JSON object")
    return arguments


def _render_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """`<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>`,
    one per call, joined by "\\n"; a string VALUE as it is, any other as JSON."""
    rendered = []
    for name, arguments in calls:
        parameters = "".join(
            f"<parameter={key}>{_value(value)}</parameter>" for key, value in arguments.items()
        )
        rendered.append(f"<tool_call><function={name}>{parameters}</function></tool_call>")
    return "\n".join(rendered)


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _tools(raw: Any) -> tuple[list[dict[str, Any]] | None, str]:
    """The tools for the chat template and their text for the judges; absent, blank or an
    empty list: (None, "")."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None, ""
    if isinstance(raw, str):
        text = raw.strip()
        tools = loads_bounded(text, "tools", max_bytes=MAX_TEXT_CHARS)
    else:
        tools, text = raw, json.dumps(raw, ensure_ascii=False)
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise ValueError("tools: must be a JSON list of tool objects")
    return (tools, text) if tools else (None, "")
