"""The doctor's checks of the services a validator talks to and of its disks (no Docker here:
these run in the module's image as well as on the host). Each call is read-only, has a short
timeout and follows no redirect, so a key never travels to another host."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import quote

import requests

from validator.disk import DEFAULT_MIN_FREE_MB, MIB, free_bytes
from validator.errors import AnswerTooLarge
from validator.kit.bounded_reader import Answer, fetch_answer
from validator.kit.deadline import CallAbandoned
from validator.observe.doctor import Row
from validator.options import DEFAULT_API_URL
from validator.spec import ModuleSpec

DEFAULT_HF_ENDPOINT = "https://huggingface.co"
TIMEOUT = (5.0, 15.0)  # connect, read: a doctor answers in seconds or says what hangs
PROBE_DEADLINE_S = sum(TIMEOUT)  # a probe's whole answer, read under the kit's caps
# What a probe's failure to get an answer is (AnswerTooLarge, its answer past the kit's cap,
# is said on its own).
UNANSWERED = (requests.RequestException, CallAbandoned)
# The Date header has a one-second resolution and the request takes a while.
SKEW_OK_SECONDS = 10.0
HUB_PARALLEL = 8
# A 7B base in bf16 is about 15 GB; two of them while the cache turns over.
DEFAULT_HF_MIN_FREE_GB = 40.0
# modules/llm_judge/judge_texts.py's source and cache (read here without importing the module).
RAW_GITHUB = "https://raw.githubusercontent.com"
JUDGE_PROMPT_FILE = "prompt.py"
COMMIT = re.compile(r"[0-9a-fA-F]{40}")


@dataclass(frozen=True)
class Settings:
    spec: ModuleSpec
    flock_api_key: str | None
    hf_token: str | None
    api_url: str = DEFAULT_API_URL
    task_ids: tuple[str, ...] = ()
    config_dir: Path | None = None
    state_dir: Path | None = None  # None: the journal lives in a Docker volume (the host)
    hf_cache_dir: Path | None = None
    min_free_mb: int = DEFAULT_MIN_FREE_MB
    hf_min_free_gb: float = DEFAULT_HF_MIN_FREE_GB
    judge_models: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


def service_rows(settings: Settings) -> list[Row]:
    """The rows that do not need Docker: the Fed Ledger and the clock, the Hub, the judge, and
    the disks when their paths are known here."""
    rows = ledger_rows(settings.api_url, settings.flock_api_key, settings.task_ids)
    if settings.state_dir is not None:
        rows.append(disk_row("disk: journal", settings.state_dir, settings.min_free_mb))
    if settings.hf_cache_dir is not None and "hf-cache" in settings.spec.volumes:
        floor = int(settings.hf_min_free_gb * 1024)
        rows.append(disk_row("disk: HF cache", settings.hf_cache_dir, floor))
    rows += hub_rows(settings)
    if "OPENAI_API_KEY" in settings.spec.secrets:
        rows += judge_rows(settings)
    return rows


# -- the Fed Ledger -------------------------------------------------------------------------


def ledger_rows(api_url: str, api_key: str | None, task_ids: tuple[str, ...] = ()) -> list[Row]:
    """GET /tasks/list with the key: the one read-only call of the API (a lookup would take an
    assignment). Its Date header gives the clock's skew."""
    name = "Fed Ledger"
    if not api_key:
        return [Row.failed(name, "no key", "set FLOCK_API_KEY (or --flock-api-key)")]
    url = api_url.rstrip("/") + "/tasks/list"
    try:
        response = fetch_answer(
            "GET", url, "ledger.tasks", deadline_s=PROBE_DEADLINE_S, timeout=TIMEOUT,
            headers={"flock-api-key": api_key},
        )  # fmt: skip
    except AnswerTooLarge as exc:
        return [Row.failed(name, str(exc), "check --api-url / FLOCK_API_URL")]
    except UNANSWERED as exc:
        return [
            Row.failed(
                name,
                f"{url} unreachable ({type(exc).__name__})",
                "check the network, a proxy, or --api-url / FLOCK_API_URL",
            )
        ]
    rows = [_ledger_answer(name, url, response, task_ids)]
    rows.append(clock_row(response.headers.get("Date"), time.time()))
    return rows


