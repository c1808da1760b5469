"""In which bands of rows W8A8 serves a step on a CPU with AMX: the race at
load (sluice/models/int8_threshold.py).

- `race_bands` times every band (no monotonicity assumed) on an injected
  clock, so no test here depends on this machine's speed, and chooses per
  band for each CPU's shape of results: AMX (bfloat16 wins the large blocks,
  W8A8 the small: the ratios measured on a Sapphire Rapids), VNNI only (Zen 4,
  a Xeon hiding AMX: W8A8 wins from 4 rows up), a middle band, bands apart;
  a tie is a loss, medians decide (one slow run does not);
- a raced model serves W8A8 in the raced bands only (never below a layer's
  own threshold), weight-only int4 or the dense path elsewhere; a race lost
  in every band drops every W8A8 layer and the model's activation mode; the
  real race runs end to end on a tiny model; the bands are kept in the plan
  cache (plan_cache.py), read back by the next load, and damaged ones are
  raced again;
- the loader races only on a bfloat16 model on a CPU with AMX-BF16, and the
  startup reason says what the race chose, and nothing the race overruled.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from sluice.loader import choices, load_model
from sluice.models import calibration, int8_threshold
from sluice.models.execution_plan import ExecutionPlan
from sluice.models.int8_activations import MIN_INT8_ACTIVATION_TOKENS, MIN_PACKED_INT8_TOKENS
from sluice.models.int8_threshold import RACE_ROWS, describe_bands, race_bands
from sluice.models.linear import RowBands, bands_from
from sluice.models.llama import LlamaForCausalLM
from sluice.models.plan_apply import apply
from sluice.models.plan_cache import AUTO, PlanStore

EVERY_STEP = sys.maxsize
# W8A8 / bfloat16 time per band on a Sapphire Rapids with AMX (issue 27).
AMX_RATIOS = {512: 1.86, 256: 1.66, 128: 1.45, 64: 1.01, 32: 0.91, 16: 0.81, 8: 0.63, 4: 0.57}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def race(dense_cost, w8a8_cost, **kwargs):
    """race_bands over two paths that cost `*_cost(n)` seconds of a fake clock."""
    clock = FakeClock()

    def dense(n):
        clock.now += dense_cost(n)

    def w8a8(n):
        clock.now += w8a8_cost(n)

    return race_bands(dense, w8a8, clock=clock, **kwargs)


def by_ratio(ratios):
    """Costs whose W8A8 / bfloat16 ratio in each band is `ratios[n]`."""
    return (lambda n: 1e-3 * n), (lambda n: 1e-3 * n * ratios[n])


def test_on_amx_w8a8_serves_the_small_bands_it_wins_though_it_loses_the_large():
    # The first race stopped at its loss at 512 rows and turned W8A8 off.
    assert race(*by_ratio(AMX_RATIOS)) == (range(4, 64),)


def test_with_vnni_only_w8a8_serves_every_step_from_4_rows():
    zen4 = dict.fromkeys(RACE_ROWS, 0.8)
    assert race(*by_ratio(zen4)) == (range(4, EVERY_STEP),)


def test_a_middle_band_and_bands_apart_are_served_as_won():
    middle = {4: 1.1, 8: 1.05, 16: 0.9, 32: 0.8, 64: 0.95, 128: 1.2, 256: 1.4, 512: 1.6}
    assert race(*by_ratio(middle)) == (range(16, 128),)
    apart = {4: 1.2, 8: 0.9, 16: 1.1, 32: 0.9, 64: 0.9, 128: 0.9, 256: 0.9, 512: 0.8}
    assert race(*by_ratio(apart)) == (range(8, 16), range(32, EVERY_STEP))
    assert describe_bands((range(8, 16), range(32, EVERY_STEP))) == "8-15 and 32+ rows"


def test_every_band_is_timed_and_a_tie_is_a_loss():
    calls = []
    race(lambda n: calls.append(n) or 5, lambda n: 9 if n == 512 else 1)
    assert sorted(set(calls)) == sorted(RACE_ROWS)  # none skipped after a loss
    assert race(lambda n: 10 * n, lambda n: 10 * n) == ()


def test_the_race_compares_medians_so_one_slow_run_does_not_decide():
    runs = iter([1.0, 100.0])  # a warm-up, then one slow timed run of 7; the rest cost 1

    def w8a8(n):
        return next(runs, 1.0)

    # Medians 1 against 2: W8A8 wins both bands (the mean, 15, would lose at 256).
    assert race(lambda n: 2.0, w8a8, rows=(256, 512)) == (range(256, EVERY_STEP),)
    calls = []
    clock = FakeClock()
    race_bands(lambda n: calls.append(("dense", n)), lambda n: calls.append(("w8a8", n)),
               rows=(8,), repeats=3, clock=clock)  # fmt: skip
    # One warm-up of each, then the paths alternate.
    assert [name for name, _ in calls] == ["dense", "w8a8"] * 4


@pytest.fixture
def bf16_model(tiny_loaded, tiny_llama) -> LlamaForCausalLM:
    model = LlamaForCausalLM(tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"))
    model.load_weights(tiny_llama.weights())
    return model


def race_and_apply(model: LlamaForCausalLM) -> RowBands:
    """W8A8 from its threshold, raced, and the plan holding the bands applied."""
    calibration.quantize_activations(model, list(range(3, 60)))
    bands = calibration.race_w8a8(model)
    apply(model, ExecutionPlan(None, bands))
    return bands


def w8a8_targets(model: LlamaForCausalLM):
    names = calibration.INT8_ACTIVATION_MATRICES
    return [getattr(layer, name) for layer in model.layers for name in names]


def test_a_raced_model_serves_w8a8_in_the_raced_bands_only(bf16_model, monkeypatch):
    raced = []
    bands = (range(4, 16), range(64, EVERY_STEP))

    def fake_race(dense, w8a8, **kwargs):
        dense(8), w8a8(8)  # the race's two paths run on the model's matrices
        raced.append(True)
        return bands

    monkeypatch.setattr(int8_threshold, "race_bands", fake_race)
    bf16_model.quantize("int4")
    served = race_and_apply(bf16_model)
    assert raced and bf16_model.activation_quantization == "int8"
    qkv = bf16_model.layers[0].qkv_proj
    # Never below the layer's own threshold (40 rows through _int_mm).
    own = qkv.int8_activations.min_rows
    assert own in (MIN_PACKED_INT8_TOKENS, MIN_INT8_ACTIVATION_TOKENS)
    expected = bands if own == MIN_PACKED_INT8_TOKENS else (range(64, EVERY_STEP),)
    assert served == expected
    assert {linear.int8_row_bands for linear in w8a8_targets(bf16_model)} == {expected}
    int4 = qkv.quantized.matmul_for(torch.bfloat16)
    for rows in (1, 3, 4, 8, 15, 16, 40, 63, 64, 100):
        x = torch.randn(rows, bf16_model.config.hidden_size).bfloat16()
        if any(rows in band for band in expected):
            path = qkv.int8_activations
        elif rows <= qkv.max_quantized_tokens:
            path = int4
        else:
            path = qkv.dense_matmul
        assert torch.equal(qkv(x), path(x)), rows


def test_the_race_gives_the_plan_its_bands_and_rebinds_nothing(bf16_model, monkeypatch):
    monkeypatch.setattr(int8_threshold, "race_bands", lambda dense, w8a8, **kw: (range(8, 16),))
    calibration.quantize_activations(bf16_model, list(range(3, 60)))
    own = {linear.int8_row_bands for linear in w8a8_targets(bf16_model)}
    assert calibration.race_w8a8(bf16_model) == bands_from((range(8, 16),), min(own)[0].start)
    assert {linear.int8_row_bands for linear in w8a8_targets(bf16_model)} == own


def test_a_race_lost_in_every_band_drops_w8a8(bf16_model, monkeypatch):
    monkeypatch.setattr(int8_threshold, "race_bands", lambda dense, w8a8, **kw: ())
    served = race_and_apply(bf16_model)
    assert served == () and bf16_model.activation_quantization is None
    assert all(linear.int8_activations is None for linear in w8a8_targets(bf16_model))
    qkv = bf16_model.layers[0].qkv_proj
    x = torch.randn(64, bf16_model.config.hidden_size).bfloat16()
    assert torch.equal(qkv(x), qkv.dense_matmul(x))


def test_the_real_race_runs_and_every_matrix_takes_its_outcome(bf16_model):
    served = race_and_apply(bf16_model)
    # Which path wins where depends on this CPU; that all agree on it does not.
    assert all(band.start in (*RACE_ROWS, MIN_INT8_ACTIVATION_TOKENS) for band in served)
    assert {linear.int8_row_bands for linear in w8a8_targets(bf16_model)} == {served}


def test_the_bands_are_kept_and_a_damaged_file_is_raced_again(bf16_model, tmp_path, monkeypatch):
    raced = []

    def fake_race(dense, w8a8, **kwargs):
        raced.append(True)
        return (range(8, 32), range(128, EVERY_STEP))

    monkeypatch.setattr(int8_threshold, "race_bands", fake_race)
    layer = w8a8_targets(bf16_model)[:3]
    calibration.quantize_activations(bf16_model, list(range(3, 60)))

    def store():
        return PlanStore.open(AUTO, tmp_path, "tiny")

    first_store = store()
    first = int8_threshold.race_against_amx(layer, first_store)
    assert first_store.save() == ""
    assert int8_threshold.race_against_amx(layer, store()) == first and len(raced) == 1
    (kept,) = (tmp_path / "calibration").glob("execution-plan-*.json")
    assert json.loads(kept.read_text()) == {"w8a8_bands": [[8, 32], [128, None]]}
    kept.write_text('{"w8a8_bands": [["x", 1]]}')
    int8_threshold.race_against_amx(layer, store())
    assert len(raced) == 2


AMX = {"avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"}


def test_the_loader_races_only_on_a_bfloat16_model_with_amx(tmp_path, monkeypatch):
    from tests.model_factory import build_tiny_model, write_tiny_tokenizer

    folder = tmp_path / "tiny-llama"
    build_tiny_model("llama_tied", folder)
    write_tiny_tokenizer(folder)
    outcome = {"bands": (range(4, 64),)}
    raced = []

    def fake_race(dense, w8a8, **kwargs):
        raced.append(True)
        return outcome["bands"]

    monkeypatch.setattr(int8_threshold, "race_bands", fake_race)

    def load(flags, dtype="bfloat16", cache="cache"):
        monkeypatch.setattr(choices, "cpu_flags", lambda: frozenset(flags))
        return load_model(choices_config(folder, dtype, cache))

    loaded = load({"avx512_vnni", "avx512_bf16"})
    assert not raced and "raced" not in loaded.choices.reason
    assert "int8 activations in steps of several tokens" in loaded.choices.reason
    loaded = load(AMX)
    assert raced and loaded.choices.activations == "int8"
    reason = loaded.choices.reason
    own = loaded.model.layers[0].qkv_proj.int8_activations.min_rows
    assert f"int8 activations at {own}-63 rows, AMX bfloat16 elsewhere" in reason
    # The reason says what the race chose, and nothing it overruled.
    assert "in steps of several tokens" not in reason and "off" not in reason
    outcome["bands"] = ()
    # The bands are kept in the plan cache: the next load reads them.
    assert f"int8 activations at {own}-63 rows" in load(AMX).choices.reason
    assert len(raced) == 1
    loaded = load(AMX, cache="another-cache")
    assert (
        len(raced) == 2
        and loaded.choices.activations is None
        and loaded.model.activation_quantization is None
    )
    reason = loaded.choices.reason
    assert "int8 activations off: they lost to AMX bfloat16 in every band" in reason
    assert "AMX-INT8" not in reason and reason.count("int8 activations") == 1
    raced.clear()
    load(AMX, dtype="float32")
    assert not raced


def choices_config(folder, dtype, cache="cache"):
    from sluice.config import ModelConfig

    return ModelConfig(model=str(folder), cache_dir=folder.parent / cache, dtype=dtype,
                       quantization="int4", activation_quantization="auto")  # fmt: skip
