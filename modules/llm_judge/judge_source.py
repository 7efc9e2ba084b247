"""Reading the network's llm_judge files as data (judge_texts.py fetches them): `ast` only,
never an import, an exec or an eval, so that a source gone wrong can at worst be refused.

The shape (FLock-io/FLock-validator, validator/modules/llm_judge/): prompt.py has module-level
functions decorated `@register(prompt_id=N)`, N = 1, 2, 3, each assigning one string literal to
`evaluation_criteria` and returning `evaluation_criteria.format(...)` with that rubric's keyword
fields; __init__.py assigns the judge system text, a string literal, to `system_prompt` inside
`_construct_evaluation_prompt`. Anything else is an OperatorError naming what is missing.
"""

from __future__ import annotations

import ast
import logging
import string
from collections.abc import Mapping

from validator.kit import OperatorError, one_line, quoted

log = logging.getLogger(__name__)

PROMPT_FILE, MODULE_FILE = "prompt.py", "__init__.py"
# The str.format fields each rubric is given, as the network's functions pass them.
RUBRIC_FIELDS: dict[int, frozenset[str]] = {
    1: frozenset({"conversation_context", "assistant_response"}),
    2: frozenset({"conversation_context", "assistant_response", "reference_response"}),
    3: frozenset({"conversation_context", "assistant_response", "reference_response", "tools"}),
}
CRITERIA_NAME, SYSTEM_FUNCTION, SYSTEM_NAME = (
    "evaluation_criteria",
    "_construct_evaluation_prompt",
    "system_prompt",
)
# Bounds, far above the network's files (prompt.py 11 KB, __init__.py 43 KB at NETWORK_COMMIT),
# so that a hostile or broken source cannot make start-up parse or send megabytes.
MAX_FILE_BYTES = {PROMPT_FILE: 256 * 1024, MODULE_FILE: 1024 * 1024}
MAX_RUBRIC_CHARS = 64 * 1024
MAX_SYSTEM_CHARS = 4096


def parse_source_files(prompt_py: bytes, init_py: bytes, origin: str) -> tuple[dict[int, str], str]:
    """(rubric id -> text, the judge system text) from the two files, read with `ast` only and
    checked (check_texts). OperatorError naming what is missing or wrong when they do not have
    the network's shape."""
    rubrics = _rubrics_in(_syntax_tree(prompt_py, PROMPT_FILE, origin), origin)
    system = _system_in(_syntax_tree(init_py, MODULE_FILE, origin), origin)
    check_texts(rubrics, system, origin)
    return rubrics, system


def shape_error(origin: str, name: str, problem: str) -> OperatorError:
    return OperatorError(one_line(f"judge texts from {origin}: {name}: {problem}"))


def _syntax_tree(data: bytes, name: str, origin: str) -> ast.Module:
    if len(data) > MAX_FILE_BYTES[name]:
        raise shape_error(origin, name, f"over {MAX_FILE_BYTES[name]} bytes")
    try:
        return ast.parse(data.decode("utf-8"), filename=name)
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError) as exc:
        raise shape_error(origin, name, f"not a Python file ({type(exc).__name__})") from None


