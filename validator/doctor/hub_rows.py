"""The doctor's Hub rows: the HF token and a HEAD of each supported base's config.json at
HF_ENDPOINT (what gating refuses), every base at once in daemon threads, within the doctor's
deadline. The HTTP call is `_head_hub_file`; the token travels only to that endpoint, in a
header, and no redirect is followed."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import quote

import requests

from validator.doctor.rows import Row
from validator.errors import AnswerTooLarge
from validator.outbound.bounded_reader import Answer, fetch_answer
from validator.outbound.deadline import CallAbandoned
from validator.spec import ModuleSpec

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
TIMEOUT = (5.0, 15.0)  # connect, read: a doctor answers in seconds or says what hangs
PROBE_DEADLINE_S = sum(TIMEOUT)  # a probe's whole answer, read under the answer caps
# What a probe's failure to get an answer is (AnswerTooLarge, its answer past its cap,
# is said on its own).
UNANSWERED = (requests.RequestException, CallAbandoned)


def _module_config(config_dir: Path | None, module: str) -> dict:
    """configs/<module>.json as JSON, or {} (the validator itself reports a broken one)."""
    if config_dir is None:
        return {}
    try:
        config = json.loads((config_dir / f"{module}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def supported_bases(config_dir: Path | None, module: str) -> list[str]:
    """configs/<module>.json's supported_base_models, the bases assignments may name."""
    bases = _module_config(config_dir, module).get("supported_base_models")
    return [base for base in bases if isinstance(base, str)] if isinstance(bases, list) else []


def hub_names(spec: ModuleSpec, config_dir: Path | None) -> tuple[str, ...]:
    """The rows hub_rows gives for these settings."""
    if supported_bases(config_dir, spec.name):
        return ("HF token", "HF bases")
    return ("HF token",) if "HF_TOKEN" in spec.secrets else ()


def hub_rows(
    spec: ModuleSpec, config_dir: Path | None, token: str | None, env: Mapping[str, str]
) -> list[Row]:
    """The token and each supported base's config.json (a HEAD: what gating refuses)."""
    bases = supported_bases(config_dir, spec.name)
    token_needed = "HF_TOKEN" in spec.secrets
    if not bases and not token_needed:
        return []
    endpoint = (env.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
    if not token and token_needed:
        token_row = Row.failed("HF token", "not set", "set HF_TOKEN (or --hf-token)")
    elif not token:
        token_row = Row.ok("HF token", "not needed by this module")
    else:
        token_row = Row.ok("HF token", f"accepted by {endpoint}")
    if not bases:
        return [token_row]
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def probe(base: str) -> str:
        url = f"{endpoint}/{quote(base)}/resolve/main/config.json"
        try:
            response = _head_hub_file(url, headers)
        except AnswerTooLarge:
            return "an answer over the kit's cap"
        except UNANSWERED as exc:
            return f"unreachable ({type(exc).__name__})"
        code = response.headers.get("X-Error-Code", "")
        message = response.headers.get("X-Error-Message", "")
        if response.status_code < 400:
            return "ok"
        if code == "GatedRepo" or response.status_code == 403:
            return "gated"
        if response.status_code == 401 and "credentials" in message.lower():
            return "token refused"
        return f"HTTP {response.status_code}"

    results = _in_threads(probe, bases)
    return [_token_verdict(token_row, results, endpoint), _bases_row(results, endpoint)]


def _head_hub_file(url: str, headers: dict[str, str]) -> Answer:
    return fetch_answer(
        "HEAD", url, "hub.metadata", deadline_s=PROBE_DEADLINE_S, timeout=TIMEOUT, headers=headers
    )


def _in_threads(probe: Callable[[str], str], items: list[str]) -> dict[str, str]:
    """probe(item) of every item at once, in daemon threads: the check's own deadline (the
    doctor's) bounds them all, and one that never returns does not keep the doctor alive."""
    results: dict[str, str] = {}

    def run(item: str) -> None:
        results[item] = probe(item)

    threads = [threading.Thread(target=run, args=(item,), daemon=True) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {item: results[item] for item in items}


def _token_verdict(token_row: Row, results: dict[str, str], endpoint: str) -> Row:
    if token_row.result == "failed":  # not set: nothing else to say about it
        return token_row
    if "token refused" in results.values():
        return Row.failed(
            "HF token", f"{endpoint} refused it", "check HF_TOKEN: a read token of your account"
        )
    if all(result.startswith("unreachable") for result in results.values()):
        return Row.warning("HF token", f"not checked: {endpoint} unreachable", "see HF bases")
    return token_row


def _bases_row(results: dict[str, str], endpoint: str) -> Row:
    name = "HF bases"
    good = [base for base, result in results.items() if result == "ok"]
    gated = [base for base, result in results.items() if result == "gated"]
    other = {base: result for base, result in results.items() if result not in ("ok", "gated")}
    found = f"{len(good)}/{len(results)} reachable at {endpoint}"
    if len(good) == len(results):
        return Row.ok(name, found)
    if other and all(result.startswith("unreachable") for result in other.values()) and not good:
        return Row.failed(
            name, f"{endpoint} unreachable", "check the network, a proxy, or HF_ENDPOINT"
        )
    parts = [found]
    if gated:
        parts.append(f"gated, no access: {', '.join(gated[:6])}")
    if other:
        parts.append(", ".join(f"{base}: {result}" for base, result in list(other.items())[:6]))
    fix = "ask for access on each gated base's Hub page with HF_TOKEN's account"
    if other:
        fix = "check the network, HF_ENDPOINT and HF_TOKEN; " + fix
    # A base without access fails the assignments that name it, not the validator.
    return Row.failed(name, "; ".join(parts), fix)
