"""Stop strings: shortest hold-back, earliest match, nothing ever retracted."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.frontend.stop_checker import StopChecker, StopRelease


def run(
    pieces: list[str], stops: tuple[str, ...], *, include: bool = False, flush: bool = True
) -> list[StopRelease[int]]:
    """Push `pieces` (payload = piece number) until a match; flush if none."""
    checker: StopChecker[int] = StopChecker(stops, include_stop_str_in_output=include)
    releases = []
    for number, piece in enumerate(pieces):
        releases.append(checker.push(piece, number))
        if releases[-1].stop_string is not None:
            return releases
    if flush:
        releases.append(checker.flush())
    return releases


def texts(releases: list[StopRelease[int]]) -> list[str]:
    return [release.text for release in releases]


def test_without_stop_strings_every_piece_leaves_at_once():
    releases = run(["a", "b"], ())
    assert texts(releases) == ["a", "b", ""]
    assert [r.payloads for r in releases] == [[0], [1], []]


def test_a_stop_string_spanning_pieces_is_held_then_trimmed():
    releases = run(["Hello ", "wo", "r", "ld and more"], ("world",))
    assert texts(releases) == ["Hello ", "", "", ""]
    assert releases[-1].stop_string == "world"
    assert [r.payloads for r in releases] == [[0], [], [], [1, 2, 3]]


def test_a_piece_is_held_whole_when_its_end_could_begin_a_stop_string():
    releases = run(["Hello wo", "rk"], ("world",))
    assert texts(releases) == ["", "Hello work", ""]
    assert [r.payloads for r in releases] == [[], [0, 1], []]


def test_only_a_suffix_that_can_begin_a_stop_string_is_held():
    releases = run(["ab", "cx", "yz"], ("cxq",), flush=False)
    assert texts(releases) == ["ab", "", "cxyz"]
    assert [r.payloads for r in releases] == [[0], [], [1, 2]]


def test_a_match_in_the_first_piece_releases_only_the_text_before_it():
    releases = run(["xSTOPy"], ("STOP",))
    assert texts(releases) == ["x"]
    assert releases[0].payloads == [0]
    assert releases[0].stop_string == "STOP"


def test_include_stop_str_in_output_keeps_the_match_and_drops_what_follows():
    releases = run(["Hello wo", "rld and more"], ("world",), include=True)
    assert texts(releases) == ["Hello wo", "rld"]
    assert releases[-1].stop_string == "world"


def test_include_stop_str_in_output_holds_nothing_back():
    releases = run(["abc", "d"], ("cde",), include=True)
    assert texts(releases) == ["abc", "d", ""]


def test_the_match_ending_first_wins_among_several_stop_strings():
    releases = run(["xabcd"], ("bcd", "abc"))
    assert releases[0].stop_string == "abc"
    assert releases[0].text == "x"


def test_on_a_tie_the_longer_overlapping_stop_string_wins():
    releases = run(["xabc"], ("bc", "abc"))
    assert (releases[0].stop_string, releases[0].text) == ("abc", "x")


def test_overlapping_candidates_hold_the_longest_possible_start():
    releases = run(["a", "a", "b", "a", "c"], ("aba", "abac"), flush=False)
    assert texts(releases) == ["", "a", "", ""]
    assert releases[-1].stop_string == "aba"
    assert releases[-1].payloads == [1, 2, 3]


def test_held_text_is_flushed_when_generation_ends_without_a_match():
    releases = run(["Hello ", "wor"], ("world",))
    assert texts(releases) == ["Hello ", "", "wor"]
    assert releases[-1].stop_string is None
    assert releases[-1].payloads == [1]


def test_empty_stop_strings_are_ignored():
    assert texts(run(["ab"], ("",))) == ["ab", ""]


def reference(text: str, stops: tuple[str, ...], include: bool) -> tuple[str, str | None]:
    """What the whole text gives: cut at the match that ends first (longest on a tie)."""
    best = None
    for stop in stops:
        start = text.find(stop)
        if start >= 0 and (best is None or (start + len(stop), start) < (best[1], best[0])):
            best = (start, start + len(stop), stop)
    if best is None:
        return text, None
    return text[: best[1] if include else best[0]], best[2]


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(st.text("abc", min_size=1, max_size=4), min_size=1, max_size=10),
    stops=st.lists(st.text("abc", min_size=1, max_size=4), max_size=3).map(tuple),
    include=st.booleans(),
)
def test_any_split_gives_the_whole_text_answer_and_never_retracts(pieces, stops, include):
    releases = run(pieces, stops, include=include)
    released = "".join(texts(releases))
    assert (released, releases[-1].stop_string) == reference("".join(pieces), stops, include)
    payloads = [p for release in releases for p in release.payloads]
    assert payloads == list(range(len(payloads))), "pieces leave whole and in order"
    sent = ""
    for release in releases[:-1] if releases[-1].stop_string else releases:
        sent += release.text
        assert not any(stop in sent for stop in stops) or include
