"""A call object read as its text grows: the same name, arguments and scan as
one read whole, at every prefix."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.tools.call_object import CallObject
from sluice.tools.json_scan import Scan, Status

PIECES = st.sampled_from(
    ['"name"', '"arguments"', '"parameters"', '"f"', '"x"', ": ", ":", ", ", ",", "{", "}", "[",
     "]", '{"a": 1}', '"', "\\", "\\ud83d", "1", "tru", "e", " ", "\n", "é", "}}"]
)  # fmt: skip
CALL_TEXTS = st.lists(PIECES, max_size=16).map(lambda pieces: "{" + "".join(pieces))


def read(call: CallObject, text: str) -> tuple:
    scan = call.advance(text)
    return scan, call.name, call.arguments_from(text, False, 0), call.is_complete


@given(CALL_TEXTS, st.data())
def test_a_call_read_as_it_grows_reads_as_a_fresh_one_at_every_prefix(text, data):
    cuts = sorted(data.draw(st.sets(st.integers(1, len(text)), max_size=8)) | {len(text)})
    growing = CallObject(0)
    for cut in cuts:
        assert read(growing, text[:cut]) == read(CallObject(0), text[:cut]), text[:cut]


def test_the_name_and_arguments_are_read_and_other_members_skipped():
    text = '{"id": [1, {"x": "}"}], "name": "get_weather", "arguments": {"city": "Oslo"}} tail'
    call = CallObject(0)
    assert call.advance(text) == Scan(Status.COMPLETE, len(text) - 5)
    assert call.name == "get_weather"
    assert call.arguments_from(text, False, 0) == '{"city": "Oslo"}'
    assert call.arguments_from(text, False, 9) == '"Oslo"}'


def test_a_lone_surrogate_in_the_name_becomes_u_fffd():
    call = CallObject(0)
    call.advance('{"name": "get_weather\\ud83d", "parameters": {}}')
    assert call.name == "get_weather\ufffd"


def test_a_name_that_is_no_string_breaks_the_object():
    assert CallObject(0).advance('{"name": 42}') == Scan(Status.INVALID, 9)
