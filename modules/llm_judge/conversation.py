"""A validation set's lines as chat prompts for generation, with the reference answers and the
transcripts the judges read (docs/llm-judge-scoring.md, "Prompts and references").

The network's reading of a line is the protocol, quirks included, wherever it gives a score:
blank turns and turns of unknown roles are dropped, the system message is always there (its
content as the line gives it, None when absent), a function call that is not JSON is a plain
assistant turn, and a line left with nothing to prompt with is skipped. Where the network raises
for the whole set (a line that is not a JSON object, a turn whose content is not text, several
calls in one turn, arguments given as JSON text), this module either fails the assignment with a
ValueError naming the line, or, for the last two, keeps its own reading: see the doc's table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO, overload

from validator.kit import JsonRefused, loads_bounded

log = logging.getLogger(__name__)

MAX_LINES = 100_000
MAX_LINE_CHARS = 8 * 1024 * 1024  # real lines are a few KiB
MAX_TEXT_CHARS = 1024 * 1024  # any one string: the system text, the tools, a turn's content
MAX_TURNS = 1024  # turns in one conversation
MAX_CALLS = 64  # calls in one function_call turn (the network takes one)
ROLES = ("user", "assistant")
# How the judges' transcript names each message role; tool messages are left out, as the
# network leaves them out.
LABELS = {"system": "System", "user": "User", "assistant": "Assistant"}


@dataclass(frozen=True)
class Prompt:
    messages: list[dict[str, Any]]  # for the chat template: the system message first
    tools: list[dict[str, Any]] | None  # for the chat template's `tools=`; None: no tools
    tools_text: str | None  # the line's tools as the function-call rubric writes them
    reference: str | None  # what the line ends with, taken out of `messages`
    transcript: str  # the conversation in `messages`, written out for the judges
    # `messages` with every call's arguments read as an object, when that differs: `messages`
    # hand them to the template as the line gives them (text, null), as the network does, and
    # a template that raises on that renders this instead (where the network has no score).
    fallback: list[dict[str, Any]] | None = None


def to_prompt(line: Any) -> Prompt | None:
    """One decoded line as a Prompt; None for a line with nothing to prompt with (the network
    skips it). A line the network cannot read raises ValueError saying what is wrong."""
    if not isinstance(line, dict):
        raise ValueError("not a JSON object")
    # Any JSON value, as the line gives it: the chat template decides how it renders (Qwen3.5's
    # takes text, null and a list of text parts, and raises on the rest), the transcript writes
    # it with str(), as the network does.
    system = line.get("system")
    if isinstance(system, str):
        _check_size(system, "system")
    messages: list[dict[str, Any]] = []
    reference: str | None = None
    tools: Any = None
    turns = line.get("conversations")
    if isinstance(turns, list) and turns:
        if len(turns) > MAX_TURNS:
            raise ValueError(f"conversations: more than {MAX_TURNS} turns")
        messages = _messages(turns)
        if messages:
            reference = _take_reference(turns, messages)
        tools = line.get("tools")
    if not messages:
        user = line.get("user", "")
        if not isinstance(user, str):
            raise ValueError("user: must be text")
        if user.strip():
            _check_size(user, "user")
            messages = [{"role": "user", "content": user.strip()}]
    if not messages:
        return None
    template_tools, tools_text = _tools(tools)
    transcript = "\n\n".join(
        [f"System: {system}"]
        + [f"{LABELS[m['role']]}: {m['content']}" for m in messages if m["role"] in LABELS]
    )
    head = {"role": "system", "content": system}
    fallback = _with_object_arguments(messages)
    return Prompt(
        [head, *messages],
        template_tools,
        tools_text,
        reference,
        transcript,
        None if fallback is None or fallback == messages else [head, *fallback],
    )


def read_prompts(path: Path, max_lines: int = MAX_LINES) -> list[Prompt]:
    """Every line of a validation set as a Prompt, each decoded once. Blank lines and lines with
    nothing to prompt with are skipped, as the network skips them, but counted in the line
    numbers; the first line the network cannot read raises ValueError naming its number. The
    file is read as the network reads it, as UTF-8 text with universal newlines: a line ends
    at "\\n", "\\r" or "\\r\\n" (not at U+2028 and the like, which JSON allows raw inside
    strings)."""
    prompts = []
    skipped = []
    with Path(path).open(encoding="utf-8", newline=None) as handle:
        number = 0
        while raw := _next_line(handle):
            number += 1
            where = f"validation set line {number}"
            if number > max_lines:
                raise ValueError(f"validation set: more than {max_lines} lines")
            if len(raw) > MAX_LINE_CHARS and not raw.endswith("\n"):
                raise ValueError(f"{where}: longer than {MAX_LINE_CHARS} characters")
            # Blank as the network reads it: a line that str.strip() empties, so Unicode
            # whitespace (U+00A0, U+2028, U+0085, ...) too, not only ASCII.
            if not raw.strip():
                continue
            data = loads_bounded(raw, where)  # its refusals name the line already
            try:
                prompt = to_prompt(data)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from exc
            if prompt is None:
                skipped.append(number)
            else:
                prompts.append(prompt)
    if skipped:
        log.warning(
            "validation set: %d lines with no user input skipped: %s", len(skipped), skipped[:10]
        )
    if not prompts:
        raise ValueError("validation set: no line with a conversation to prompt with")
    return prompts


def _next_line(handle: TextIO) -> str:
    try:
        return handle.readline(MAX_LINE_CHARS + 1)
    except UnicodeDecodeError as exc:  # the network's text-mode read raises for the whole set
        raise ValueError(f"validation set: not UTF-8 ({exc.reason} at byte {exc.start})") from None


# --- parts ------------------------------------------------------------------------------------


def _messages(turns: list[Any]) -> list[dict[str, Any]]:
    """The chat messages of a line's turns: blank turns and unknown roles dropped, a function
    call as an assistant message with tool calls (or, when its content is not JSON, as plain
    assistant text), an observation as a tool message answering the oldest open call."""
    messages: list[dict[str, Any]] = []
    open_calls: list[str] = []  # ids of the calls not answered yet, oldest first
    count = 0  # call_1, call_2, ...: one number per function_call turn, as the network counts
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise ValueError(f"conversations.{index}: not an object")
        content = turn.get("content", "")
        if not isinstance(content, str):
            raise ValueError(f"conversations.{index}.content: must be text")
        _check_size(content, f"conversations.{index}.content")
        content = content.strip()
        role = turn.get("role", "")
        if not content:
            continue
        if role == "function_call":
            count += 1
            calls = _calls(content, f"conversations.{index}.content")
            if calls is None:  # not JSON: the network keeps it as what the assistant said
                messages.append({"role": "assistant", "content": content})
                continue
            tool_calls = []
            for n, (name, arguments) in enumerate(calls):
                call_id = f"call_{count + n}"
                open_calls.append(call_id)
                function = {"name": name, "arguments": arguments}
                tool_calls.append({"id": call_id, "type": "function", "function": function})
            count += len(calls) - 1
            messages.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
        elif role == "observation":
            call_id = open_calls.pop(0) if open_calls else "call_unknown"
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif role in ROLES:
            messages.append({"role": role, "content": content})
    return messages


def _take_reference(turns: list[Any], messages: list[dict[str, Any]]) -> str | None:
    """The reference, decided by the line's last turn as written (blank or not): an assistant
    turn's content as the line gives it, or a function call rendered as the judges read it.
    Either way the last message kept is taken out of the prompt, as the network takes it out
    (which is another message when that last turn was blank)."""
    last = turns[-1]
    if "role" not in last:
        raise ValueError(f"conversations.{len(turns) - 1}: no role")
    if last["role"] == "assistant":
        if "content" not in last:
            raise ValueError(f"conversations.{len(turns) - 1}: no content")
        messages.pop()
        return last["content"]
    if last["role"] == "function_call":
        message = messages.pop()
        # The network's reference template iterates the arguments as a mapping (and raises
        # where they are not one): read as an object here.
        return render_reference(_with_object_arguments([message], strict=True)[0])
    return None


def _calls(content: str, where: str) -> list[tuple[Any, dict[str, Any]]] | None:
    """A function_call turn's calls as (name, arguments); None when its content is not JSON.
    One call object, as the network takes it; a list of calls (where the network raises) is
    read call by call."""
    try:
        data = loads_bounded(content, where)
    except JsonRefused as exc:
        if "not valid JSON" in str(exc):
            return None
        raise ValueError(str(exc)) from None
    items = data if isinstance(data, list) else [data]
    if not 1 <= len(items) <= MAX_CALLS:
        raise ValueError(f"{where}: a function call turn holds 1 to {MAX_CALLS} calls")
    calls = []
    for n, item in enumerate(items):
        at = where + (f"[{n}]" if isinstance(data, list) else "")
        if not isinstance(item, dict):
            raise ValueError(f"{at}: a call must be a JSON object")
        arguments = item.get("arguments", {})
        if isinstance(arguments, str):
            _check_size(arguments, f"{at}.arguments")
        calls.append((item.get("name", ""), arguments))
    return calls


@overload
def _with_object_arguments(
    messages: list[dict[str, Any]], strict: Literal[True]
) -> list[dict[str, Any]]: ...
@overload
def _with_object_arguments(
    messages: list[dict[str, Any]], strict: bool = False
) -> list[dict[str, Any]] | None: ...
def _with_object_arguments(
    messages: list[dict[str, Any]], strict: bool = False
) -> list[dict[str, Any]] | None:
    """`messages` with each call's arguments read as an object (`_arguments`); None when one
    cannot be (then only the line's own form can render), unless `strict`: then the
    ValueError."""
    out = []
    for message in messages:
        if "tool_calls" not in message:
            out.append(message)
            continue
        calls = []
        for call in message["tool_calls"]:
            function = call["function"]
            try:
                arguments = _arguments(function["arguments"], f"call {call['id']}")
            except (ValueError, JsonRefused):
                if strict:
                    raise
                return None
            calls.append({**call, "function": {**function, "arguments": arguments}})
        out.append({**message, "tool_calls": calls})
    return out


def _arguments(arguments: Any, where: str) -> dict[str, Any]:
    """A call's arguments as an object, for templates that iterate them as a mapping (Qwen3.5's,
    the network's reference template): null, blank or JSON text of an object (where those
    raise in the network) read as {} or that object."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            arguments = loads_bounded(arguments, f"{where}.arguments", max_bytes=MAX_TEXT_CHARS)
        except JsonRefused as exc:
            raise ValueError(str(exc)) from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{where}.arguments: must be a JSON object")
    return arguments


