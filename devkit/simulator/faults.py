"""Fault rules: make the simulated Fed Ledger misbehave on purpose.

A rule names the endpoint it hits and how the answer goes wrong. Rules are
tried in the order they were added; the first matching one with count left
is used up by one request.

Most faults answer before the API sees the request, as a proxy in front would;
with `processed` the API handles it first and only its answer is lost (the
fault replaces it), `trickle` sends the API's own answer a byte at a time, and
`oversized` sends the API's own answer padded with `size_bytes` more bytes of
JSON values (a hostile or broken API: devkit/local_server.py's padded_json).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from devkit.simulator.state import SimulatorConfigError, describe_errors, read_json_file

Endpoint = Literal["list", "request", "update", "any"]
FaultKind = Literal["status", "non_json", "empty", "delay", "drop", "trickle", "oversized"]

HTML_BODY = b"<html><body>502 Bad Gateway</body></html>"
FAULT_DETAIL = "Simulated fault"


class FaultRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoint: Endpoint
    kind: FaultKind
    status: int = Field(default=503, ge=100, le=599)
    delay_seconds: float = Field(default=1.0, ge=0, le=600)
    count: int | None = Field(default=None, ge=0)
    # The API processes the request before the fault replaces its answer.
    processed: bool = False
    # A Retry-After header for `status` answers: seconds, or an HTTP date.
    retry_after: str | None = Field(default=None, max_length=64)
    # `oversized`: the bytes of padding added to the API's answer.
    size_bytes: int = Field(default=0, ge=0, le=4 << 30)


_RULE_LIST = TypeAdapter(list[FaultRule])


class InvalidFaults(ValueError):
    """Rules that do not validate; the message is one line."""


def parse_rules(payload: Any) -> list[FaultRule]:
    """Rules from a payload that is one rule or a list of them."""
    # Validating each shape on its own keeps the error messages free of
    # union noise ("FaultRule.kind ...; list[FaultRule] ...").
    try:
        if isinstance(payload, list):
            return _RULE_LIST.validate_python(payload)
        return [FaultRule.model_validate(payload)]
    except ValidationError as exc:
        raise InvalidFaults(describe_errors(exc)) from exc


def load_fault_file(path: Path) -> list[FaultRule]:
    raw = read_json_file(path, "fault file")
    try:
        return parse_rules(raw)
    except InvalidFaults as exc:
        raise SimulatorConfigError(f"fault file {path}: {exc}") from exc


def endpoint_of(api_path: str) -> str | None:
    """Which rule endpoint a path below /api/v1 belongs to (None: only `any`)."""
    if api_path == "/tasks/list":
        return "list"
    if api_path.startswith("/tasks/request-validation-assignment/"):
        return "request"
    if api_path.startswith("/tasks/update-validation-assignment/"):
        return "update"
    return None


class FaultBook:
    """The active rules, shared by all handler threads."""

    def __init__(self, rules: list[FaultRule] | None = None) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = list(rules or [])

    def add(self, rules: list[FaultRule]) -> None:
        with self._lock:
            self._rules.extend(rules)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def describe(self) -> list[dict[str, Any]]:
        with self._lock:
            return [_dump(rule) for rule in self._rules]

    def take(self, endpoint: str | None) -> FaultRule | None:
        """Use up one count of the first rule matching `endpoint`, if any."""
        with self._lock:
            for rule in self._rules:
                if rule.endpoint not in ("any", endpoint):
                    continue
                if rule.count is not None:
                    if rule.count <= 0:
                        continue
                    rule.count -= 1
                # A copy, so the caller is unaffected by later edits of the book.
                return rule.model_copy()
        return None


def _dump(rule: FaultRule) -> dict[str, Any]:
    """A rule as listed: the later options only where given, so older listings stay as they were."""
    dumped = rule.model_dump()
    for name in ("processed", "retry_after", "size_bytes"):
        if dumped[name] == FaultRule.model_fields[name].default:
            del dumped[name]
    return dumped
