"""Ollama's request fields read for the engine and the model pool (sluice/apis/ollama/to_internal.py)."""

from __future__ import annotations

import math

import pytest

from sluice.apis.ollama.to_internal import keep_alive_s
from sluice.errors import InvalidRequestError


@pytest.mark.parametrize(
    ("keep_alive", "seconds"),
    [(None, None), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25), ("1.5h", 5400.0),
     ("0", 0.0), (0, 0.0), ("3600", 3600.0), (3600.5, 3600.5),
     ("-1m", math.inf), (-1, math.inf), ("-1", math.inf)],
)  # fmt: skip
def test_keep_alive_is_seconds_or_a_go_duration_and_negative_means_for_ever(keep_alive, seconds):
    assert keep_alive_s(keep_alive) == seconds


@pytest.mark.parametrize("keep_alive", ["forever", "5 minutes", "m", "1d", "--1s", ""])
def test_a_keep_alive_that_is_no_duration_is_a_400_naming_it(keep_alive):
    with pytest.raises(InvalidRequestError) as refused:
        keep_alive_s(keep_alive)
    assert refused.value.param == "keep_alive"
