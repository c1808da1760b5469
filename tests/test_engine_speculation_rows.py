"""Which models speculate at all (sluice/engine/startup.py
`speculation_blocker`, sluice/models/linear.py `row_dependence`): a
verification computes 1 + k rows of a request where a plain decode step
computes one, so the engine speculates only where a row's bits ignore how
many rows share its step.

- per configuration of a matmul: float32 and bfloat16 dense, weight-only
  int4 and int8, int4 with W8A8 above a threshold or in raced bands (the
  `--quantization int4` configuration), the row-invariant scheme (W8A8 at
  every row count) and batch-invariant row tiles; the two said invariant
  give a row its bits alone at any row count (the rule cannot lie there);
- the engine builds no speculator for a model that is not row-invariant,
  whatever --speculative-config says, and its startup line says why; it
  builds one for a batch-invariant model.

The symptom itself (the int4 configuration's greedy output with
speculation asked equals the output without) is in
tests/test_models_row_invariant.py.
"""

from __future__ import annotations

import logging
import random
import sys
from dataclasses import replace

import pytest
import torch

from sluice.config import SpeculativeConfig
from sluice.engine.startup import describe_speculation, speculation_blocker
from sluice.models.linear import Linear, can_prepack
from tests.model_factory import make_core

CALIBRATION_IDS = [random.Random(7).randrange(3, 512) for _ in range(300)]


def linear(dtype=torch.float32, row_tile: int | None = None) -> Linear:
    layer = Linear(64, 96, False, dtype, "cpu", row_tile=row_tile)
    generator = torch.Generator().manual_seed(0)
    layer.weight.data = torch.randn(96, 64, generator=generator).to(dtype)
    return layer


def with_w8a8(layer: Linear, every_row: bool = False) -> Linear:
    column_max = torch.rand(64, generator=torch.Generator().manual_seed(1)) + 0.5
    layer.quantize_activations(column_max, every_row=every_row)
    return layer


def quantized(mode: str, dtype=torch.float32) -> Linear:
    layer = linear(dtype)
    layer.quantize(mode)
    return layer


def assert_rows_keep_their_bits(layer: Linear) -> None:
    rows = torch.randn(40, 64, generator=torch.Generator().manual_seed(2)).to(layer.weight.dtype)
    alone = torch.cat([layer(rows[i : i + 1]) for i in range(len(rows))])
    for start, count in ((0, 40), (0, 2), (3, 4), (5, 17), (20, 9)):
        assert torch.equal(layer(rows[start : start + count]), alone[start : start + count])


def test_dense_matmuls_depend_on_the_row_count():
    assert "dense" in linear().row_dependence
    if can_prepack(torch.bfloat16, "cpu"):
        packed = linear(torch.bfloat16)
        packed.prepack()
        assert "dense" in packed.row_dependence


def test_weight_only_copies_serve_few_rows_and_dense_the_rest():
    assert quantized("int4").row_dependence == (
        "weight-only up to 8 rows, dense elsewhere, blocked by the row count"
    )
    assert quantized("int8").row_dependence.startswith("weight-only up to 2 rows")


def test_the_int4_configuration_changes_kernels_with_the_row_count():
    # --quantization int4: int4 weights for few rows, W8A8 from its threshold
    # (4 rows with the VNNI kernel, 40 through torch) up.
    layer = with_w8a8(quantized("int4"))
    threshold = layer.min_large_rows
    assert f"int8 activations from {threshold} rows" in layer.row_dependence
    assert layer.row_dependence.startswith(f"weight-only up to {min(8, threshold - 1)} rows")
    # Raced against AMX at load: W8A8 in bands, the other paths between them.
    layer.serve_int8_activations_in((range(48, 64),))
    assert "int8 activations from 48 rows" in layer.row_dependence
    assert "dense elsewhere" in layer.row_dependence


def test_the_row_invariant_scheme_and_row_tiles_do_not_depend_on_the_row_count():
    every_row = with_w8a8(linear(torch.bfloat16), every_row=True)
    assert every_row.int8_row_bands == (range(1, sys.maxsize),)
    assert every_row.row_dependence is None
    assert_rows_keep_their_bits(every_row)
    tiled = linear(row_tile=8)
    tiled.quantize("int4")  # batch-invariant mode keeps the dense matmul at every step
    assert tiled.row_dependence is None
    assert_rows_keep_their_bits(tiled)


def test_the_startup_line_gives_the_models_reason_for_not_speculating():
    config = SpeculativeConfig(num_speculative_tokens=4)
    assert describe_speculation(config, (), "no speculation: why") == "no speculation: why"
    assert describe_speculation(None, (), "no speculation: why") == (
        "no speculation (--speculative-config none)"
    )


def test_a_model_that_is_not_row_invariant_gets_no_speculator(tiny_loaded, caplog):
    blocker = speculation_blocker(tiny_loaded)
    assert blocker is not None and "layers.0.qkv_proj: " in blocker
    with caplog.at_level(logging.INFO, logger="sluice.engine"):
        core = make_core(tiny_loaded, speculative=SpeculativeConfig())
    assert core.speculator is None
    assert blocker in caplog.text and "would change greedy outputs" in blocker


def test_a_batch_invariant_model_speculates(tiny_loaded, tiny_llama):
    from sluice.models.llama import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_loaded.model_config, torch.float32, torch.device("cpu"), True)
    model.load_weights(tiny_llama.weights())
    loaded = replace(tiny_loaded, model=model)
    assert speculation_blocker(loaded) is None
    assert make_core(loaded, speculative=SpeculativeConfig()).speculator is not None


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_a_quantized_model_gets_no_speculator(tiny_loaded, tiny_llama, mode):
    from sluice.models.llama import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_loaded.model_config, torch.float32, torch.device("cpu"))
    model.load_weights(tiny_llama.weights())
    model.quantize(mode)
    loaded = replace(tiny_loaded, model=model)
    assert "weight-only" in speculation_blocker(loaded)
    assert make_core(loaded, speculative=SpeculativeConfig()).speculator is None
