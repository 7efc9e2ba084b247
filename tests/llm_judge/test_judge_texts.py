"""The judge texts as protocol data (modules/llm_judge/judge_texts.py): read from a source of the
network's shape, served on 127.0.0.1 by devkit/judge_prompts.py with this project's own texts,
parsed with `ast` and never run, cached in the state dir, refused when hostile."""

from __future__ import annotations

import logging
import runpy
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from devkit.judge_prompts import JudgeSourceServer, builtin_rubrics, write_judge_source
from devkit.judge_server import answer_in
from modules.llm_judge import judge_texts
from modules.llm_judge.judge_source import parse_source_files
from modules.llm_judge.judge_texts import (
    CACHE_PREFIX,
    NETWORK_COMMIT,
    JudgeTexts,
    builtin_texts,
    load_judge_texts,
    source_location,
)
from modules.llm_judge.schemas import LlmJudgeConfig
from tests.helpers.hostile_server import HostileServer, chunked_with_trailers
from tests.helpers.trickle_server import SEEN_CLOSED_S, trickle_server
from validator.errors import ConfigError, ExitCode, OperatorError, outcome_of
from validator.outbound.deadline import CallAbandoned, set_stop_event

RUBRICS = {
    1: "Grade it.\nContext: {conversation_context}\nAnswer: {assistant_response}\n"
    '{{"score": <1-10>}}',
    2: "Ref: {reference_response} | {conversation_context} | {assistant_response}",
    3: "{tools} / {conversation_context} / {reference_response} / {assistant_response} {{}}",
}
SYSTEM = "Be a fair judge."
CONTEXT = 'User: what is {x} in {"a": 1}?'  # braces in values stay as they are
FIELDS = {"conversation_context": CONTEXT, "assistant_response": "x is {0}"}


def expected_texts(texts: JudgeTexts) -> None:
    """The three rubrics filled in, against texts written out by hand."""
    assert texts.system == SYSTEM
    assert texts.rubric_text(1, **FIELDS) == (
        'Grade it.\nContext: User: what is {x} in {"a": 1}?\nAnswer: x is {0}\n{"score": <1-10>}'
    )
    assert texts.rubric_text(2, **FIELDS, reference_response="R {}") == (
        'Ref: R {} | User: what is {x} in {"a": 1}? | x is {0}'
    )
    assert texts.rubric_text(3, **FIELDS, reference_response="R", tools="[t]") == (
        '[t] / User: what is {x} in {"a": 1}? / R / x is {0} {}'
    )


@pytest.fixture
def source(tmp_path):
    return write_judge_source(tmp_path / "source", RUBRICS, SYSTEM)


def test_a_served_source_is_parsed_formatted_and_cached(source, tmp_path, caplog):
    cache = tmp_path / "state"
    with JudgeSourceServer(source) as server:
        texts = load_judge_texts(server.url, cache)
        assert sorted(server.requests) == [
            "/validator/modules/llm_judge/__init__.py",
            "/validator/modules/llm_judge/prompt.py",
        ]
    expected_texts(texts)
    assert texts.source == server.url
    # The same text as the file's own function gives (the synthetic file is ours to run).
    module = runpy.run_path(str(source / "validator/modules/llm_judge/prompt.py"))
    assert texts.rubric_text(3, **FIELDS, reference_response="R", tools="[t]") == module[
        "function_call_prompt"
    ](CONTEXT, "R", "[t]", "x is {0}")
    (copy,) = cache.iterdir()  # written atomically: no partial file left beside it
    assert copy.name.startswith(CACHE_PREFIX) and copy.suffix == ".json"

    # The server is down now: the cached copy stands in, with a warning.
    with caplog.at_level(logging.WARNING):
        again = load_judge_texts(server.url, cache, timeout=5)
    expected_texts(again)
    assert "cached in" in again.source and "using the copy cached in" in caplog.text

    # Another source has no copy: one line naming the opt-out, exit 3 by the errors contract.
    other = server.url.replace("/validator/", "/elsewhere/")
    with pytest.raises(OperatorError) as raised:
        load_judge_texts(other, cache, timeout=5)
    message = str(raised.value)
    assert "\n" not in message and "`prompt_source: builtin`" in message
    assert f"cannot fetch {other}prompt.py" in message
    assert outcome_of(raised.value).exit_code == ExitCode.OPERATOR


def test_a_local_checkout_or_its_folder_is_read_in_place(source, tmp_path):
    cache = tmp_path / "state"
    expected_texts(load_judge_texts(str(source), cache))
    expected_texts(load_judge_texts(str(source / "validator/modules/llm_judge"), cache))
    assert not cache.exists()  # nothing to cache for a local source
    with pytest.raises(ConfigError, match=r"prompt_source .*empty: cannot read .*prompt\.py"):
        load_judge_texts(str(tmp_path / "empty"), cache)