def _rubrics_in(tree: ast.Module, origin: str) -> dict[int, str]:
    found: dict[int, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        prompt_id = _registered_id(node)
        if prompt_id is None:
            continue
        where = f"@register(prompt_id={prompt_id}) {node.name}"
        if prompt_id in found:
            raise shape_error(origin, PROMPT_FILE, f"{where}: a second function for that id")
        if prompt_id in RUBRIC_FIELDS:
            found[prompt_id] = _criteria_in(node, prompt_id, f"{PROMPT_FILE} {where}", origin)
        else:
            log.warning(
                "judge texts from %s: rubric %d is not one this module knows", origin, prompt_id
            )
    missing = [f"@register(prompt_id={i})" for i in RUBRIC_FIELDS if i not in found]
    if missing:
        raise shape_error(origin, PROMPT_FILE, f"no function decorated {', '.join(missing)}")
    return found


def _registered_id(node: ast.FunctionDef) -> int | None:
    for decorator in node.decorator_list:
        if not (
            isinstance(decorator, ast.Call)
            and isinstance(decorator.func, ast.Name)
            and decorator.func.id == "register"
        ):
            continue
        values = [k.value for k in decorator.keywords if k.arg == "prompt_id"] + decorator.args
        if len(values) == 1 and isinstance(values[0], ast.Constant):
            value = values[0].value
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _criteria_in(node: ast.FunctionDef, prompt_id: int, where: str, origin: str) -> str:
    assigned = [
        n.value
        for n in ast.walk(node)
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == CRITERIA_NAME for t in n.targets)
    ]
    if len(assigned) != 1:
        raise shape_error(origin, where, f"{len(assigned)} assignments to {CRITERIA_NAME}, not 1")
    value = assigned[0]
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        raise shape_error(origin, where, f"{CRITERIA_NAME} is not a string literal")
    returned = [n.value for n in ast.walk(node) if isinstance(n, ast.Return)]
    expected = RUBRIC_FIELDS[prompt_id]
    if len(returned) != 1 or _format_keywords(returned[0]) != expected:
        keywords = ", ".join(f"{name}=" for name in sorted(expected))
        raise shape_error(origin, where, f"does not return {CRITERIA_NAME}.format({keywords})")
    return value.value


def _format_keywords(value: ast.expr | None) -> frozenset[str] | None:
    """The keyword names of `evaluation_criteria.format(k=...)`; None for anything else."""
    if not (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "format"
        and isinstance(value.func.value, ast.Name)
        and value.func.value.id == CRITERIA_NAME
        and not value.args
        and all(k.arg is not None for k in value.keywords)
    ):
        return None
    return frozenset(str(k.arg) for k in value.keywords)


def _system_in(tree: ast.Module, origin: str) -> str:
    functions = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == SYSTEM_FUNCTION
    ]
    if len(functions) != 1:
        raise shape_error(
            origin, MODULE_FILE, f"{len(functions)} functions {SYSTEM_FUNCTION}, not 1"
        )
    assigned = [
        n.value
        for n in ast.walk(functions[0])
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == SYSTEM_NAME for t in n.targets)
    ]
    where = f"{MODULE_FILE} {SYSTEM_FUNCTION}"
    if len(assigned) != 1:
        raise shape_error(origin, where, f"{len(assigned)} assignments to {SYSTEM_NAME}, not 1")
    if not (isinstance(assigned[0], ast.Constant) and isinstance(assigned[0].value, str)):
        raise shape_error(origin, where, f"{SYSTEM_NAME} is not a string literal")
    return assigned[0].value


def check_texts(rubrics: Mapping[int, str], system: str, origin: str) -> None:
    """OperatorError unless every rubric has exactly its own plain format fields (never
    `{x.attr}`, `{x[0]}`, a conversion or a format spec) and every text is within its bound."""
    for prompt_id, text in rubrics.items():
        _check_rubric(prompt_id, text, origin)
    if not system.strip() or len(system) > MAX_SYSTEM_CHARS:
        raise shape_error(origin, SYSTEM_NAME, f"empty or over {MAX_SYSTEM_CHARS} characters")


def _check_rubric(prompt_id: int, text: str, origin: str) -> None:
    name = f"rubric {prompt_id}"
    if len(text) > MAX_RUBRIC_CHARS:
        raise shape_error(origin, name, f"over {MAX_RUBRIC_CHARS} characters")
    allowed = RUBRIC_FIELDS[prompt_id]
    seen = set()
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise shape_error(origin, name, f"not a format string ({exc})") from None
    for _literal, field_name, spec, conversion in parsed:
        if field_name is None:
            continue
        if field_name not in allowed or spec or conversion:
            shown = (
                field_name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            )
            raise shape_error(
                origin,
                name,
                f"format field {quoted(shown, 60)}: only the plain fields "
                f"{', '.join(sorted(allowed))} are allowed",
            )
        seen.add(field_name)
    if seen != allowed:
        raise shape_error(origin, name, f"no {{{'}, {'.join(sorted(allowed - seen))}}} field")
