"""The chat template table of the LoRA scoring protocol (docs/lora-scoring.md, "Chat
templates"), as typed objects.

Every string comes from `chat_templates.json`; formatting uses `str.format` exactly as the
network's reference does, so conversions (a non-string `type` rendered with `str()`, the doubled
braces of `tool_prompt` collapsing to single ones) come out identical.

The file's schema is a pydantic model (`TemplateFile`): a missing, mistyped or unknown key fails
the load with pydantic's message naming it, instead of a KeyError or a wrong string at scoring.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from validator.kit import loads_bounded

DEFAULT_TABLE_PATH = Path(__file__).with_name("chat_templates.json")

# Strict: the table is protocol, so a number where a string belongs is an error, not coerced.
_TABLE_MODEL = ConfigDict(extra="forbid", strict=True, frozen=True)


class ToolStrings(BaseModel):
    """The template-independent strings that render tool definitions and function calls."""

    model_config = _TABLE_MODEL

    tool_prompt: str
    function_slots: str
    tool_entry: str
    tool_param: str
    tool_param_required: str
    tool_param_enum: str
    tool_param_items: str


class TemplateFormats(BaseModel):
    """One entry of the file's `templates` object. Every key must be present; system_format,
    system and stop_word are legitimately null in some entries, the rest never are."""

    model_config = _TABLE_MODEL

    system_format: str | None
    user_format: str
    assistant_format: str
    tool_format: str
    function_format: str
    observation_format: str
    system: str | None
    stop_word: str | None


class TemplateFile(ToolStrings):
    """The whole file: the tool strings, shared by every template, beside `templates`."""

    templates: dict[str, TemplateFormats]


class Template(TemplateFormats):
    """One chat template; each `render_*` fills exactly the placeholders the reference fills."""

    name: str
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


def _build_table(raw: TemplateFile) -> TemplateTable:
    """Typed templates from the validated file, each with the shared tool strings."""
    tool_strings = ToolStrings(**raw.model_dump(exclude={"templates"}))
    templates = {
        name: Template(name=name, tool_strings=tool_strings, **formats.model_dump())
        for name, formats in raw.templates.items()
    }
    return TemplateTable(templates=templates)


@lru_cache(maxsize=8)
def _load_cached(path: Path) -> TemplateTable:
    try:
        raw = TemplateFile.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        # pydantic's message names each bad key (e.g. templates.yi.user_format); the path
        # says which table, since a test or an operator may point at another one.
        raise ValueError(f"chat template table {path}: {exc}") from exc
    return _build_table(raw)


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