def _ledger_answer(name: str, url: str, response: Answer, task_ids: tuple[str, ...]) -> Row:
    status = response.status_code
    if status in (401, 403):
        return Row.failed(
            name,
            f"HTTP {status}: the API refused the key",
            "check FLOCK_API_KEY (or --flock-api-key): the key of your validator account",
        )
    try:
        body = response.json()
    except ValueError:
        body = None
    if status != 200 or not isinstance(body, list):
        return Row.failed(
            name,
            f"GET {url}: HTTP {status}, not a task list",
            "check --api-url / FLOCK_API_URL; retry later if the API is down",
        )
    listed = {str(task.get("id")).strip() for task in body if isinstance(task, dict)}
    missing = [task_id for task_id in task_ids if task_id not in listed]
    if missing:
        return Row.warning(
            name,
            f"key accepted; task {', '.join(missing[:5])} not in the API's {len(listed)} tasks",
            "check TASK_IDS",
        )
    return Row.ok(name, f"key accepted; {len(listed)} tasks listed")


def clock_row(date_header: str | None, now: float) -> Row:
    name = "clock"
    if not date_header:
        return Row.warning(name, "the API sent no Date header", "check the clock by hand (NTP)")
    try:
        server = parsedate_to_datetime(date_header).timestamp()
    except (TypeError, ValueError):
        return Row.warning(name, "the API's Date header is unreadable", "check the clock (NTP)")
    skew = now - server
    if abs(skew) <= SKEW_OK_SECONDS:
        return Row.ok(name, f"{skew:+.0f} s from the API's clock")
    return Row.warning(
        name,
        f"{skew:+.0f} s from the API's clock: timestamps in records and logs are off",
        "turn on time sync (timedatectl set-ntp true, or chrony)",
    )


# -- disks ----------------------------------------------------------------------------------


def disk_row(name: str, path: Path, floor_mb: int) -> Row:
    """Free space as the disk guard counts it (validator/disk.py), against `floor_mb`."""
    try:
        free_mb = free_bytes(path) // MIB  # a path not created yet: its file system
    except OSError as exc:
        return Row.failed(name, f"{path}: {exc.strerror or exc}", "check the path and its mount")
    if free_mb < floor_mb:
        return Row.failed(
            name,
            f"{path}: {free_mb} MiB free, under the {floor_mb} MiB floor",
            "free space there or give it a larger volume",
        )
    return Row.ok(name, f"{path}: {free_mb} MiB free (floor {floor_mb} MiB)")


# -- the Hub --------------------------------------------------------------------------------


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


def hub_rows(settings: Settings) -> list[Row]:
    """The token and each supported base's config.json (a HEAD: what gating refuses)."""
    spec = settings.spec
    bases = supported_bases(settings.config_dir, spec.name)
    token_needed = "HF_TOKEN" in spec.secrets
    if not bases and not token_needed:
        return []
    endpoint = (settings.env.get("HF_ENDPOINT") or DEFAULT_HF_ENDPOINT).rstrip("/")
    token = settings.hf_token
    if not token and token_needed:
        token_row = Row.failed("HF token", "not set", "set HF_TOKEN (or --hf-token)")
    elif not token:
        token_row = Row.ok("HF token", "not needed by this module")
    else:
        token_row = Row.ok("HF token", f"accepted by {endpoint}")
    if not bases:
        return [token_row]
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def probe(base: str) -> tuple[str, str]:
        url = f"{endpoint}/{quote(base)}/resolve/main/config.json"
        try:
            response = fetch_answer(
                "HEAD", url, "hub.metadata", deadline_s=PROBE_DEADLINE_S, timeout=TIMEOUT,
                headers=headers,
            )  # fmt: skip
        except AnswerTooLarge:
            return base, "an answer over the kit's cap"
        except UNANSWERED as exc:
            return base, f"unreachable ({type(exc).__name__})"
        code = response.headers.get("X-Error-Code", "")
        message = response.headers.get("X-Error-Message", "")
        if response.status_code < 400:
            return base, "ok"
        if code == "GatedRepo" or response.status_code == 403:
            return base, "gated"
        if response.status_code == 401 and "credentials" in message.lower():
            return base, "token refused"
        return base, f"HTTP {response.status_code}"

    with ThreadPoolExecutor(HUB_PARALLEL) as pool:
        results = dict(pool.map(probe, bases))
    return [_token_verdict(token_row, results, endpoint), _bases_row(results, endpoint)]


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


# -- the judge (llm_judge) ------------------------------------------------------------------


def judge_rows(settings: Settings) -> list[Row]:
    return [_judge_endpoint_row(settings), judge_texts_row(settings)]


