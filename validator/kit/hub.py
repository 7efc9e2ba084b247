"""Hugging Face Hub calls for modules, through `huggingface_hub` (which a module using this must
have in its environment; the core itself does not need it): one error translation from the
library's exceptions to the failure contract, and the settings read at call time. A base
model's files: validator/kit/base_models.py, on top of it.

A submitter's repo that is missing, private, gated or lacks a file is SubmissionRejected; the
same for an operator's repo (a base model) is OperatorError; network faults, 5xx and
rate limits are TransientError; a full disk stops the validator. `HF_ENDPOINT` and
`HF_HUB_CACHE`/`HF_HOME` work as in the library: it reads them into constants when imported, so
they are read again on every call and passed explicitly. The token is the run's HF_TOKEN
(validator/run_context.py: `--hf-token` or the variable), passed explicitly to every call
that is given none; without one, the library's own (its login file).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import requests
from huggingface_hub import HfApi, constants, hf_hub_download
from huggingface_hub import errors as hf
from huggingface_hub.hf_api import ModelInfo

from validator._moved import moved_name
from validator.disk import no_room
from validator.errors import (
    AnswerTooLarge,
    OperatorError,
    SubmissionRejected,
    TransientError,
    ValidatorError,
    disk_full,
    exception_chain,
)
from validator.kit.downloads import TRANSIENT_STATUSES
from validator.outbound.answer_caps import ANSWER_CAPS, Cap, file_cap, reading_at_most
from validator.outbound.deadline import CallOverLimit, overall_deadline
from validator.outbound.hub_http import cap_the_library, fresh_connections
from validator.run_context import current_run

# huggingface_hub 0.x raises requests' errors, 1.x httpx's (a module's stack picks the line).
HTTP_ERRORS: tuple[type[BaseException], ...] = (requests.HTTPError, hf.HfHubHTTPError)
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    requests.ConnectionError,
    requests.Timeout,
    requests.exceptions.ChunkedEncodingError,  # a connection broken off within a body
    ConnectionError,
    TimeoutError,
)
# Any other error of the client is an answer it could not follow (a redirect loop, a redirect
# to file://, a body that cannot be decoded): the sender's (`_senders`).
CLIENT_ERRORS: tuple[type[BaseException], ...] = (requests.RequestException,)
# What httpx calls a transport error but is a redirect to a scheme it has no transport for.
REDIRECTED_AWAY: tuple[type[BaseException], ...] = (requests.exceptions.InvalidSchema,)
try:
    import httpx

    NETWORK_ERRORS += (httpx.TransportError,)
    CLIENT_ERRORS += (httpx.HTTPError,)
    REDIRECTED_AWAY += (httpx.UnsupportedProtocol,)
except ImportError:  # huggingface_hub 0.x does not need it
    pass

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")

# Overall deadlines (validator/outbound/deadline.py): the library's timeouts bound each read only,
# and a Hub that sends a byte every few seconds would hold the validator for ever. A call without a
# known size (a listing, a header, a config) gets HUB_CALL_DEADLINE_S; a download of a known size
# gets that plus its size at HUB_MIN_BYTES_PER_S (a 16 GB model: about 4.6 hours).
HUB_CALL_DEADLINE_S = 10 * 60.0
HUB_MIN_BYTES_PER_S = 1024 * 1024
# A download into a work folder whose partial file grows past its listed size by more than this
# is ended there (`_growth_guard`): a hostile Hub that lists 2 bytes and streams 200 MiB.
OVERSEND_SLACK_BYTES = 1024 * 1024

T = TypeVar("T")


def endpoint() -> str | None:
    value = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/")
    return value or None


def _http_endpoint() -> bool:
    return (endpoint() or constants.ENDPOINT).lower().startswith(("http://", "https://"))


def cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None  # the library's own default


def api() -> HfApi:
    return HfApi(endpoint=endpoint())


# -- error translation ------------------------------------------------------------------------


def _classify(
    exc: BaseException, what: str, submission: bool, local_dir: Path | None = None
) -> Exception | None:
    """The project exception for a failed hub call, or None when it is not a hub problem;
    `local_dir`: where the call downloads to, when not the HF cache."""
    # Private/gated/missing is the submitter's doing; for a base model it is the operator's.
    blame: type[Exception] = SubmissionRejected if submission else OperatorError
    hint = "" if submission else " Check the repo id, and that HF_TOKEN has been granted access."
    for err in exception_chain(exc):
        if isinstance(err, AnswerTooLarge):  # wrapped by the library on its way out
            return _over_cap(err, what, submission)
        if isinstance(err, OSError) and disk_full(err):
            return _no_room(err, what, local_dir)
        if isinstance(err, hf.HFValidationError):
            return blame(f"{what}: invalid repo id or revision: {err}")
        if isinstance(err, hf.RevisionNotFoundError):
            return blame(f"{what}: revision not found on the Hub.{hint}")
        if isinstance(err, hf.GatedRepoError):
            return blame(f"{what}: repo is gated and our HF_TOKEN has no access to it.{hint}")
        if isinstance(err, hf.RepositoryNotFoundError):
            return blame(f"{what}: repo not found (or private) on the Hub.{hint}")
        if isinstance(err, hf.LocalEntryNotFoundError):
            continue  # a network failure or 5xx wrapped by the library; its cause says which
        if isinstance(err, hf.SafetensorsParsingError):
            # E.g. a header over the library's 25 MB limit: the weights cannot be read.
            return blame(f"{what}: the safetensors header cannot be read: {str(err)[:300]}")
        if isinstance(err, hf.EntryNotFoundError):
            return blame(f"{what}: file listed by the Hub is missing at that commit")
        response = getattr(err, "response", None)
        if isinstance(err, HTTP_ERRORS) and response is not None:
            return _classify_status(response, what, blame, hint)
        if isinstance(err, REDIRECTED_AWAY) and not _http_endpoint():
            return OperatorError(f"{what}: HF_ENDPOINT {endpoint()!r} is not an http(s) URL")
        if isinstance(err, REDIRECTED_AWAY):
            return _over_cap(err, what, submission)
        if isinstance(err, (*NETWORK_ERRORS, hf.FileMetadataError)):
            return TransientError(f"{what}: could not reach the Hub: {err}")
    # Only then the library's own refusals: it wraps a 503 in "Force download failed", a
    # ValueError, whose cause said what it was.
    refused = next((err for err in exception_chain(exc) if _senders(err)), None)
    if refused is not None:
        return _over_cap(refused, what, submission)
    if any(isinstance(err, hf.LocalEntryNotFoundError) for err in exception_chain(exc)):
        return TransientError(f"{what}: could not reach the Hub: {exc}")
    return None


def _senders(err: BaseException) -> bool:
    """Whether `err` is the library refusing what the Hub sent (the sender's fault, not "an
    unexpected error in the module" to score again 3 times): a client error that is not a
    network fault (a redirect loop, to file://), the library's own OSError (no errno: "Consistency
    check failed", a body that is not the size its header said) or ValueError (`X-Repo-Commit:
    ../..`: "Invalid pointer path"; a listing that is not JSON)."""
    if isinstance(
        err, (ValidatorError, *NETWORK_ERRORS, hf.FileMetadataError, hf.LocalEntryNotFoundError)
    ):
        return False  # ours, the network's, or a wrapper whose cause says
    if isinstance(err, CLIENT_ERRORS):
        return True
    return (isinstance(err, OSError) and err.errno is None) or isinstance(err, ValueError)


def _no_room(err: OSError, what: str, local_dir: Path | None) -> Exception:
    """The disk guard's line for a download that found its disk full, naming where it wrote:
    the work folder a submission is downloaded into, or the HF cache."""
    if local_dir is not None:
        return no_room("download dir", local_dir, err.strerror or str(err), what=what)
    cache = Path(cache_dir() or constants.HF_HUB_CACHE)
    return no_room("HF cache", cache, err.strerror or str(err), what=what)


def _classify_status(response: Any, what: str, blame: type[Exception], hint: str) -> Exception:
    status = response.status_code
    if status >= 500 or status in TRANSIENT_STATUSES:
        return TransientError(f"{what}: the Hub answered HTTP {status}")
    message = response.headers.get("X-Error-Message", "")
    if status in (401, 403) and "Invalid credentials" in message:
        return OperatorError(f"{what}: the Hub refused HF_TOKEN (HTTP {status})")
    return blame(f"{what}: the Hub answered HTTP {status}.{hint}")


def _over_cap(exc: BaseException, what: str, submission: bool) -> Exception:
    """An answer past its cap (validator/outbound/bounded_reader.py), or one the library could
    not use (`_senders`): the sender's fault, so a submission's for its own repo and files,
    transient for the operator's base model."""
    blame = SubmissionRejected if submission else TransientError
    if isinstance(exc, AnswerTooLarge):
        return blame(f"{what}: {exc}")
    return blame(f"{what}: the Hub's answer cannot be used: {type(exc).__name__}: {str(exc)[:300]}")


def download_deadline(size: int | None) -> float:
    """The overall deadline for downloading `size` bytes (None: not known)."""
    return HUB_CALL_DEADLINE_S + (size or 0) / HUB_MIN_BYTES_PER_S


def hub_call(
    call: Callable[[], T],
    what: str,
    *,
    submission: bool,
    deadline_s: float | None = None,
    deadline_what: str | None = None,
    local_dir: Path | None = None,
    guard: Callable[[], str | None] | None = None,
    cap: Cap | None = ANSWER_CAPS["hub.metadata"],
) -> T:
    """`call()` within an overall deadline (HUB_CALL_DEADLINE_S unless given; past it,
    TransientError naming `deadline_what`, or `what`), its hub errors translated; `what` names
    the repo in messages, `submission` says whose fault a missing repo or file is, `local_dir`
    where the call downloads to when not the HF cache (a full disk names it); `guard` as in
    overall_deadline (CallOverLimit passes through). Every answer of the call is read under
    `cap` (the kit's bounded reader; None: not capped, a file of unknown size to disk)."""
    cap_the_library()
    fresh_connections()
    try:
        deadline = deadline_s or HUB_CALL_DEADLINE_S
        with overall_deadline(deadline, deadline_what or what, guard=guard), reading_at_most(cap):
            return call()
    except AnswerTooLarge as exc:
        raise _over_cap(exc, what, submission) from exc
    except TransientError:
        raise
    except Exception as exc:
        translated = _classify(exc, what, submission, local_dir)
        if translated is None:
            raise
        raise translated from exc


def _with_token(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with the run's token unless the caller gave one (the validator never puts
    `--hf-token` in its own environment for the library to find)."""
    if kwargs.get("token") is None:
        kwargs = {**kwargs, "token": current_run().secret("HF_TOKEN")}
    return kwargs


def model_info(repo_id: str, what: str, *, submission: bool, **kwargs: Any) -> ModelInfo:
    """The repo's listing, read under the hub.listing cap."""
    call = partial(api().model_info, repo_id, **_with_token(kwargs))
    return hub_call(call, what, submission=submission, cap=ANSWER_CAPS["hub.listing"])


def download(
    repo_id: str,
    name: str,
    what: str,
    *,
    submission: bool,
    size: int | None = None,
    **kwargs: Any,
) -> Path:
    """One file of a repo; `size` (from the listing) sets the overall deadline and the cap on
    what is read of it (the size plus OVERSEND_SLACK_BYTES; not listed: the `hub.unlisted`
    cap, 64 MiB); a content-encoded answer is refused (none is asked for). A `name`
    that would be written outside the download folder is refused before any request for it,
    and the written path is checked to lie inside it (`unsafe_name`)."""
    local_dir = Path(kwargs["local_dir"]) if kwargs.get("local_dir") else None
    folder = local_dir or Path(kwargs.get("cache_dir") or cache_dir() or constants.HF_HUB_CACHE)
    blame = SubmissionRejected if submission else OperatorError
    problem = unsafe_name(name, local_dir)
    if problem is not None:
        raise blame(f"{what}: the Hub lists the file name {name[:200]!r}, which {problem}")
    call = partial(hf_hub_download, repo_id, name, endpoint=endpoint(), **_with_token(kwargs))
    # Only a work folder's partial files are watched: in the shared cache another worker's
    # download of a bigger file of the same repo may be under way.
    guard = _growth_guard(local_dir, size) if local_dir is not None and size is not None else None
    try:
        path = Path(
            hub_call(
                call,
                what,
                submission=submission,
                deadline_s=download_deadline(size),
                deadline_what=f"{what}: {name} from {endpoint() or 'the Hub'}",
                local_dir=local_dir,
                guard=guard,
                cap=file_cap(size),
            )
        )
    except CallOverLimit as exc:
        raise blame(str(exc)) from exc
    # In the cache, links lead from a snapshot to its blobs, which an operator may keep on
    # another disk: there the written path is checked as written, links not followed.
    if not _inside(path, folder, follow=local_dir is not None):
        raise blame(f"{what}: {name[:200]!r} was written at {path}, outside {folder}")
    if size is not None and local_dir is not None and path.stat().st_size > size:
        written = path.stat().st_size
        path.unlink(missing_ok=True)
        raise blame(f"{what}: {name[:200]!r} arrived as {written} bytes; the Hub listed {size}")
    return path


def _growth_guard(local_dir: Path, size: int) -> Callable[[], str | None]:
    """For overall_deadline's watcher: a reason once a partial download in `local_dir` (the
    library's `.cache/huggingface/download/**/*.incomplete`; one download at a time there)
    holds more than `size` bytes plus OVERSEND_SLACK_BYTES, None before. The files on disk
    are checked again after the download; this ends one that would not stop."""
    partial = local_dir / ".cache" / "huggingface" / "download"
    limit = size + OVERSEND_SLACK_BYTES

    def grown() -> str | None:
        for path in partial.rglob("*.incomplete") if partial.is_dir() else []:
            try:
                got = path.stat().st_size
            except OSError:
                continue  # moved into place meanwhile
            if got > limit:
                return f"the Hub sent more than {got} bytes of a file it listed at {size}"
        return None

    return grown


def unsafe_name(name: str, folder: Path | None = None) -> str | None:
    """Why a listed file name may not be downloaded into `folder` (None: it may; without a
    folder, into the HF cache, the name alone is looked at). The library joins the name to the
    folder as it is and checks for `..` only on Windows, and the real Hub never lists such
    names: a hostile or intercepted Hub would write wherever its name leads."""
    if not name or "\0" in name or "\\" in name:
        return "is empty or holds a NUL or a backslash"
    if not name.isascii() and not _encodable(name):
        return "is not Unicode text (a lone surrogate)"
    if name.startswith("/") or any(part == ".." for part in name.split("/")):
        return "is absolute or has a '..' component"
    if folder is not None and not _inside(folder / name, folder):
        return f"resolves outside {folder}"
    return None


def _encodable(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _inside(path: Path, folder: Path, *, follow: bool = True) -> bool:
    """Whether `path` lies beneath `folder`, the links of both followed (`follow`) or not."""
    if not follow:
        return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder))
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


def commit_of(sha: str | None, what: str) -> str:
    """The 40-hex commit a listing resolved to: what is scored, downloaded and logged."""
    if sha is None or not COMMIT_RE.match(sha):
        raise TransientError(f"{what}: the Hub did not return a commit sha (got {sha!r})")
    return sha


def file_sizes(info: ModelInfo) -> dict[str, int | None]:
    """The repo's files at the listed commit and their sizes (LFS size for LFS files); None
    where the listing was made without `files_metadata=True`."""
    return {s.rfilename: (s.lfs.size if s.lfs else s.size) for s in info.siblings or []}


SAFETENSORS_INDEX = "model.safetensors.index.json"


def __getattr__(name: str) -> Any:
    return moved_name(__name__, name)  # fetch_base_model, from kit/base_models.py
