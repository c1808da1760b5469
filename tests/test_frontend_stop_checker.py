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


# -- text no match may end in (min_tokens, a finishing stop token) ------------------


def run_flagged(
    pieces: list[tuple[str, bool]], stops: tuple[str, ...], *, include: bool = False
) -> list[StopRelease[int]]:
    """`run` with a `may_match` flag per piece."""
    checker: StopChecker[int] = StopChecker(stops, include_stop_str_in_output=include)
    releases = []
    for number, (piece, may_match) in enumerate(pieces):
        releases.append(checker.push(piece, number, may_match=may_match))
        if releases[-1].stop_string is not None:
            return releases
    releases.append(checker.flush())
    return releases


def test_a_match_ending_in_unsearched_text_is_not_a_stop():
    releases = run_flagged([("a.b", False), ("c", True), (".d", True)], (".",))
    assert texts(releases) == ["a.b", "c", ""]
    assert releases[-1].stop_string == "."


def test_a_match_may_start_in_unsearched_text_and_end_in_searched_text():
    releases = run_flagged([("x", True), ("ab", False), ("cd", True)], ("abc",))
    assert texts(releases) == ["x", "", ""]
    assert (releases[-1].stop_string, releases[-1].payloads) == ("abc", [1, 2])


def test_unsearched_text_is_still_held_while_it_could_begin_a_stop_string():
    releases = run_flagged([("xa", False), ("b", False), ("y", True)], ("abc",))
    assert texts(releases) == ["", "", "xaby", ""]
    assert releases[-1].stop_string is None


def test_a_stop_string_completed_only_in_unsearched_text_never_matches():
    releases = run_flagged([("xSTO", True), ("P", False)], ("STOP",), include=True)
    assert texts(releases) == ["xSTO", "P", ""]
    assert releases[-1].stop_string is None


def flagged_reference(
    pieces: list[tuple[str, bool]], stops: tuple[str, ...], include: bool
) -> tuple[str, str | None]:
    """The whole-text answer among matches that end inside a searchable piece."""
    text = "".join(piece for piece, _ in pieces)
    searchable_ends: set[int] = set()
    offset = 0
    for piece, may_match in pieces:
        if may_match:
            searchable_ends.update(range(offset + 1, offset + len(piece) + 1))
        offset += len(piece)
    best = None
    for stop in stops:
        start = text.find(stop)
        while start >= 0:
            end = start + len(stop)
            if end in searchable_ends:
                if best is None or (end, start) < (best[1], best[0]):
                    best = (start, end, stop)
                break
            start = text.find(stop, start + 1)
    if best is None:
        return text, None
    return text[: best[1] if include else best[0]], best[2]


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(
        st.tuples(st.text("abc", min_size=1, max_size=4), st.booleans()), min_size=1, max_size=10
    ),
    stops=st.lists(st.text("abc", min_size=1, max_size=4), max_size=3).map(tuple),
    include=st.booleans(),
)
def test_any_split_and_flags_give_the_whole_text_answer(pieces, stops, include):
    releases = run_flagged(pieces, stops, include=include)
    released = "".join(texts(releases))
    assert (released, releases[-1].stop_string) == flagged_reference(pieces, stops, include)
    payloads = [p for release in releases for p in release.payloads]
    assert payloads == list(range(len(payloads))), "pieces leave whole and in order"


# -- work per piece: the new text plus the longest stop string, not the held text ----


class CountingStop(str):
    """A stop string that counts the characters read out of it."""

    counter: list[int]

    def __getitem__(self, key):  # type: ignore[override]
        item = super().__getitem__(key)
        self.counter[0] += len(item)
        return item


def counting_stops(texts: list[str]) -> tuple[tuple[CountingStop, ...], list[int]]:
    counter = [0]
    stops = []
    for text in texts:
        stop = CountingStop(text)
        stop.counter = counter
        stops.append(stop)
    return tuple(stops), counter


def test_a_breaking_piece_after_long_held_prefixes_reads_each_stop_string_a_bounded_number_of_times():
    # 16 stop strings of 5,000 characters whose 4,999-character prefix is held.
    length = 5_000
    stops, counter = counting_stops(["a" * (length - 1) + chr(ord("A") + i) for i in range(16)])
    checker: StopChecker[int] = StopChecker(stops, include_stop_str_in_output=False)
    for number in range(length - 1):
        assert checker.push("a", number).text == ""
    counter[0] = 0
    release = checker.push("z", length)
    assert len(release.text) == length and release.stop_string is None
    # The old checker tried every held suffix: about 16 * length**2 / 2 characters.
    assert counter[0] <= 2 * len(stops) * (length + 1)


def test_pushing_a_long_held_prefix_piece_by_piece_reads_the_stop_string_linearly():
    length = 10_000
    stops, counter = counting_stops(["a" * length])
    checker: StopChecker[int] = StopChecker(stops, include_stop_str_in_output=False)
    counter[0] = 0
    for number in range(length - 1):
        assert checker.push("a", number).text == ""
    release = checker.push("a", length)
    assert release.stop_string == "a" * length
    # Amortized: a constant number of reads per character pushed, not one per held character.
    assert counter[0] <= 4 * length
