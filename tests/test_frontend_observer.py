"""ChunkTimer: each choice's first take is its first token, later takes are reported in batches."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.frontend.observer import CHUNKS_PER_REPORT, REPORT_EVERY_S, ChunkTimer


@dataclass
class Recorder:
    first: list[tuple[float, int]] = field(default_factory=list)
    batches: list[tuple[list[int], list[float]]] = field(default_factory=list)

    def on_first_token(self, ttft_s: float, num_tokens: int) -> None:
        self.first.append((ttft_s, num_tokens))

    def on_chunks(self, num_tokens, gaps_s) -> None:
        self.batches.append((list(num_tokens), list(gaps_s)))

    def on_finish(self, *args) -> None:
        raise AssertionError("the timer never reports finishes")

    def on_abort(self) -> None:
        raise AssertionError("the timer never reports aborts")


def test_the_first_take_is_the_time_to_first_token_and_no_chunk_gap():
    recorder = Recorder()
    timer = ChunkTimer(recorder)
    timer.on_tokens(0, 3, timer.started_s + 0.25)
    timer.report()
    assert recorder.first == [(0.25, 3)]
    assert recorder.batches == []


def test_later_takes_are_reported_in_full_batches_with_their_gaps():
    recorder = Recorder()
    timer = ChunkTimer(recorder)
    start_s = timer.started_s
    timer.on_tokens(0, 1, start_s)
    for i in range(1, CHUNKS_PER_REPORT + 3):
        timer.on_tokens(0, i % 4 + 1, start_s + i * 0.001)
    (batch,) = recorder.batches
    assert len(batch[0]) == CHUNKS_PER_REPORT
    assert all(abs(gap_s - 0.001) < 1e-9 for gap_s in batch[1])
    timer.report()  # the request ended: the rest goes out
    assert [len(num_tokens) for num_tokens, _ in recorder.batches] == [CHUNKS_PER_REPORT, 2]
    timer.report()
    assert len(recorder.batches) == 2  # nothing left to report


def test_a_slow_stream_is_reported_within_the_report_interval():
    recorder = Recorder()
    timer = ChunkTimer(recorder)
    start_s = timer.started_s
    timer.on_tokens(0, 1, start_s)
    timer.on_tokens(0, 1, start_s + 0.1)
    assert recorder.batches == []  # waits for more
    timer.on_tokens(0, 2, start_s + 0.1 + REPORT_EVERY_S)
    ((num_tokens, gaps_s),) = recorder.batches
    assert num_tokens == [1, 2]
    assert abs(gaps_s[0] - 0.1) < 1e-9 and abs(gaps_s[1] - REPORT_EVERY_S) < 1e-9


def test_each_choice_has_its_own_first_token_and_its_own_gaps():
    recorder = Recorder()
    timer = ChunkTimer(recorder)
    start_s = timer.started_s
    for step in range(3):  # two choices, one token each per take, 0.1 s apart
        for index in (0, 1):
            timer.on_tokens(index, 1, start_s + 0.1 * (step + 1))
    timer.report()
    assert [round(ttft_s, 6) for ttft_s, _ in recorder.first] == [0.1, 0.1]
    ((num_tokens, gaps_s),) = recorder.batches
    assert num_tokens == [1, 1, 1, 1]
    assert all(abs(gap_s - 0.1) < 1e-9 for gap_s in gaps_s)  # not 0.1 / 2 choices