def test_a_broken_cache_is_not_used(source, tmp_path, caplog):
    cache = tmp_path / "state"
    with JudgeSourceServer(source) as server:
        load_judge_texts(server.url, cache)
    (copy,) = cache.iterdir()
    copy.write_text('{"source": "x"}')
    with caplog.at_level(logging.WARNING), pytest.raises(OperatorError, match="no copy cached"):
        load_judge_texts(server.url, cache, timeout=5)
    assert "is not usable" in caplog.text


def test_builtin_is_our_own_wording_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        texts = load_judge_texts("builtin", tmp_path)
    assert "scores will not match the network's" in caplog.text
    assert texts == builtin_texts() and texts.rubrics == builtin_rubrics()
    text = texts.rubric_text(2, **FIELDS, reference_response="two")
    assert "<reference>\ntwo\n</reference>" in text
    assert answer_in(text) == "x is {0}"  # where the local judge finds the answer to grade
    direct = texts.rubric_text(1, **FIELDS)
    assert '{"score": <integer 1-10>, "confidence": <number 0-1>' in direct
    assert "{conversation_context}" not in direct and CONTEXT in direct


def test_prompt_files_still_replace_rubrics_with_a_deprecation_warning(tmp_path, caplog):
    mine = tmp_path / "mine.txt"
    mine.write_text("Q: $conversation A: $answer R: $reference {kept} $other")
    with caplog.at_level(logging.WARNING):
        texts = load_judge_texts("builtin", tmp_path, prompt_files={2: str(mine)})
    assert "prompt_files has moved to prompt_source" in caplog.text
    assert texts.rubric_text(2, **FIELDS, reference_response="r") == (
        f"Q: {CONTEXT} A: x is {{0}} R: r {{kept}} $other"
    )
    assert texts.rubric_text(1, **FIELDS) == builtin_texts().rubric_text(1, **FIELDS)
    with pytest.raises(ConfigError, match="rubric prompt 3: /no/such.txt cannot be read"):
        load_judge_texts("builtin", tmp_path, prompt_files={3: "/no/such.txt"})


def test_rubric_text_takes_only_resolved_ids_and_their_fields(source, tmp_path):
    texts = load_judge_texts(str(source), tmp_path)
    with pytest.raises(ValueError, match="no rubric 4"):
        texts.rubric_text(4, **FIELDS)
    with pytest.raises(ValueError, match="rubric 3 needs reference_response, tools"):
        texts.rubric_text(3, **FIELDS)


CALL = (
    "\n\n@register(prompt_id=2)\ndef reference_prompt(context, reference, assistant_response):\n"
    "    evaluation_criteria = open('/etc/hostname').read()\n"
    "    return evaluation_criteria.format(conversation_context=context,"
    " reference_response=reference, assistant_response=assistant_response)\n"
)


@pytest.mark.parametrize(
    ("rubrics", "extra", "problem"),
    [
        ({1: "{conversation_context.__class__} {assistant_response}"}, "", "format field"),
        ({1: "{conversation_context[0]} {assistant_response}"}, "", "format field"),
        ({1: "{conversation_context} {assistant_response!r}"}, "", "format field"),
        ({1: "{conversation_context} {assistant_response:>999999}"}, "", "format field"),
        (
            {1: "{conversation_context} {assistant_response} {tools}"},
            "",
            "field 'tools': only the plain",
        ),
        ({1: "{conversation_context} {assistant_response()}"}, "", "format field"),
        ({1: "{conversation_context} {} {assistant_response}"}, "", "format field"),
        ({1: "{conversation_context} { {assistant_response}"}, "", "not a format string"),
        ({1: "{conversation_context} alone"}, "", "no {assistant_response} field"),
        ({2: None}, CALL, "evaluation_criteria is not a string literal"),
        ({3: None}, "", "no function decorated @register(prompt_id=3)"),
        ({2: None}, CALL.replace("(prompt_id=2)", "(prompt_id=1)"), "a second function"),
        ({1: "x" * (judge_texts.MAX_RUBRIC_CHARS + 1)}, "", "over 65536 characters"),
        ({}, "#" * judge_texts.MAX_FILE_BYTES["prompt.py"], "over 262144 bytes"),
        ({}, "def broken(:\n", "not a Python file (SyntaxError)"),
    ],
)
def test_a_hostile_or_broken_source_is_refused_in_one_line(tmp_path, rubrics, extra, problem):
    texts = {k: v for k, v in {**RUBRICS, **rubrics}.items() if v is not None}
    source = write_judge_source(tmp_path / "source", texts, SYSTEM, prompt_extra=extra)
    cache = tmp_path / "state"
    with JudgeSourceServer(source) as server:
        with pytest.raises(OperatorError) as raised:
            load_judge_texts(server.url, cache)
    assert problem in str(raised.value) and "\n" not in str(raised.value)
    assert not cache.exists()  # nothing refused is cached


