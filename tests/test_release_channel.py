"""A hostile releases' channel (launcher/release/channel.py): it answers
before any signature is checked (a mirror given with --release-channel, anyone on the path of a
plain-http one), so what it sends is read through the validator's bounded reader: one overall
deadline for a trickle, the `release.listing` and `release.asset` caps for padding, the bounded
decoder for nesting. Each is "unavailable" (run.py --pull stops, exit 3; the follower asks
again), or for a signature "not a signature" (exit 3); never a traceback, never a wait past the
deadline."""

from __future__ import annotations

import tracemalloc

import pytest

from devkit.release_channel import ReleaseKey
from launcher.release import channel as release_channel
from launcher.release.channel import (
    MAX_LISTING_BYTES,
    Channel,
    ReleaseUnavailable,
    fetch_release,
    newer_versions,
)
from launcher.release.manifest import ReleaseRefused, trusted_keys
from tests.helpers.hostile_server import HostileServer, answer

REPOSITORY = "FLock-io/flock-validator"
DEEP = b"[" * 4000  # within the signature's 4 KiB, past json.loads' recursion limit
HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"


def channel_of(server: HostileServer) -> Channel:
    return Channel(f"{server.url}/{REPOSITORY}")


def test_a_trickling_channel_is_abandoned_at_its_overall_deadline(monkeypatch):
    # A byte every 0.2 s, each read well within READ_SECONDS: only the overall deadline ends
    # it (before: looked at after each 64 KiB, so 60 bytes over 12 s were all waited for).
    monkeypatch.setattr(release_channel, "TOTAL_SECONDS", 1.0)

    def trickle(request):
        yield HEAD
        for _ in range(60):
            yield b" "
            yield 0.2

    with HostileServer(trickle) as server:
        with pytest.raises(ReleaseUnavailable, match="took over 1 s"):
            newer_versions(channel_of(server), "0.1.0")
        assert server.cut_off.wait(10), "the launcher kept the connection"
    assert server.sent - len(HEAD) < 60


@pytest.mark.parametrize("what", ["listing", "signature"])
def test_deep_nesting_from_the_channel_is_refused_not_a_crash(tmp_path, what):
    # Before: RecursionError out of json.loads, past every except clause (run.py: a traceback,
    # exit 1; the follower's thread: dead).
    (tmp_path / "launcher" / "release").mkdir(parents=True)
    key = ReleaseKey()
    key.trust_in(tmp_path)
    files = key.release("0.1.1", {"fixture": "sha256:" + "e" * 64}).files

    def respond(request):
        if what == "signature" and request.path.endswith("/release.json"):
            yield answer(files["release.json"])
        else:
            yield answer(DEEP)

    with HostileServer(respond) as server:
        if what == "listing":
            with pytest.raises(ReleaseUnavailable, match="nests deeper than the 64 levels"):
                newer_versions(channel_of(server), "0.1.0")
        else:
            keys = trusted_keys(tmp_path / "launcher" / "release" / "release_keys.json")
            with pytest.raises(ReleaseRefused, match="release.json.sig is not a signature"):
                fetch_release(channel_of(server), "0.1.1", keys)


def test_a_releases_list_of_millions_of_values_is_refused_before_it_is_decoded():
    # 4 MiB of `{},`: 1.4 million dicts (before: +112 MiB of Python objects, then refused).
    body = b"[" + b"{}," * ((MAX_LISTING_BYTES - 2) // 3 - 1) + b"{}]"

    def respond(request):
        yield answer(body)

    with HostileServer(respond) as server:
        tracemalloc.start()
        try:
            with pytest.raises(ReleaseUnavailable, match="JSON values"):
                newer_versions(channel_of(server), "0.1.0")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 6 * len(body), f"{peak / 2**20:.0f} MiB for a {len(body) / 2**20:.0f} MiB list"
