"""Where W8A8 starts on a CPU with AMX: the race at load (sluice/models/int8_threshold.py).

- `race_min_rows` returns the fewest row counts down to which W8A8 kept
  winning (largest first), stops at its first loss, counts a tie as a loss,
  compares medians (one slow run does not decide), and says NEVER when W8A8
  lost at the largest count; the clock is injected, so no test here depends
  on this machine's speed;
- a raced model serves W8A8 from the raced rows (never below a layer's own
  threshold), the dense path below; a lost race drops every W8A8 layer and
  the model's activation mode; the real race runs end to end on a tiny model;
- the loader races only on a bfloat16 model on a CPU with AMX-BF16, and the
  startup reason says the outcome.
"""

from __future__ import annotations

import sys

import pytest
import torch

from sluice.loader import choices, load_model
from sluice.models import calibration, int8_threshold
from sluice.models.int8_activations import MIN_INT8_ACTIVATION_TOKENS, MIN_PACKED_INT8_TOKENS
from sluice.models.int8_threshold import NEVER, RACE_ROWS, race_min_rows
from sluice.models.llama import LlamaForCausalLM


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def race(dense_cost, w8a8_cost, **kwargs) -> int:
    """race_min_rows over two paths that cost `*_cost(n)` seconds of a fake clock."""
    clock = FakeClock()

    def dense(n):
        clock.now += dense_cost(n)

    def w8a8(n):
        clock.now += w8a8_cost(n)

    return race_min_rows(dense, w8a8, clock=clock, **kwargs)


def test_the_race_returns_the_fewest_rows_down_to_which_w8a8_kept_winning():
    # W8A8 wins where 5 n + 300 < 10 n: from 61 rows on, so 64 of the grid.
    assert race(lambda n: 10 * n, lambda n: 5 * n + 300) == 64
    assert race(lambda n: 10 * n, lambda n: 5 * n) == RACE_ROWS[-1]
    assert race(lambda n: 5 * n, lambda n: 10 * n) == NEVER == sys.maxsize
    # A tie is a loss: W8A8 must be faster to serve.
    assert race(lambda n: 10 * n, lambda n: 10 * n) == NEVER


def test_the_race_stops_at_the_first_loss():
    # W8A8 wins at 512 and 256, loses at 128, would win again at 64.
    w8a8 = {512: 1, 256: 1, 128: 9, 64: 1, 32: 1, 16: 1, 8: 1, 4: 1}
    assert race(lambda n: 5, lambda n: w8a8[n]) == 256


def test_the_race_compares_medians_so_one_slow_run_does_not_decide():
    runs = iter([1.0, 100.0])  # a warm-up, then one slow timed run of 7; the rest cost 1

    def w8a8(n):
        return next(runs, 1.0)

    # Medians 1 against 2: W8A8 wins at both counts (the mean, 15, would lose at 512).
    assert race(lambda n: 2.0, w8a8, rows=(512, 256)) == 256
    calls = []
    clock = FakeClock()
    race_min_rows(lambda n: calls.append(("dense", n)), lambda n: calls.append(("w8a8", n)),
                  rows=(8,), repeats=3, clock=clock)  # fmt: skip
    # One warm-up of each, then the paths alternate.
    assert [name for name, _ in calls] == ["dense", "w8a8"] * 4


@pytest.fixture
def bf16_model(tiny_loaded, tiny_llama) -> LlamaForCausalLM:
    model = LlamaForCausalLM(tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"))
    model.load_weights(tiny_llama.weights())
    return model


def w8a8_targets(model: LlamaForCausalLM):
    names = calibration.INT8_ACTIVATION_MATRICES
    return [getattr(layer, name) for layer in model.layers for name in names]


def test_a_raced_model_serves_w8a8_from_the_raced_rows(bf16_model, monkeypatch):
    raced = []

    def fake_race(dense, w8a8, **kwargs):
        dense(8), w8a8(8)  # the race's two paths run on the model's matrices
        raced.append(True)
        return 16

    monkeypatch.setattr(int8_threshold, "race_min_rows", fake_race)
    rows = calibration.quantize_activations(bf16_model, list(range(3, 60)), None, True)
    assert raced and bf16_model.activation_quantization == "int8"
    for linear in w8a8_targets(bf16_model):
        # Never below the layer's own threshold (40 rows through _int_mm).
        own = (
            MIN_PACKED_INT8_TOKENS
            if linear.int8_activations.packed is not None
            else MIN_INT8_ACTIVATION_TOKENS
        )
        assert linear.min_large_rows == max(16, own) == rows
    qkv = bf16_model.layers[0].qkv_proj
    x = torch.randn(rows, bf16_model.config.hidden_size).bfloat16()
    assert torch.equal(qkv(x), qkv.int8_activations(x))
    assert torch.equal(qkv(x[:-1]), qkv.dense_matmul(x[:-1]))


def test_a_lost_race_drops_w8a8(bf16_model, monkeypatch):
    monkeypatch.setattr(int8_threshold, "race_min_rows", lambda dense, w8a8, **kw: NEVER)
    rows = calibration.quantize_activations(bf16_model, list(range(3, 60)), None, True)
    assert rows == NEVER and bf16_model.activation_quantization is None
    assert all(linear.int8_activations is None for linear in w8a8_targets(bf16_model))
    qkv = bf16_model.layers[0].qkv_proj
    x = torch.randn(64, bf16_model.config.hidden_size).bfloat16()
    assert torch.equal(qkv(x), qkv.dense_matmul(x))


def test_the_real_race_runs_and_every_matrix_takes_its_outcome(bf16_model):
    rows = calibration.quantize_activations(bf16_model, list(range(3, 60)), None, True)
    # Which path wins depends on this CPU; that all agree on it does not.
    assert rows in (*RACE_ROWS, MIN_INT8_ACTIVATION_TOKENS, NEVER)
    assert {linear.min_large_rows for linear in w8a8_targets(bf16_model)} == {rows}


def test_the_loader_races_only_on_a_bfloat16_model_with_amx(tmp_path, monkeypatch):
    from tests.model_factory import build_tiny_model, write_tiny_tokenizer

    folder = tmp_path / "tiny-llama"
    build_tiny_model("llama_tied", folder)
    write_tiny_tokenizer(folder)
    outcome = {"rows": 16}
    raced = []

    def fake_race(dense, w8a8, **kwargs):
        raced.append(True)
        return outcome["rows"]

    monkeypatch.setattr(int8_threshold, "race_min_rows", fake_race)

    def load(flags, dtype="bfloat16"):
        monkeypatch.setattr(choices, "cpu_flags", lambda: frozenset(flags))
        return load_model(choices_config(folder, dtype))

    loaded = load({"avx512_vnni", "avx512_bf16"})
    assert not raced and "raced" not in loaded.choices.reason
    loaded = load({"avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"})
    assert raced and loaded.choices.activations == "int8"
    assert "from 16 rows: raced against AMX at load" in loaded.choices.reason
    outcome["rows"] = NEVER
    loaded = load({"avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"})
    assert loaded.choices.activations is None and loaded.model.activation_quantization is None
    assert "int8 activations off: they lost to AMX bfloat16 at load" in loaded.choices.reason
    raced.clear()
    load({"avx512_vnni", "amx_bf16", "amx_int8"}, dtype="float32")
    assert not raced


def choices_config(folder, dtype):
    from sluice.config import ModelConfig

    return ModelConfig(model=str(folder), cache_dir=folder.parent / "cache", dtype=dtype,
                       quantization="int4", activation_quantization="int8")  # fmt: skip
