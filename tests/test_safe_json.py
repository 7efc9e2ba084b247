import pytest

from validator.outbound.safe_json import JsonRefused, loads_bounded, nesting_depth


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
