"""The kit's bounded reader (validator/outbound/bounded_reader.py): every answer from
outside is read under the cap of its kind of call, in bytes (decoded) and JSON values, and is
never decoded past it; the caps are one table, the docs' (docs/reliability.md). Served by
devkit's GitHub stand-in and local Hub on 127.0.0.1."""

from __future__ import annotations

import re

import pytest
import requests

from devkit import REPO_ROOT
from devkit.github_api import LocalGitHub
from devkit.validator_cli import wait_for
from tests.faults.figures import record
from tests.helpers.hostile_listing import FILES, hostile_listing_is_capped
from tests.helpers.hostile_server import HostileServer, chunked_with_trailers
from validator.errors import AnswerTooLarge, JsonRefused, TransientError
from validator.kit.downloads import fetch_validation_set
from validator.ledger.answers import ApiUnavailable
from validator.ledger.client import FedLedgerClient
from validator.outbound.answer_caps import ANSWER_CAPS, Cap, reading_at_most
from validator.outbound.bounded_reader import capped_session, fetch_answer, json_lines
from validator.outbound.safe_json import loads_bounded, value_count

MIB = 1 << 20
IN_FLIGHT = 12 * MIB
TIMEOUT = (5.0, 10.0)
SMALL = Cap("test.small", 64 * 1024, 1_000, "a test's")


@pytest.fixture
def github():
    with LocalGitHub() as served:
        served.add_commit("o/r", "a" * 40, "one", ["x.py"])
        yield served


def listing(github) -> str:
    return f"{github.endpoint}/repos/o/r/commits"


def units(text: str) -> int:
    number, unit = text.split()
    return int(number) * {"KiB": 1024, "MiB": MIB}[unit]


def test_the_docs_table_is_the_code():
    text = (REPO_ROOT / "docs" / "reliability.md").read_text()
    section = text.split("## Byte caps on answers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z.]+)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", section, re.M)
    assert {kind for kind, *_ in rows} == set(ANSWER_CAPS)
    for kind, size, values, over in rows:
        cap = ANSWER_CAPS[kind]
        size = size.strip().removeprefix("listed size + ")
        assert units(size) == cap.max_bytes, kind
        assert values.strip() == ("-" if cap.max_values is None else f"{cap.max_values:,}")
        assert over.strip() == cap.over, kind


def test_an_answer_past_its_bytes_is_not_read_further(github):
    github.pad_next(1, 40 * MIB)
    with pytest.raises(AnswerTooLarge, match="over the 65536 bytes a test.small answer") as info:
        fetch_answer("GET", listing(github), SMALL, deadline_s=60, timeout=TIMEOUT)
    assert isinstance(info.value, TransientError)  # the sender's fault: transient unless told
    # The server's write fails once the client has closed the connection (a moment later).
    ((length, sent),) = wait_for(lambda: github.padded, 30, "the server's record")
    assert sent <= SMALL.max_bytes + IN_FLIGHT < length


def test_an_answer_within_its_bytes_but_of_too_many_values_is_never_decoded(github):
    # 120 kB of `{},` is 40,000 objects: 3 MB of Python for a 64 kB cap's worth of text.
    cap = Cap("test.values", 200 * 1024, 1_000, "a test's")
    github.pad_next(1, 120 * 1024)
    with pytest.raises(AnswerTooLarge, match="more than the 1000 JSON values a test.values"):
        fetch_answer("GET", listing(github), cap, deadline_s=60, timeout=TIMEOUT)
    # The same within its values is read and decoded.
    answer = fetch_answer("GET", listing(github), cap, deadline_s=60, timeout=TIMEOUT)
    assert [item["sha"] for item in answer.json()] == ["a" * 40]


def test_a_compressed_answer_counts_at_its_decoded_size(github):
    github.pad_next(1, 40 * MIB, gzip=True)
    with pytest.raises(AnswerTooLarge, match="over the 1048576 bytes a github.commits answer"):
        fetch_answer("GET", listing(github), "github.commits", deadline_s=60, timeout=TIMEOUT)
    ((length, _sent),) = wait_for(lambda: github.padded, 30, "the server's record")
    assert length < 200 * 1024  # what came over the wire


def test_the_cap_of_the_call_in_progress_wins_and_a_streamed_read_is_capped_too(github):
    github.pad_next(2, 4 * MIB)
    with capped_session(ANSWER_CAPS["github.commits"]) as session:
        with reading_at_most(SMALL), pytest.raises(AnswerTooLarge, match="test.small"):
            session.get(listing(github), timeout=TIMEOUT)
        with session.get(listing(github), timeout=TIMEOUT, stream=True) as response:
            with pytest.raises(AnswerTooLarge, match="github.commits"):
                response.raw.read()  # one read of everything is read in capped pieces
        with reading_at_most(None):  # not capped: a file of unknown size, to disk
            assert session.get(listing(github), timeout=TIMEOUT).json()[0]["sha"] == "a" * 40
    sent = wait_for(lambda: len(github.padded) == 2 and github.padded, 30, "the records")
    assert [bytes_sent <= MIB + IN_FLIGHT for _, bytes_sent in sent] == [True, True]


