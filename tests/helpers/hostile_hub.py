"""A hostile Hub's answers to the kit's hub (validator/kit/hub.py `download`): each a way past
the kit's edges, under huggingface_hub 0.x (requests:
tests/test_hub_answers.py) or 1.x (httpx: tests/llm_judge/test_hub_answers_httpx.py), or both.
Served by the raw server of tests/helpers/hostile_server.py, which sends what a test says."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from tests.helpers.hostile_server import HostileServer, Request, answer

COMMIT = "a" * 40
MIB = 1 << 20
# What a base model's file may leave in the HF cache once refused (it left 256 MiB).
LEFT_AT_MOST = 16 * MIB


def use_hub(monkeypatch: pytest.MonkeyPatch, tmp: Path, server: HostileServer) -> None:
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_HUB_DISABLE_XET", raising=False)  # the kit turns Xet off itself
    monkeypatch.delenv("HF_TOKEN", raising=False)


def head_of(whole: bytes) -> bytes:
    """An answer's head alone: what a HEAD is answered (its Content-Length the GET's)."""
    return whole.split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"


def gzip_of_spaces(mib: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * MIB
    return b"".join([*(packer.compress(block) for _ in range(mib)), packer.flush()])


def on_disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def a_gzip_bomb_for_an_unlisted_base_file_is_refused(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base model's file the listing gave no size for (it was read uncapped) answered with
    256 KiB of gzip that decodes to 256 MiB, encoded though no coding was asked for: refused,
    transient, and the HF cache keeps next to nothing (it kept 256 MiB under 0.29; 1.5 took
    +310 MiB of memory; both then raised a raw OSError, "an unexpected error in the module")."""
    from validator.errors import TransientError
    from validator.kit import hub

    bomb = gzip_of_spaces(256)
    headers = ['ETag: "e"', f"X-Repo-Commit: {COMMIT}", "Content-Encoding: gzip"]

    def respond(request: Request) -> Iterable[bytes]:
        whole = answer(bomb, headers=headers)
        yield head_of(whole) if request.method == "HEAD" else whole

    cache = tmp / "cache"
    with HostileServer(respond) as server:
        use_hub(monkeypatch, tmp, server)
        with pytest.raises(TransientError, match="encoded, which was not asked for"):
            hub.download(
                "org/base", "config.json", "base model org/base", submission=False, size=None,
                revision=COMMIT, cache_dir=str(cache), token="hf_x",
            )  # fmt: skip
        asked = {r.header("Accept-Encoding") for r in server.requests}
    assert asked == {"identity"}, asked
    assert on_disk(cache) < LEFT_AT_MOST, f"{on_disk(cache) / MIB:.0f} MiB in the cache"


def odd_answer(where: str) -> Callable[[Request], Iterable[bytes]]:
    """A Hub whose answers for a file a listing gave at 2 bytes go wrong `where`:
    `file`: a redirect to file:///etc/passwd; `loop`: a redirect to itself; `short`: its HEAD
    says 3 bytes, its GET sends 2; `negative`: its HEAD's X-Linked-Size is -5; `pointer`: its
    commit header is `../..` (a path in the HF cache: "Invalid pointer path")."""
    path = f"/org/repo/resolve/{COMMIT}/config.json"
    commit = "../.." if where == "pointer" else COMMIT
    head = ['ETag: "e"', f"X-Repo-Commit: {commit}"]
    if where == "negative":
        head.append("X-Linked-Size: -5")

    def respond(request: Request) -> Iterable[bytes]:
        if where in ("file", "loop") and request.method == "GET":
            target = path if where == "loop" else "file:///etc/passwd"
            yield answer(b"", "302 Found", [f"Location: {target}"])
        elif request.method == "HEAD":
            yield head_of(answer(b"{}" + b" " * (where == "short"), headers=head))
        else:
            yield answer(b"{}", headers=head)

    return respond


def an_odd_hub_answer_is_the_senders(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, where: str, submission: bool
) -> Exception:
    """What `hub.download` raises for `odd_answer(where)`: the submission's (SubmissionRejected)
    for its own file, transient for a base model's; never the library's own error, which was
    "an unexpected error in the module" (scored again 3 times; a base's failed honest work)."""
    from validator.errors import SubmissionRejected, TransientError
    from validator.kit import hub

    expected = SubmissionRejected if submission else TransientError
    place = {"local_dir": tmp / "work"} if submission else {"cache_dir": str(tmp / "cache")}
    with HostileServer(odd_answer(where)) as server:
        use_hub(monkeypatch, tmp, server)
        with pytest.raises(expected) as raised:
            hub.download(
                "org/repo", "config.json", "org/repo", submission=submission, size=2,
                revision=COMMIT, force_download=True, token="hf_x", **place,
            )  # fmt: skip
    assert "org/repo" in str(raised.value)
    return raised.value


def xet_hub(cas: HostileServer, body: bytes) -> Callable[[Request], Iterable[bytes]]:
    """A Hub that says of its file what the real one says of a file stored in Xet (its hash,
    and a token route that names the Xet storage `cas`), and serves it over HTTP too."""
    head = ['ETag: "e1"', f"X-Repo-Commit: {COMMIT}", "X-Xet-Hash: " + "b" * 64]

    def respond(request: Request) -> Iterable[bytes]:
        if "/resolve/" in request.path:
            route = f"X-Xet-Refresh-Route: http://{request.header('Host')}/xet-token"
            whole = answer(body, headers=[*head, route])
            yield head_of(whole) if request.method == "HEAD" else whole
        else:  # the token route: where the storage is
            yield answer(b"", headers=[
                f"X-Xet-Cas-Url: {cas.url}", "X-Xet-Access-Token: token",
                "X-Xet-Token-Expiration: 4102444800",
            ])  # fmt: skip

    return respond