def render_reference(message: dict[str, Any]) -> str:
    """One message written the way the network's reference template writes it: a tag block per
    role, blank lines around it, values with Python's str() (`False`, `{'round': 'half-up'}`,
    `None`), one parameter per line."""
    role, content = message["role"], message.get("content")
    if role == "assistant" and message.get("tool_calls"):
        lines = ["<tool_call>"]
        for call in message["tool_calls"]:
            function = call["function"]
            lines.append(f"<function={function['name']}>")
            lines += [f"<parameter={k}>{v}</parameter>" for k, v in function["arguments"].items()]
            lines.append("</function>")
        return "\n\n" + "\n".join(lines) + "\n</tool_call>\n\n"
    if role == "assistant":
        return f"\n\n<assistant>\n{content}\n</assistant>\n\n"
    tag = {"system": "system", "user": "user", "tool": "tool_response"}[role]
    return f"\n<{tag}>\n{content}\n</{tag}>\n\n\n"


def _tools(raw: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The tools for the chat template, and their text for the function-call rubric (None when
    the line's tools are absent or empty: that rubric then cannot be written). JSON text is
    decoded for the template; the rubric writes them as the line gives them. Empty tools
    (`[]`, `{}`, `""`, `"[]"`, `'""'`) reach the template as `[]`, not None, as the network's
    reach it (transformers turns any iterable into a list): a template may tell them apart
    (`tools is not none`, a tokenizer's separate `tool_use` template)."""
    text = str(raw) if raw else None  # the rubric's `{tools}`: str() of the value as given
    if text is not None and len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"tools: over {MAX_TEXT_CHARS} characters")
    tools = raw
    if isinstance(raw, str):
        try:
            tools = loads_bounded(raw, "tools") if raw.strip() else (None if raw else [])
        except JsonRefused as exc:
            raise ValueError(f"{exc} (the chat template takes a list of tool objects)") from None
    if isinstance(tools, (list, dict, str)) and not tools:  # '""' decodes to "": empty too
        return [], text
    if not tools:
        return None, text
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise ValueError("tools: must be a JSON list of tool objects")
    return tools, text


def _check_size(text: str | None, where: str) -> None:
    if text is not None and len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"{where}: over {MAX_TEXT_CHARS} characters")
