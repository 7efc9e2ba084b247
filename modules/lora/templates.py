"""The chat template table of the LoRA scoring protocol (SPEC §5.4), as typed objects.

Every string comes from `chat_templates.json`; formatting uses `str.format` exactly as the
network's reference does, so conversions (a non-string `type` rendered with `str()`, the doubled
braces of `tool_prompt` collapsing to single ones) come out identical.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from validator.safe_json import loads_bounded

DEFAULT_TABLE_PATH = Path(__file__).with_name("chat_templates.json")

_TEMPLATE_FIELDS = (
    "system_format",
    "user_format",
    "assistant_format",
    "tool_format",
    "function_format",
    "observation_format",
    "system",
    "stop_word",
)
_TOOL_FIELDS = (
    "tool_prompt",
    "function_slots",
    "tool_entry",
    "tool_param",
    "tool_param_required",
    "tool_param_enum",
    "tool_param_items",
)


@dataclass(frozen=True)
class ToolStrings:
    """The template-independent strings that render tool definitions and function calls."""

    tool_prompt: str
    function_slots: str
    tool_entry: str
    tool_param: str
    tool_param_required: str
    tool_param_enum: str
    tool_param_items: str


@dataclass(frozen=True)
class Template:
    """One chat template; each `render_*` fills exactly the placeholders the reference fills."""

    name: str
    system_format: str | None
    user_format: str
    assistant_format: str
    tool_format: str
    function_format: str
    observation_format: str
    system: str | None
    stop_word: str | None
    tool_strings: ToolStrings

    def render_system(self, text: str) -> str:
        if self.system_format is None:
            raise ValueError(f"template {self.name!r} has no system format")
        return self.system_format.format(content=text)

    def render_user(self, content: str, eos_token: str | None) -> str:
        return self.user_format.format(content=content, stop_token=eos_token)

    def render_assistant(self, content: str, eos_token: str | None) -> str:
        return self.assistant_format.format(content=content, stop_token=eos_token)

    def render_tools(self, tools_json: str) -> str:
        """The tool prompt for a line's `tools` (a JSON list), inside the tool format."""
        return self.tool_format.format(content=build_tool_prompt(tools_json, self.tool_strings))

    def render_function_call(self, content: str) -> str:
        """A `function_call` turn's JSON content, inside the function format."""
        calls = format_function_calls(content, self.tool_strings)
        return self.function_format.format(content=calls)

    def render_observation(self, content: str) -> str:
        return self.observation_format.format(content=content)


@dataclass(frozen=True)
class TemplateTable:
    templates: Mapping[str, Template]

    def get(self, key: str) -> Template:
        """The template for `key`; an unknown key fails the assignment, as in the reference."""
        template = self.templates.get(key)
        if template is None:
            raise UnknownTemplate(
                f"base_model {key[:80]!r} is not a chat-template key this validator knows "
                f"(known: {', '.join(sorted(self.templates))})"
            )
        return template


class UnknownTemplate(ValueError):
    """The assignment names a template the table does not hold; the assignment is failed."""


def _optional_str(entry: Mapping[str, Any], field: str, where: str) -> str | None:
    value = entry.get(field)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where}: {field} must be a string or null")
    return value


def _required_str(entry: Mapping[str, Any], field: str, where: str) -> str:
    value = _optional_str(entry, field, where)
    if value is None:
        raise ValueError(f"{where}: {field} is missing")
    return value


def _parse_template(name: str, entry: Any, tool_strings: ToolStrings) -> Template:
    where = f"template {name!r}"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: must be an object")
    # system_format, system and stop_word are legitimately null in the table; the rest are not.
    nullable = {"system_format", "system", "stop_word"}
    values = {
        field: (_optional_str if field in nullable else _required_str)(entry, field, where)
        for field in _TEMPLATE_FIELDS
    }
    return Template(name=name, tool_strings=tool_strings, **values)


