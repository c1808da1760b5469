"""The kernel plan's int8 bands reach the W8A8 layers (int8_activations.py
`serve_bands`): any bands, threshold or not, give the same bits, and each
step runs the kernel its band names."""

from __future__ import annotations

import pytest
import torch

from sluice.models.int8_activations import Int8ActivationLinear, _threshold
from sluice.models.kernel_plan import band_of
from sluice.models.native.int8 import int8_gemm_kernels

gemm = int8_gemm_kernels()
requires_amx = pytest.mark.skipif(
    gemm is None or not gemm.has_amx, reason="no AMX-INT8 kernel on this CPU"
)


def test_bands_of_one_switch_become_the_c_calls_threshold():
    assert _threshold(((0, "vnni"),)) == 0
    assert _threshold(((0, "amx"),)) == 1
    assert _threshold(((0, "vnni"), (8, "amx"))) == 8
    assert _threshold(((0, "vnni"), (8, "amx"), (64, "vnni"))) is None
    apart = ((0, "vnni"), (8, "amx"), (32, "vnni"), (512, "amx"))
    assert [band_of(apart, n) for n in (1, 7, 8, 31, 32, 511, 512, 4000)] == [
        "vnni", "vnni", "amx", "amx", "vnni", "vnni", "amx", "amx",
    ]  # fmt: skip


@requires_amx
@pytest.mark.parametrize("pairs", [False, True])
def test_every_band_plan_gives_the_same_bits_and_calls_its_kernel(pairs, monkeypatch):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(200, 576, generator=generator)
    absmax = torch.rand(576, generator=generator) * 4 + 0.1
    x = torch.randn(300, 576, generator=generator).bfloat16()
    layers = {}
    for name, bands in {
        "vnni": ((0, "vnni"),), "amx": ((0, "amx"),), "threshold": ((0, "vnni"), (8, "amx")),
        "apart": ((0, "vnni"), (8, "amx"), (32, "vnni"), (512, "amx")),
    }.items():  # fmt: skip
        layer = Int8ActivationLinear.quantize(weight, None, absmax, torch.bfloat16, pairs)
        layer.serve_bands(bands)
        layers[name] = layer
    for rows in (1, 5, 8, 20, 40, 300):
        outputs = [layer(x[:rows]) for layer in layers.values()]
        assert all(torch.equal(out, outputs[0]) for out in outputs), rows


@requires_amx
@pytest.mark.parametrize(("pairs", "kernel"), [(False, 1), (True, 0)])
def test_a_step_runs_the_kernel_its_band_names(pairs, kernel, monkeypatch):
    """20 rows are 20 int8 code rows (an AMX band here) with A8, 40 with A13 (VNNI)."""
    from dataclasses import replace

    from sluice.models import int8_activations

    calls = []

    def spy(x, *args, amx_min_rows):
        calls.append(amx_min_rows)
        return gemm.linear(x, *args, amx_min_rows=amx_min_rows)

    monkeypatch.setattr(int8_activations, "int8_gemm_kernels", lambda: replace(gemm, linear=spy))
    generator = torch.Generator().manual_seed(1)
    layer = Int8ActivationLinear.quantize(
        torch.randn(64, 576, generator=generator), None, torch.ones(576), torch.bfloat16, pairs
    )
    layer.serve_bands(((0, "vnni"), (8, "amx"), (32, "vnni"), (512, "amx")))
    layer(torch.randn(20, 576, generator=generator).bfloat16())
    assert calls == [kernel]
