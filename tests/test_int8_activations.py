"""Int8 activations times int8 weights (sluice/models/int8_activations.py) and their calibration.

- The C passes around the int8 matmul compute what the torch fallback does
  (bfloat16 within one output rounding, float32 to float32 rounding), with a
  bias, a row of zeros, strided rows;
- the packed VNNI matmul gives exactly the bits of the exact integer product
  scaled in torch's order, for any row count (tails of its 6-row and
  192-row blocks), column counts off its 64-column tiles, with and without
  a bias, extreme codes included; the bfloat16 layer uses it and matches the
  _int_mm path;
- the layer is close to the exact matmul, and smoothing is what keeps it
  close when activations have outlier columns;
- `Linear` takes the path from the layer's threshold on (40 rows through
  _int_mm, 4 with the packed matmul, where it takes over from int4), keeps
  its other paths below, and batch-invariant matrices never take it;
- calibration records the largest |x| per column over every chunk, keeps
  the maxima in a cache file that a second load reads back instead of
  running the model (a damaged file is measured again), and refuses a model
  without weights or in batch-invariant mode; the loader refuses unknown
  modes and non-CPU devices.
"""

from __future__ import annotations

import pytest
import torch

from sluice.errors import ModelLoadError
from sluice.models import calibration
from sluice.models.int8_activations import (
    MIN_INT8_ACTIVATION_TOKENS,
    MIN_PACKED_INT8_TOKENS,
    Int8ActivationLinear,
    _dequantize_rows,
    _quantize_rows,
)
from sluice.models.linear import Linear
from sluice.models.llama import LlamaForCausalLM
from sluice.models.native.int8 import int8_gemm_kernels, int8_row_kernels

requires_kernel = pytest.mark.skipif(
    int8_row_kernels(torch.float32) is None, reason="no C compiler here"
)


def activations(rows: int, cols: int, seed: int = 0, outliers: bool = True) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=generator)
    if outliers:
        x[:, 3] *= 40  # a few columns far wider than the rest, as after RMSNorm
        x[:, cols // 2] *= 25
    return x


@requires_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_the_c_passes_compute_what_the_torch_fallback_does(dtype, rows):
    quantize, dequantize = int8_row_kernels(dtype)
    x = activations(rows, 96, seed=rows).to(dtype)
    x[0] = 0  # a row of zeros: scale 1, codes 0
    inv_smooth = torch.rand(96, generator=torch.Generator().manual_seed(2)) + 0.5
    codes, scales = quantize(x, inv_smooth)
    want_codes, want_scales = _quantize_rows(x, inv_smooth)
    # Float32 rounding apart (the kernel may divide by 127 as a product).
    torch.testing.assert_close(scales, want_scales, rtol=1e-6, atol=0)
    assert scales[0] == 1
    # A value at half a step may round either way after float32 rounding.
    assert (codes.int() - want_codes.int()).abs().max() <= 1
    assert (codes != want_codes).float().mean() < 0.01
    acc = torch.randint(-(2**20), 2**20, (rows, 48), dtype=torch.int32)
    col_scales = torch.rand(48) * 1e-3
    bias = torch.randn(48).to(dtype)
    for b in (None, bias):
        got = dequantize(acc, scales, col_scales, b)
        want = _dequantize_rows(dtype)(acc, scales, col_scales, b)
        tolerance = {"rtol": 2**-7, "atol": 1e-6} if dtype == torch.bfloat16 else {}
        torch.testing.assert_close(got, want, **tolerance)


@requires_kernel
def test_quantize_reads_strided_rows():
    quantize, _ = int8_row_kernels(torch.bfloat16)
    wide = activations(8, 2 * 64).to(torch.bfloat16)
    view = wide[:, :64]  # rows 128 apart
    codes, scales = quantize(view, torch.ones(64))
    want_codes, want_scales = _quantize_rows(view.contiguous(), torch.ones(64))
    torch.testing.assert_close(scales, want_scales, rtol=1e-6, atol=0)
    assert (codes.int() - want_codes.int()).abs().max() <= 1


requires_gemm = pytest.mark.skipif(
    int8_gemm_kernels() is None, reason="no AVX512-VNNI (or no C compiler) here"
)


def exact_scaled_product(q, scales, w, col_scales, bias):
    """What int8_gemm.c must give: the integer product, scaled as torch does, rounded."""
    acc = (q.long() @ w.long().T).float()  # exact below 2^24 (asserted by the sizes)
    y = (acc * scales[:, None] * col_scales).to(torch.bfloat16)
    return y if bias is None else y + bias


@requires_gemm
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 16, 64, 200])
@pytest.mark.parametrize("out_features", [64, 80, 200])
def test_the_packed_vnni_matmul_gives_the_exact_products_bits(rows, out_features):
    kernels = int8_gemm_kernels()
    pack, gemm = kernels.pack, kernels.gemm
    generator = torch.Generator().manual_seed(rows * 1000 + out_features)
    in_features = 96
    w = torch.randint(-127, 128, (out_features, in_features), dtype=torch.int8, generator=generator)
    w[0] = 127  # the extremes: the unsigned-times-signed trick must not saturate
    w[1] = -127
    q = torch.randint(-127, 128, (rows, in_features), dtype=torch.int8, generator=generator)
    q[0] = -127
    scales = torch.rand(rows, generator=generator) * 0.1 + 1e-3
    col_scales = torch.rand(out_features, generator=generator) * 1e-3
    bias = torch.randn(out_features, generator=generator).to(torch.bfloat16)
    weights = pack(w)
    for b in (None, bias):
        got = gemm(q, scales, weights, col_scales, b)
        assert got.shape == (rows, out_features) and got.dtype == torch.bfloat16
        assert torch.equal(got, exact_scaled_product(q, scales, w, col_scales, b))


