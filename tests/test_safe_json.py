import tracemalloc

import pytest

from validator.errors import AnswerTooLarge
from validator.outbound.answer_caps import ANSWER_CAPS, check_values
from validator.outbound.bounded_reader import parse
from validator.outbound.safe_json import JsonRefused, loads_bounded, nesting_depth, value_count


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("1", 0),
        ('{"a": [1, {"b": []}]}', 4),
        ('["[[[[", "]]]", {"x": "{{{"}]', 2),  # brackets inside strings do not count
        (r'["a \" [[[ \\", [[]]]', 3),  # nor after an escaped quote
    ],
)
def test_nesting_depth_counts_structure_only(text, depth):
    assert nesting_depth(text) == depth


def test_deep_nesting_is_refused_not_a_recursion_error():
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(JsonRefused, match="adapter_config.json: nests deeper than 64 levels"):
        loads_bounded(deep, "adapter_config.json")
    value = loads_bounded("[" * 64 + "]" * 64, "x")  # the limit itself is allowed
    for _ in range(63):
        (value,) = value
    assert value == []


def test_size_encoding_and_syntax_errors_name_the_file():
    with pytest.raises(JsonRefused, match=r"cfg: 30 bytes, over the limit of 20"):
        loads_bounded('{"a": "' + "x" * 21 + '"}', "cfg", max_bytes=20)
    with pytest.raises(JsonRefused, match="cfg: not UTF-8"):
        loads_bounded(b'{"a": "\xff"}', "cfg", max_bytes=100)
    with pytest.raises(JsonRefused, match="cfg: not valid JSON"):
        loads_bounded("{nope", "cfg")
    assert loads_bounded('{"é": 1}'.encode(), "cfg", max_bytes=100) == {"é": 1}


@pytest.mark.parametrize("text", ["{" * 70, "see {{{{" + "[" * 80 + " later", "[" * 70 + "x"])
def test_text_that_is_not_json_is_said_so_however_many_brackets_it_holds(text):
    # A function_call turn whose text is not JSON is plain text to the network (its json.loads
    # fails at the first bad character); the depth refusal is for JSON that nests too deep.
    with pytest.raises(JsonRefused, match="cfg: not valid JSON"):
        loads_bounded(text, "cfg")


def test_text_the_decoder_cannot_finish_for_depth_is_refused_for_depth():
    # The decoder recurses into 5,000 open brackets before it meets the end: a RecursionError
    # there (the network raises on it too), refused here for its depth.
    with pytest.raises(JsonRefused, match="cfg: nests deeper than 64 levels"):
        loads_bounded("[" * 5000, "cfg")


@pytest.mark.parametrize(
    "piece",
    [b'ab"', b'""', b'",', b"]", b"\\\\"],
    ids=["ab-quote", "quotes", "quote-comma", "closers", "escapes"],
)
def test_counting_json_values_costs_little_memory_whatever_the_text(piece):
    # A count that splits the whole text on its quotes, an object per piece, takes 89 MiB for a
    # 4 MiB listing of `ab"ab"...` (and 1.2 s holding the interpreter), `""` 53 MiB, `",`
    # 28 MiB, before anything is refused. bench/answer_caps.py measures the time.
    cap = ANSWER_CAPS["hub.listing"]
    text = piece * (cap.max_bytes // len(piece))
    tracemalloc.start()
    try:
        try:
            check_values(text, cap, "a hostile listing")
        except Exception:  # noqa: BLE001 - refused or not, its cost is what is measured
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(text), f"{peak / (1 << 20):.1f} MiB to count {len(text)} bytes"


def test_values_are_counted_alike_in_text_and_bytes_across_windows():
    # Quotes are paired a window (64 KiB) at a time: a string that spans windows holds no values.
    text = '[1, "' + "a,[{" * 50_000 + '", {"b": [2, 3]}, "x\\\\", "y\\"z"]'
    assert len(loads_bounded(text, "x")) == 5
    assert value_count(text) == value_count(text.encode()) == 9
    assert nesting_depth(text) == 3


def test_an_integer_past_pythons_digit_limit_is_refused_as_json():
    # Not a plain ValueError ("Exceeds the limit (4300 digits)"), which passes the callers that
    # catch JsonRefused (a base model's shard index: "an unexpected error in the module").
    body = b'{"weight_map": {"a": ' + b"9" * 5000 + b"}}"
    with pytest.raises(JsonRefused, match="index: cannot be decoded: Exceeds the limit"):
        parse(body, ANSWER_CAPS["hub.listing"], "index")


def test_an_answer_holding_a_lone_surrogate_is_refused_and_a_pair_is_not():
    # A lookup's id of "\ud800" (valid JSON) would crash the journal's INSERT.
    cap = ANSWER_CAPS["ledger.lookup"]
    for lone in (b'{"id": "\\ud800"}', b'{"\\uDC00": 1}', b'["a\\udbff"]'):
        with pytest.raises(JsonRefused, match="holds text that is not Unicode"):
            parse(lone, cap, "a lookup")
        assert loads_bounded(lone, "a file") is not None  # only where asked
    assert parse(b'["\\ud83d\\ude00", "\\\\ud800"]', cap, "x") == ["\U0001f600", "\\ud800"]


def test_an_answer_nested_deeper_than_any_may_be_is_past_its_cap():
    """What a library parses itself (huggingface_hub's `.json()`) is measured first: 20,000
    levels were a RecursionError there. Brackets inside strings are no nesting."""
    cap = ANSWER_CAPS["hub.listing"]
    with pytest.raises(AnswerTooLarge, match="nests deeper than the 64 levels any answer may"):
        check_values(b"[" * 20_000 + b"]" * 20_000, cap, "a listing")
    with pytest.raises(AnswerTooLarge, match="nests deeper"):
        check_values(b'{"a":' * 65 + b"1" + b"}" * 65, cap, "a listing")
    check_values(b"[" * 64 + b"]" * 64, cap, "a listing")
    check_values(b'["' + b"[" * 10_000 + b'"]', cap, "a listing")
    check_values(b"[" + b"[[]]," * 20_000 + b"[]]", cap, "a listing")
