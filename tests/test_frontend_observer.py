"""ChunkTimer: the first take is the first token, later takes are reported in batches."""

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
    timer.on_tokens(3, timer.started_s + 0.25)
    timer.report()
    assert recorder.first == [(0.25, 3)]
    assert recorder.batches == []


def test_later_takes_are_reported_in_full_batches_with_their_gaps():
    recorder = Recorder()
    timer = ChunkTimer(recorder)
    start_s = timer.started_s
    timer.on_tokens(1, start_s)
    for i in range(1, CHUNKS_PER_REPORT + 3):
        timer.on_tokens(i % 4 + 1, start_s + i * 0.001)
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
    timer.on_tokens(1, start_s)
    timer.on_tokens(1, start_s + 0.1)
    assert recorder.batches == []  # waits for more
    timer.on_tokens(2, start_s + 0.1 + REPORT_EVERY_S)
    ((num_tokens, gaps_s),) = recorder.batches
    assert num_tokens == [1, 2]
    assert abs(gaps_s[0] - 0.1) < 1e-9 and abs(gaps_s[1] - REPORT_EVERY_S) < 1e-9