@requires_gemm
def test_the_bfloat16_layer_runs_the_packed_matmul_and_matches_int_mm():
    weight = torch.randn(80, 96, generator=torch.Generator().manual_seed(9)) * 0.05
    bias = (torch.randn(80) * 0.1).to(torch.bfloat16)
    absmax = activations(128, 96).abs().amax(0)
    layer = Int8ActivationLinear.quantize(weight, bias, absmax, torch.bfloat16)
    assert layer.packed is not None and layer.weight_int8 is None
    x = activations(24, 96, seed=10).to(torch.bfloat16)
    quantize, dequantize = int8_row_kernels(torch.bfloat16)
    codes, scales = quantize(x, layer.inv_smooth)
    want = dequantize(
        torch._int_mm(codes, _codes_of(weight, absmax).t()), scales, layer.weight_scales, bias
    )
    assert torch.equal(layer(x), want)
    # Rows read with their stride (a view into a wider tensor), as contiguous ones.
    wide = torch.cat([x, x], dim=1)
    assert torch.equal(layer(wide[:, 96:]), want)


def _codes_of(weight, absmax):
    return Int8ActivationLinear.quantize(weight, None, absmax, torch.float32).weight_int8


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want).norm() / want.norm()).item()


def test_the_layer_is_close_to_the_exact_matmul_and_smoothing_keeps_it_so():
    weight = torch.randn(80, 96, generator=torch.Generator().manual_seed(3)) * 0.05
    bias = torch.randn(80) * 0.1
    calibration_x = activations(256, 96, seed=4)
    x = activations(64, 96, seed=5)
    exact = x @ weight.T + bias
    smoothed = Int8ActivationLinear.quantize(
        weight, bias, calibration_x.abs().amax(0), torch.float32
    )
    plain = Int8ActivationLinear.quantize(weight, bias, torch.ones(96), torch.float32)
    smoothed_error = relative_error(smoothed(x), exact)
    assert smoothed_error < 0.01
    # Unsmoothed, the outlier columns set each token's scale: far coarser.
    assert relative_error(plain(x), exact) > 2 * smoothed_error


def test_linear_takes_the_path_from_the_threshold_on():
    linear = Linear(96, 80, True, torch.float32, "cpu")
    generator = torch.Generator().manual_seed(6)
    linear.weight.copy_(torch.randn(80, 96, generator=generator) * 0.05)
    linear.bias.copy_(torch.randn(80, generator=generator))
    linear.quantize_activations(activations(128, 96).abs().amax(0))
    layer = linear.int8_activations
    below = activations(MIN_INT8_ACTIVATION_TOKENS - 1, 96, seed=7)
    at = activations(MIN_INT8_ACTIVATION_TOKENS, 96, seed=8)
    assert torch.equal(linear(below), torch.nn.functional.linear(below, linear.weight, linear.bias))
    assert torch.equal(linear(at), layer(at))
    invariant = Linear(96, 80, False, torch.float32, "cpu", row_tile=8)
    invariant.weight.copy_(linear.weight)
    invariant.quantize_activations(torch.ones(96))
    assert torch.equal(invariant(at), torch.nn.functional.linear(at, invariant.weight))