@pytest.mark.parametrize("call", ["fed-ledger", "fetch-answer", "validation-set"])
def test_trailers_after_a_chunked_body_are_read_no_further_than_the_cap(call, tmp_path):
    # An attack: http.client and urllib3 read and discard a chunked answer's trailer fields
    # with no limit on their number, so a cap on the body alone lets 6 GB of trailers after a
    # 2 MiB-capped task list be read (9.3 s), and the list accepted.
    with HostileServer(chunked_with_trailers(64 * MIB)) as server:
        if call == "fed-ledger":
            cap = ANSWER_CAPS["ledger.tasks"]
            client = FedLedgerClient("sk-test", server.url, retries=0, deadline=120)
            with pytest.raises(ApiUnavailable, match="over the 2097152 bytes a ledger.tasks"):
                client.list_tasks()
        elif call == "validation-set":
            cap = Cap("validation.set", MIB, None, "")
            with pytest.raises(AnswerTooLarge, match="a validation.set answer"):
                fetch_validation_set(f"{server.url}/set.jsonl", tmp_path, max_bytes=MIB)
            assert list(tmp_path.iterdir()) == []
        else:
            cap = ANSWER_CAPS["github.commits"]
            with pytest.raises(AnswerTooLarge, match="over the 1048576 bytes a github.commits"):
                fetch_answer("GET", f"{server.url}/x", cap, deadline_s=120, timeout=TIMEOUT)
        assert server.cut_off.wait(30), "the client never went away"
    assert server.sent < cap.max_bytes + IN_FLIGHT, f"{server.sent / MIB:.0f} MiB sent"
    # A few trailer fields, as a server may send, are read as ever.
    with HostileServer(chunked_with_trailers(120_000)) as server:
        answer = fetch_answer(
            "GET", f"{server.url}/x", "ledger.tasks", deadline_s=60, timeout=TIMEOUT
        )
        assert answer.json() == [{"id": 1}]


def test_redirects_are_not_followed_by_fetch(github):
    answer = fetch_answer("GET", f"{github.endpoint}/nowhere", "github.commits", deadline_s=60,
                   timeout=TIMEOUT)  # fmt: skip
    assert answer.status_code == 404 and answer.json() == {"message": "Not Found"}
    with pytest.raises(requests.ConnectionError):
        fetch_answer(
            "GET", "http://127.0.0.1:9/x", "github.commits", deadline_s=60, timeout=TIMEOUT
        )


def test_json_values_are_counted_on_the_text():
    assert value_count('{"a": [1, 2, {"b": "x,y,[{"}], "c": null}') == 7
    # An upper bound: a container after a comma counts twice (the text alone cannot tell an
    # empty one from one that holds a string).
    assert value_count("[" + ",".join(["{}"] * 1000) + "]") == 2001
    with pytest.raises(JsonRefused, match="cfg: holds more than 1000 JSON values"):
        loads_bounded("[" + ",".join(["0"] * 1000) + "]", "cfg", max_values=1000)
    assert len(loads_bounded("[" + ",".join(["0"] * 999) + "]", "cfg", max_values=1000)) == 999


def test_a_hostile_hubs_huge_listing_is_capped(tmp_path):
    measured = hostile_listing_is_capped(tmp_path)
    record(
        f"a Hub listing of {FILES:,} files ({measured['length'] // MIB} MB), huggingface_hub 0.29",
        f"read {max(measured['sent']) // MIB} MB at most, never parsed: a submission's failed, "
        f"a base model's transient; peak {measured['hostile'] // MIB} MiB against "
        f"{measured['honest'] // MIB} MiB honest",
    )


def test_a_stream_of_json_lines_is_read_line_by_line_within_the_cap():
    # The Docker engine's pull progress (run.py --pull): each line decoded as it completes.
    cap = Cap("test.lines", 100, 10, "a test's")
    chunks = [b'{"status": "a"}\r\n{"sta', b'tus": "b"}\r\n', '{"error": "c"}']
    assert list(json_lines(chunks, cap, "pull")) == [
        {"status": "a"}, {"status": "b"}, {"error": "c"},
    ]  # fmt: skip
    with pytest.raises(AnswerTooLarge, match="pull: the answer is over the 100 bytes"):
        list(json_lines([b'{"status": "a"}\n', b"x" * 60, b"y" * 60], cap, "pull"))
    with pytest.raises(AnswerTooLarge, match="more than the 10 JSON values"):
        list(json_lines([b"[" + b",".join([b"0"] * 20) + b"]\n"], cap, "pull"))
    with pytest.raises(JsonRefused, match="pull: not valid JSON"):
        list(json_lines([b"<html>\n"], cap, "pull"))