def test_the_system_text_must_be_where_the_network_has_it(tmp_path):
    folder = write_judge_source(tmp_path, RUBRICS, SYSTEM) / "validator/modules/llm_judge"
    good = (folder / "prompt.py").read_bytes()
    with pytest.raises(OperatorError, match="0 functions _construct_evaluation_prompt"):
        parse_source_files(good, b"system_prompt = 'x'\n", "here")
    with pytest.raises(OperatorError, match="system_prompt is not a string literal"):
        parse_source_files(
            good, b"def _construct_evaluation_prompt():\n    system_prompt = f'{x}'\n", "here"
        )
    body = b"def _construct_evaluation_prompt():\n    system_prompt = 'Judge.'\n"
    assert parse_source_files(good, body, "here")[1] == "Judge."


def test_parsing_never_runs_the_files(tmp_path):
    marker = tmp_path / "ran"
    effect = f"\nimport pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    source = write_judge_source(
        tmp_path / "source", RUBRICS, SYSTEM, prompt_extra=effect, init_extra=effect
    )
    with JudgeSourceServer(source) as server:
        expected_texts(load_judge_texts(server.url, tmp_path / "state"))
    expected_texts(load_judge_texts(str(source), tmp_path / "state"))
    assert not marker.exists()
    runpy.run_path(str(source / "validator/modules/llm_judge/prompt.py"))  # the marker works
    assert marker.read_text() == "ran"


def test_prompt_source_values_in_the_config():
    def config(**settings) -> LlmJudgeConfig:
        return LlmJudgeConfig(supported_base_models=["b"], **settings)

    assert config().prompt_source == NETWORK_COMMIT
    assert source_location(NETWORK_COMMIT) == (
        "url",
        f"https://raw.githubusercontent.com/FLock-io/FLock-validator/{NETWORK_COMMIT}"
        "/validator/modules/llm_judge/",
    )
    assert source_location("https://mirror.example/llm_judge") == (
        "url",
        "https://mirror.example/llm_judge/",
    )
    assert config(prompt_source=" builtin ").prompt_source == "builtin"
    assert config(prompt_source="http://127.0.0.1:8000/x/").prompt_source
    assert config(prompt_source="/opt/FLock-validator").prompt_source == "/opt/FLock-validator"
    for bad, why in [
        ("http://example.com/x/", "must be https"),
        ("ftp://example.com/x/", "scheme 'ftp'"),
        ("https://example.com/x/?a=1", "no query"),
        ("  ", "empty"),
    ]:
        with pytest.raises(ValidationError, match=why):
            config(prompt_source=bad)
    with pytest.raises(ConfigError, match="prompt_source 'ftp://x'"):
        load_judge_texts("ftp://x", Path("unused"))


def test_a_stop_signal_during_a_trickled_fetch_is_transient_not_an_operator_error(tmp_path):
    # No cache: at its deadline this is exit 3 (above); a stop is the validator leaving, and
    # the module's start is tried again by the next run.
    stop = threading.Event()
    set_stop_event(stop)
    try:
        with trickle_server() as trickle:
            folder = f"{trickle.url}/validator/modules/llm_judge/"
            threading.Timer(0.3, stop.set).start()
            with pytest.raises(CallAbandoned, match="abandoned: stopping") as raised:
                load_judge_texts(folder, tmp_path / "state", timeout=5, deadline=60)
            assert raised.value.stopped
            assert trickle.closed.wait(SEEN_CLOSED_S), "the server never saw the connection closed"
    finally:
        set_stop_event(None)


def test_a_trickled_source_ends_at_its_deadline_and_the_cache_stands_in(tmp_path, caplog):
    # Every read within its timeout, the file never complete: the fetch ends
    # at its overall deadline, as a source that cannot be reached does.
    cache = tmp_path / "state"
    with trickle_server() as trickle:
        folder = f"{trickle.url}/validator/modules/llm_judge/"
        with pytest.raises(OperatorError) as raised:
            load_judge_texts(folder, cache, timeout=5, deadline=1)
        message = str(raised.value)
        assert "not complete within its 1 s deadline" in message and "no copy cached" in message
        assert trickle.closed.wait(SEEN_CLOSED_S), "the server never saw the connection closed"

        judge_texts.write_cache(cache, folder, builtin_texts())
        with caplog.at_level(logging.WARNING):
            cached = load_judge_texts(folder, cache, timeout=5, deadline=1)
    assert cached.rubrics == builtin_texts().rubrics
    assert "using the copy cached in" in caplog.text


def test_trailers_after_a_source_file_are_read_no_further_than_its_limit(tmp_path):
    # An attack on a count of the file's body only: requests (http.client, urllib3) reads a
    # chunked answer's trailer fields with no limit on their number. Read through the bounded
    # reader, trailers count against the file's limit, and past it the failure is the source's.
    trailers = 64 << 20
    with HostileServer(chunked_with_trailers(trailers, b"x = 1\n")) as server:
        folder = f"{server.url}/validator/modules/llm_judge/"
        with pytest.raises(OperatorError, match="judge texts from .*: .* a judge.texts answer"):
            load_judge_texts(folder, tmp_path / "state", timeout=5, deadline=60)
        assert server.cut_off.wait(30), "the client never went away"
    assert server.sent < 16 << 20  # the file's limit and what the socket buffers hold