@requires_gemm
def test_with_the_packed_matmul_w8a8_takes_over_from_int4_at_its_threshold():
    linear = Linear(96, 128, False, torch.bfloat16, "cpu")
    linear.weight.copy_(torch.randn(128, 96, generator=torch.Generator().manual_seed(11)) * 0.05)
    linear.quantize("int4")
    linear.quantize_activations(activations(128, 96).abs().amax(0))
    layer = linear.int8_activations
    assert layer.min_rows == MIN_PACKED_INT8_TOKENS < linear.max_quantized_tokens
    below = activations(MIN_PACKED_INT8_TOKENS - 1, 96, seed=12).to(torch.bfloat16)
    at = activations(MIN_PACKED_INT8_TOKENS, 96, seed=13).to(torch.bfloat16)
    assert torch.equal(linear(below), linear.quantized.matmul_for(torch.bfloat16)(below))
    assert torch.equal(linear(at), layer(at))


@pytest.fixture
def fresh_model(tiny_loaded, tiny_llama) -> LlamaForCausalLM:
    model = LlamaForCausalLM(tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"))
    model.load_weights(tiny_llama.weights())
    return model


def test_calibration_takes_the_maximum_over_every_chunk(fresh_model):
    ids = list(range(3, 203))  # 200 tokens: four chunks of 64
    targets = [fresh_model.layers[0].qkv_proj, fresh_model.layers[-1].gate_up_proj]
    whole = calibration.input_absmax(fresh_model, targets, ids, chunk_tokens=64)
    first = calibration.input_absmax(fresh_model, targets, ids[:64], chunk_tokens=64)
    # Beyond the model's positions (256 here) the text is cut, not refused.
    calibration.input_absmax(fresh_model, targets, ids * 2, chunk_tokens=64)
    for linear in targets:
        assert whole[linear].shape == linear.weight.shape[1:]
        assert torch.all(whole[linear] >= first[linear])
    # The model is left without hooks.
    assert all(not linear._forward_pre_hooks for linear in targets)


def test_calibration_keeps_its_maxima_and_reads_them_back(fresh_model, tiny_loaded, tiny_llama,
                                                           tmp_path, monkeypatch):  # fmt: skip
    ids = list(range(3, 120))
    kept = tmp_path / "calibration" / "maxima.pt"
    calibration.quantize_activations(fresh_model, ids, kept)
    assert kept.exists() and fresh_model.activation_quantization == "int8"
    x = torch.randn(MIN_INT8_ACTIVATION_TOKENS, fresh_model.config.hidden_size).bfloat16()
    first = fresh_model.layers[0].qkv_proj(x)

    def measuring(*args):
        raise AssertionError("the model ran although the maxima were kept")

    again = LlamaForCausalLM(tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"))
    again.load_weights(tiny_llama.weights())
    with monkeypatch.context() as patch:
        patch.setattr(calibration, "input_absmax", measuring)
        calibration.quantize_activations(again, ids, kept)
    assert torch.equal(again.layers[0].qkv_proj(x), first)
    # A damaged file is measured again, and rewritten.
    kept.write_bytes(b"not a tensor file")
    third = LlamaForCausalLM(tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"))
    third.load_weights(tiny_llama.weights())
    calibration.quantize_activations(third, ids, kept)
    assert torch.equal(third.layers[0].qkv_proj(x), first)
    assert torch.load(kept, weights_only=True)[0].dtype == torch.float32


def test_calibration_refuses_what_it_cannot_serve(tiny_loaded, tiny_llama):
    unloaded = LlamaForCausalLM(tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(ModelLoadError, match="loaded first"):
        calibration.quantize_activations(unloaded, [1, 2, 3])
    invariant = LlamaForCausalLM(
        tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"), batch_invariant=True
    )
    invariant.load_weights(tiny_llama.weights())
    with pytest.raises(ModelLoadError, match="batch-invariant"):
        calibration.quantize_activations(invariant, [1, 2, 3])
    with pytest.raises(ModelLoadError, match="unknown activation quantization"):
        calibration.check_activation_quantization("int4", torch.device("cpu"))
    with pytest.raises(ModelLoadError, match="CPU only"):
        calibration.check_activation_quantization("int8", torch.device("cuda"))
    calibration.check_activation_quantization(None, torch.device("cuda"))