def parse_table(raw: Mapping[str, Any]) -> TemplateTable:
    """Typed view of the decoded JSON table; a missing or mistyped entry raises `ValueError`."""
    tool_strings = ToolStrings(**{f: _required_str(raw, f, "table") for f in _TOOL_FIELDS})
    entries = raw.get("templates")
    if not isinstance(entries, Mapping):
        raise ValueError("table: templates must be an object")
    templates = {name: _parse_template(name, e, tool_strings) for name, e in entries.items()}
    return TemplateTable(templates=templates)


@lru_cache(maxsize=8)
def _load_cached(path: Path) -> TemplateTable:
    with path.open(encoding="utf-8") as handle:
        return parse_table(json.load(handle))


def load_templates(path: Path | str | None = None) -> TemplateTable:
    """The template table at `path` (default: `chat_templates.json` beside this module)."""
    return _load_cached(Path(path) if path is not None else DEFAULT_TABLE_PATH)


def get_template(key: str, path: Path | str | None = None) -> Template:
    return load_templates(path).get(key)


# --- tools and function calls ---------------------------------------------------------------


def _param_line(name: str, param: Any, required: bool, strings: ToolStrings) -> str:
    if not isinstance(param, Mapping):
        raise ValueError(f"tool parameter {name!r} must be an object")
    enum_text = items_text = ""
    if param.get("enum"):
        # Joined as-is, like the reference: a string enum joins its characters, and values
        # that are not strings fail the set.
        try:
            joined = ", ".join(param["enum"])
        except TypeError as exc:
            raise ValueError(f"tool parameter {name!r}: enum values must be strings") from exc
        enum_text = strings.tool_param_enum.format(joined)
    if param.get("items"):
        items = param["items"]
        if not isinstance(items, Mapping):
            raise ValueError(f"tool parameter {name!r}: items must be an object")
        items_text = strings.tool_param_items.format(items.get("type", ""))
    return strings.tool_param.format(
        name=name,
        type=param.get("type", ""),
        required=strings.tool_param_required if required else "",
        desc=param.get("description", ""),
        enum=enum_text,
        items=items_text,
    )


def _tool_entry(tool: Any, strings: ToolStrings) -> tuple[str, str]:
    """One tool's entry text and its name."""
    # The reference joins the names, so a name that is not a string fails the set there too.
    if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
        raise ValueError("each tool must be an object with a string name")
    parameters = tool.get("parameters")
    if not isinstance(parameters, Mapping) or not isinstance(parameters.get("properties"), Mapping):
        raise ValueError(f"tool {tool['name']!r}: parameters.properties must be an object")
    required = parameters.get("required", [])
    if not isinstance(required, list | str | Mapping):
        raise ValueError(f"tool {tool['name']!r}: parameters.required must be a list")
    args = "".join(
        _param_line(name, param, name in required, strings)
        for name, param in parameters["properties"].items()
    )
    entry = strings.tool_entry.format(
        name=tool["name"], desc=tool.get("description", ""), args=args
    )
    return entry, tool["name"]


def build_tool_prompt(tools_json: str, strings: ToolStrings) -> str:
    """`tool_prompt` filled from a line's `tools` (a JSON string of a list of tools)."""
    tools = loads_bounded(tools_json, "tools")
    if not isinstance(tools, list):
        raise ValueError("tools must be a JSON list")
    entries = [_tool_entry(tool, strings) for tool in tools]
    return strings.tool_prompt.format(
        tool_text="".join(text for text, _ in entries),
        tool_names=", ".join(name for _, name in entries),
    )


def format_function_calls(content: str, strings: ToolStrings) -> str:
    """`function_slots` per call of a `function_call` turn (one call or a list), "\\n"-joined."""
    calls = loads_bounded(content, "function_call content")
    # An empty call (null, {}, []) renders as nothing, as in the reference.
    if not calls:
        return ""
    if not isinstance(calls, list):
        calls = [calls]
    slots = []
    for call in calls:
        if not isinstance(call, Mapping) or "name" not in call or "arguments" not in call:
            raise ValueError(f"invalid function call (needs name and arguments): {call!r}")
        arguments = json.dumps(call["arguments"], ensure_ascii=False)
        slots.append(strings.function_slots.format(name=call["name"], arguments=arguments))
    return "\n".join(slots) + "\n"
