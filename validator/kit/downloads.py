"""An assignment's validation set: an http(s) download with a size cap, or a local path. Shared
by the modules (docs/module-api.md, "Helpers for modules"); needs only `requests`."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

import requests

from validator.disk import raise_if_full
from validator.errors import TransientError
from validator.outbound.answer_caps import Cap
from validator.outbound.bounded_reader import capped_session
from validator.outbound.deadline import overall_deadline

TIMEOUT = (10.0, 60.0)  # (connect, read) seconds
# The whole download, however slowly the server sends (the timeouts above bound each read only):
# past it, TransientError. A set is at most a few hundred MB; 30 min is 100 kB/s for 180 MB.
VALIDATION_SET_DEADLINE_S = 30 * 60.0
# Statuses that say "try again later" rather than "this request is wrong".
TRANSIENT_STATUSES = frozenset({408, 425, 429})
CHUNK = 1 << 20


def fetch_validation_set(
    url_or_path: str, dest: Path, max_bytes: int, default_name: str = "validation_set.jsonl"
) -> Path:
    """The validation set as a local file: downloaded over http(s), or a local path in place.

    `dest` is the file to write, or a directory to write it into (under the URL's file name, or
    `default_name`). The set comes from the Fed Ledger API, not the submitter, so a bad one is a
    ValueError rather than SubmissionRejected: validators fail the assignment, as upstream does.
    """
    scheme = urlsplit(url_or_path).scheme.lower()
    if scheme in ("http", "https"):
        return _download_validation_set(url_or_path, dest, max_bytes, default_name)
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):  # "C:\..." on Windows
        return _local_validation_set(Path(url_or_path).expanduser(), max_bytes)
    raise ValueError(
        f"validation set {url_or_path!r}: unsupported scheme {scheme!r}; "
        "only http(s) URLs and local paths are accepted"
    )


def _local_validation_set(path: Path, max_bytes: int) -> Path:
    if not path.is_file():
        raise ValueError(f"validation set {path} does not exist or is not a file")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"validation set {path} is {size} bytes, over the {max_bytes} byte limit")
    return path.resolve()


def _download_validation_set(url: str, dest: Path, max_bytes: int, default_name: str) -> Path:
    target = dest / _url_filename(url, default_name) if dest.is_dir() else dest
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    # Read through the bounded reader, which counts what the connection carries too (a chunked
    # answer's trailer fields); a chunk above the set's own limit, so that a set past
    # it is refused by _stream_capped, as the set's (ValueError).
    cap = Cap("validation.set", max_bytes + CHUNK, None, "the set is over its limit")
    try:
        with (
            overall_deadline(VALIDATION_SET_DEADLINE_S, f"validation set {url}"),
            capped_session(cap) as session,
            session.get(url, stream=True, timeout=TIMEOUT) as response,
        ):
            _check_validation_response(response, url, max_bytes)
            _stream_capped(response, part, url, max_bytes)
        # Only now: a download cut at the deadline may look complete to the client.
        os.replace(part, target)
    except requests.RequestException as err:
        raise TransientError(f"validation set {url}: download failed: {err}") from err
    except OSError as err:
        raise_if_full(err, "download dir", target.parent, f"validation set {url}")
        raise
    finally:
        part.unlink(missing_ok=True)
    return target


def _url_filename(url: str, default_name: str) -> str:
    name = Path(unquote(urlsplit(url).path)).name
    return name if name and not name.startswith(".") else default_name


def _check_validation_response(response: requests.Response, url: str, max_bytes: int) -> None:
    status = response.status_code
    if status >= 500 or status in TRANSIENT_STATUSES:
        raise TransientError(f"validation set {url}: server answered HTTP {status}")
    if status >= 400:
        raise ValueError(f"validation set {url}: server answered HTTP {status}")
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ValueError(
            f"validation set {url} is {declared} bytes, over the {max_bytes} byte limit"
        )


def _stream_capped(response: requests.Response, path: Path, url: str, max_bytes: int) -> None:
    # Content-Length may be absent or wrong (chunked, compressed), so count what arrives.
    written = 0
    with path.open("wb") as out:
        for chunk in response.iter_content(CHUNK):
            written += len(chunk)
            if written > max_bytes:
                raise ValueError(
                    f"validation set {url} is over the {max_bytes} byte limit "
                    f"({written} bytes received so far)"
                )
            out.write(chunk)