def _judge_endpoint_row(settings: Settings) -> Row:
    name = "judge endpoint"
    base_url = (settings.env.get("OPENAI_BASE_URL") or "").strip().rstrip("/")
    key = (settings.env.get("OPENAI_API_KEY") or "").strip()
    if not base_url or not key:
        missing = "OPENAI_BASE_URL" if not base_url else "OPENAI_API_KEY"
        return Row.failed(name, f"{missing} not set", f"set {missing}")
    url = f"{base_url}/models"
    try:
        response = fetch_answer(
            "GET", url, "judge.models", deadline_s=PROBE_DEADLINE_S, timeout=TIMEOUT,
            headers={"Authorization": f"Bearer {key}"},
        )  # fmt: skip
    except AnswerTooLarge as exc:
        return Row.failed(name, str(exc), "check OPENAI_BASE_URL")
    except UNANSWERED as exc:
        return Row.failed(
            name, f"{url} unreachable ({type(exc).__name__})", "check OPENAI_BASE_URL"
        )
    if response.status_code in (401, 403):
        return Row.failed(name, f"HTTP {response.status_code}", "check OPENAI_API_KEY")
    try:
        listed = [m.get("id") for m in response.json().get("data", []) if isinstance(m, dict)]
    except (ValueError, AttributeError):
        listed = None
    if response.status_code != 200 or listed is None:
        return Row.warning(
            name,
            f"GET {url}: HTTP {response.status_code}, no model list (judging then uses the "
            "network's fallback models)",
            "check OPENAI_BASE_URL",
        )
    missing = [model for model in settings.judge_models if model not in listed]
    if missing:
        return Row.failed(
            name,
            f"not listed: {', '.join(missing)} (lists {len(listed)} models)",
            "serve those judge models there, or point OPENAI_BASE_URL at an endpoint that does",
        )
    return Row.ok(name, f"{url} lists {len(listed)} models")


def judge_texts_source(settings: Settings) -> str:
    """The folder the judge texts come from, as modules/llm_judge/judge_texts.py reads
    `prompt_source`: `builtin`, a URL folder (a 40-hex commit: that commit of the pinned
    repository's folder; none given: the pinned commit), or a local path."""
    config = _module_config(settings.config_dir, settings.spec.name)
    value = str(config.get("prompt_source") or "").strip()
    pin = settings.spec.protocol
    if value == "builtin" or value.startswith(("http://", "https://")):
        return value if value == "builtin" or value.endswith("/") else value + "/"
    if (not value or COMMIT.fullmatch(value)) and pin is not None:
        commit = value.lower() or pin.commit
        return f"{RAW_GITHUB}/{pin.repo}/{commit}/{pin.path}/"
    return value


def judge_texts_row(settings: Settings) -> Row:
    """Fetched (the first file answers) or cached in the state dir under the key the module
    uses; neither is exit 3 at start-up."""
    name = "judge texts"
    source = judge_texts_source(settings)
    if source == "builtin":
        return Row.ok(name, "this project's built-in texts (scores may differ from the network's)")
    if not source.startswith(("http://", "https://")):
        found = Path(source, JUDGE_PROMPT_FILE).is_file()
        if found:
            return Row.ok(name, f"read from {source}")
        return Row.failed(name, f"{source}{JUDGE_PROMPT_FILE} missing", "fix prompt_source")
    key = hashlib.sha256(source.encode("utf-8")).hexdigest()[:32]
    cache = settings.state_dir / f"judge-texts-{key}.json" if settings.state_dir else None
    cached = cache is not None and cache.is_file()
    try:
        response = requests.get(
            source + JUDGE_PROMPT_FILE, timeout=TIMEOUT, allow_redirects=False, stream=True
        )
        response.close()
        fetched, why = response.status_code == 200, f"HTTP {response.status_code}"
    except requests.RequestException as exc:
        fetched, why = False, type(exc).__name__
    if fetched:
        return Row.ok(name, f"{source} answers" + (", and a copy is cached" if cached else ""))
    if cached:
        return Row.warning(
            name, f"{source}: {why}; the copy cached in the state dir stands in", "none needed"
        )
    fix = "let it reach that host, or set prompt_source: builtin in configs/llm_judge.json"
    if cache is None:  # the host: the cache is in the state volume, not looked at here
        return Row.warning(
            name,
            f"{source}: {why}; only a copy cached in the state volume would stand in "
            "(`python -m validator doctor` in the container looks)",
            fix,
        )
    return Row.failed(
        name, f"{source}: {why} and none is cached: the validator stops at start (exit 3)", fix
    )
