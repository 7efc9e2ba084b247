"""The texts the judges read: the three rubrics and the judge's system message
(docs/llm-judge-scoring.md, "Judging"). They are the network's wording, read at start-up from
where `prompt_source` says (a commit of the network's validator, a folder URL, a local path, or
`builtin`), parsed with `ast` as data, never run, and cached in the state dir: docs/internals.md,
"llm_judge's judge texts".
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import string
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import requests
from pydantic import AfterValidator

from modules.llm_judge.judge_source import (
    MAX_FILE_BYTES,
    MAX_RUBRIC_CHARS,
    MODULE_FILE,
    PROMPT_FILE,
    RUBRIC_FIELDS,
    check_texts,
    parse_source_files,
)
from validator.kit import (
    AnswerTooLarge,
    CallAbandoned,
    Cap,
    ConfigError,
    OperatorError,
    alias,
    capped_session,
    overall_deadline,
    quoted,
)

log = logging.getLogger(__name__)

NETWORK_REPO = "FLock-io/FLock-validator"
NETWORK_COMMIT = "ef8368e3f0a26ec04f24f2d754e00762fca580b6"
RAW_FOLDER = "https://raw.githubusercontent.com/{repo}/{commit}/validator/modules/llm_judge/"
CHECKOUT_FOLDER = Path("validator", "modules", "llm_judge")
BUILTIN = "builtin"
BUILTIN_FOLDER = Path(__file__).with_name("prompts")
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
COMMIT = re.compile(r"[0-9a-fA-F]{40}")

FETCH_TIMEOUT = 30.0  # each read
# The whole of each file: a source that sends a byte now and then would otherwise hold the
# start-up for as long as it likes (each read is within its timeout).
FETCH_DEADLINE = 120.0
CACHE_PREFIX = "judge-texts-"


@dataclass(frozen=True)
class JudgeTexts:
    system: str  # the judge system message
    source: str  # where the texts came from, for the log
    rubrics: Mapping[int, str] = field(repr=False)  # prompt id -> str.format text
    # Ids whose text is an operator's `prompt_files` file (string.Template `$` syntax).
    template_ids: frozenset[int] = frozenset()

    def rubric_text(
        self,
        prompt_id: int,
        *,
        conversation_context: str,
        assistant_response: str,
        reference_response: str | None = None,
        tools: str | None = None,
    ) -> str:
        """The rubric `prompt_id` (1, 2 or 3: the caller has resolved fallbacks) filled in as the
        network fills it: str.format with that rubric's fields, so `{{`/`}}` become braces and
        braces in the values stay as they are."""
        if prompt_id not in RUBRIC_FIELDS:
            raise ValueError(f"no rubric {prompt_id!r}: the caller resolves ids to 1, 2 or 3")
        given = {
            "conversation_context": conversation_context,
            "assistant_response": assistant_response,
            "reference_response": reference_response,
            "tools": tools,
        }
        fields = {name: given[name] for name in RUBRIC_FIELDS[prompt_id]}
        missing = sorted(name for name, value in fields.items() if value is None)
        if missing:
            raise ValueError(f"rubric {prompt_id} needs {', '.join(missing)}")
        text = self.rubrics[prompt_id]
        if prompt_id in self.template_ids:
            return string.Template(text).safe_substitute(
                conversation=conversation_context,
                answer=assistant_response,
                reference=reference_response if reference_response is not None else "(none)",
                tools=tools or "(none)",
            )
        return text.format(**fields)


# --- prompt_source -----------------------------------------------------------------------------


def source_location(value: str) -> tuple[str, str]:
    """(`builtin` | `url` | `path`, where): what a `prompt_source` value names. ValueError with
    the reason when it names nothing usable (pydantic reports it as a config error)."""
    value = value.strip()
    if value == BUILTIN:
        return BUILTIN, BUILTIN
    if COMMIT.fullmatch(value):
        return "url", RAW_FOLDER.format(repo=NETWORK_REPO, commit=value.lower())
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if scheme == "http" and (parts.hostname or "") not in LOOPBACK_HOSTS:
            raise ValueError("a prompt_source URL must be https (plain http only on 127.0.0.1)")
        if parts.query or parts.fragment:
            raise ValueError("a prompt_source URL names a folder: no query or fragment")
        return "url", value if value.endswith("/") else value + "/"
    if scheme and len(scheme) > 1:
        raise ValueError(
            f"prompt_source scheme {scheme!r}: give `builtin`, a 40-hex commit of "
            f"{NETWORK_REPO}, an https URL of a folder, or a local path"
        )
    if not value:
        raise ValueError("prompt_source is empty")
    return "path", value


def _checked_source(value: str) -> str:
    source_location(value)
    return value.strip()


# The config key's type: checked when the config is read (a bad value is exit 2 then).
PromptSource = Annotated[str, AfterValidator(_checked_source)]


def load_judge_texts(
    prompt_source: str,
    cache_dir: Path,
    timeout: float = FETCH_TIMEOUT,
    *,
    deadline: float = FETCH_DEADLINE,
    prompt_files: Mapping[int, str] | None = None,
) -> JudgeTexts:
    """The judge texts `prompt_source` names; `cache_dir` (the state dir) keeps fetched ones
    for when the source cannot be reached. `prompt_files` (an alias, validator/_moved.py)
    replaces rubrics with operator files in `$` syntax. ConfigError for a value that names nothing;
    OperatorError when the texts cannot be had or do not have the expected shape."""
    try:
        kind, where = source_location(prompt_source)
    except ValueError as exc:
        raise ConfigError(f"prompt_source {quoted(prompt_source)}: {exc}") from None
    if kind == BUILTIN:
        texts = builtin_texts()
        log.warning(
            "judge texts: prompt_source is builtin, this project's own rubric wording: scores "
            "will not match the network's validators'"
        )
    elif kind == "path":
        texts = _from_checkout(Path(where).expanduser())
    else:
        texts = _from_url(where, cache_dir, timeout, deadline)
    if prompt_files:
        texts = _with_files(texts, prompt_files)
    log.debug("judge texts from %s", texts.source)
    return texts


def builtin_texts() -> JudgeTexts:
    """This project's own rubric texts and judge system sentence, with the network's fields."""
    try:
        rubrics = {
            prompt_id: (BUILTIN_FOLDER / f"rubric_{prompt_id}.txt").read_text(encoding="utf-8")
            for prompt_id in RUBRIC_FIELDS
        }
        system = (BUILTIN_FOLDER / "judge_system.txt").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise OperatorError(
            f"judge texts: the module's own prompts cannot be read: {exc}"
        ) from None
    return _checked(rubrics, system, "builtin (this project's own texts)", BUILTIN)


def _from_checkout(root: Path) -> JudgeTexts:
    folder = root / CHECKOUT_FOLDER if (root / CHECKOUT_FOLDER).is_dir() else root
    files = {}
    for name in (PROMPT_FILE, MODULE_FILE):
        path = folder / name
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES[name]:
                raise OperatorError(
                    f"judge texts from {path}: {size} bytes, over {MAX_FILE_BYTES[name]}"
                )
            files[name] = path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"prompt_source {root}: cannot read {path} ({exc.strerror or exc}); give a "
                f"checkout of {NETWORK_REPO} or the folder holding {PROMPT_FILE} and {MODULE_FILE}"
            ) from None
    return _checked(
        *parse_source_files(files[PROMPT_FILE], files[MODULE_FILE], str(folder)), str(folder)
    )


def _from_url(folder: str, cache_dir: Path, timeout: float, deadline: float) -> JudgeTexts:
    try:
        files = {name: _download(folder + name, name, timeout, deadline) for name in MAX_FILE_BYTES}
    except _FetchFailed as exc:
        cached = read_cache(cache_dir, folder)
        if cached is None:
            raise OperatorError(
                f"judge texts: {exc}, and no copy cached in {cache_dir}; let the validator "
                f"reach it, or set `prompt_source: builtin` in the llm_judge config to grade "
                f"with this project's own texts (scores will not match the network's)"
            ) from None
        log.warning("judge texts: %s; using the copy cached in %s", exc, cache_dir)
        return cached
    texts = _checked(*parse_source_files(files[PROMPT_FILE], files[MODULE_FILE], folder), folder)
    write_cache(cache_dir, folder, texts)
    return texts


class _FetchFailed(Exception):
    """The source could not be read (network, HTTP status): the cache may stand in."""


def _download(url: str, name: str, timeout: float, deadline: float) -> bytes:
    limit = MAX_FILE_BYTES[name]
    # The bounded reader counts what the connection carries too (a chunked answer's trailer
    # fields); a chunk above the file's limit, which is checked below.
    cap = Cap("judge.texts", limit + 64 * 1024, None, "the judge texts are the operator's")
    try:
        with (
            overall_deadline(deadline, f"judge texts from {url}"),
            capped_session(cap) as session,
            session.get(url, timeout=timeout, stream=True) as response,
        ):
            if response.status_code != 200:
                raise _FetchFailed(f"{url} answered HTTP {response.status_code}")
            body = bytearray()
            for chunk in response.iter_content(64 * 1024):
                body += chunk
                if len(body) > limit:
                    # Content, not reachability: the cache must not hide a source gone wrong.
                    raise OperatorError(f"judge texts from {url}: over {limit} bytes")
            return bytes(body)
    except requests.RequestException as exc:
        raise _FetchFailed(f"cannot fetch {url} ({type(exc).__name__})") from None
    except AnswerTooLarge as exc:  # content gone wrong, as a file past its limit
        raise OperatorError(f"judge texts from {url}: {exc}") from None
    except CallAbandoned as exc:
        if exc.stopped:  # the validator is stopping: no fault of the source, the work is kept
            raise
        # Past the deadline: as unreachable, the cache may stand in.
        raise _FetchFailed(str(exc)) from None


def _checked(rubrics: Mapping[int, str], system: str, source: str, origin: str = "") -> JudgeTexts:
    check_texts(rubrics, system, origin or source)
    return JudgeTexts(system=system, source=source, rubrics=dict(rubrics))


# --- the cache in the state dir ----------------------------------------------------------------


def cache_path(cache_dir: Path, folder: str) -> Path:
    key = hashlib.sha256(folder.encode("utf-8")).hexdigest()[:32]
    return cache_dir / f"{CACHE_PREFIX}{key}.json"


def write_cache(cache_dir: Path, folder: str, texts: JudgeTexts) -> None:
    """Atomically (a temporary file, then a rename): a crash never leaves half a copy. A cache
    that cannot be written is only a warning: the texts in hand are good."""
    path = cache_path(cache_dir, folder)
    body = {"source": folder, "system": texts.system, "rubrics": texts.rubrics}
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(prefix=path.name, suffix=".part", dir=cache_dir)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(body, out)
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, path)
        finally:
            Path(partial).unlink(missing_ok=True)
    except OSError as exc:
        full = " (disk full)" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        log.warning("judge texts: cannot cache them in %s%s: %s", cache_dir, full, exc)


def read_cache(cache_dir: Path, folder: str) -> JudgeTexts | None:
    """The cached texts of `folder`, checked as fetched ones are; None when there are none or
    they do not hold up (with a warning)."""
    path = cache_path(cache_dir, folder)
    try:
        if path.stat().st_size > 2 * MAX_FILE_BYTES[MODULE_FILE]:
            raise ValueError("oversized")
        body = json.loads(path.read_text(encoding="utf-8"))
        if body["source"] != folder:
            raise ValueError("another source's copy")
        rubrics = {int(key): value for key, value in body["rubrics"].items()}
        if set(rubrics) != set(RUBRIC_FIELDS) or not all(
            isinstance(v, str) for v in [*rubrics.values(), body["system"]]
        ):
            raise ValueError("not the three rubrics and the system text")
        return _checked(rubrics, body["system"], f"{folder} (cached in {path})", str(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OperatorError) as exc:
        log.warning("judge texts: the cached copy %s is not usable: %s", path, exc)
        return None


# --- prompt_files, an alias --------------------------------------------------------------------


def _with_files(texts: JudgeTexts, prompt_files: Mapping[int, str]) -> JudgeTexts:
    """`texts` with the rubrics the operator's files replace (string.Template `$` syntax:
    $conversation, $answer, $reference, $tools): the alias `prompt_files`."""
    log.warning(
        "judge texts: %s: rubrics %s", alias("llm_judge's prompt_files").line, sorted(prompt_files)
    )
    rubrics, template_ids = dict(texts.rubrics), set(texts.template_ids)
    for prompt_id, name in sorted(prompt_files.items()):
        if prompt_id not in RUBRIC_FIELDS:
            log.warning(
                "judge texts: prompt_files names rubric %s, not 1, 2 or 3: ignored", prompt_id
            )
            continue
        path = Path(name)
        try:
            if path.stat().st_size > MAX_RUBRIC_CHARS:
                raise ConfigError(
                    f"rubric prompt {prompt_id}: {path} is over {MAX_RUBRIC_CHARS} bytes"
                )
            rubrics[prompt_id] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"rubric prompt {prompt_id}: {path} cannot be read: {exc}") from None
        template_ids.add(prompt_id)
    files = ", ".join(f"{i}: {prompt_files[i]}" for i in sorted(template_ids & set(prompt_files)))
    return JudgeTexts(
        system=texts.system,
        source=f"{texts.source}, rubrics from prompt_files ({files})",
        rubrics=rubrics,
        template_ids=frozenset(template_ids),
    )
