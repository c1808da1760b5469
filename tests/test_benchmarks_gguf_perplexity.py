"""benchmarks/gguf_perplexity.py scores what llama-perplexity scores."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import gguf_perplexity  # noqa: E402


def test_chunks_are_whole_windows_each_opened_by_bos():
    ids = list(range(10, 31))  # 21 tokens: two whole windows of 8, the rest dropped
    assert gguf_perplexity.chunks(ids, 8, bos=1) == [[1, *range(11, 18)], [1, *range(19, 26)]]
    assert gguf_perplexity.chunks(ids, 8, bos=None)[1] == list(range(18, 26))


class _Uniform:
    """A stand-in model: token_logprobs gives every scored token log(1/4)."""


def test_only_the_second_half_of_each_window_is_scored(monkeypatch):
    scored: list[int] = []

    def token_logprobs(model, window, step):
        logprobs = [math.log(0.25)] * (len(window) - 1)
        scored.append(len(logprobs[len(window) // 2 :]))
        return logprobs

    monkeypatch.setattr(gguf_perplexity, "token_logprobs", token_logprobs)
    windows = [[1] * 8, [1] * 8]
    assert math.isclose(gguf_perplexity.sluice_perplexity(_Uniform(), windows, 8), 4.0)
    # llama-perplexity scores tokens first + 1 .. ctx - 1: 3 of a window of 8.
    assert scored == [3, 3]
