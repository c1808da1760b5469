"""What "auto" dtype and quantization become, and why; explicit values always win."""

from __future__ import annotations

import pytest
import torch

from sluice.config import ModelConfig
from sluice.loader.choices import choose, cpu_flags, decoder_weight_bits, has_native_bf16
from sluice.loader.gguf_convert import source_tensor_types
from sluice.loader.loaded_model import load_model
from sluice.models.native.int8 import int8_gemm_kernels

CPU = torch.device("cpu")
ZEN4 = frozenset({"avx512f", "avx512_bf16", "avx512_vnni"})
SAPPHIRE_RAPIDS = ZEN4 | {"amx_bf16", "amx_int8", "amx_tile"}
OLD_CPU = frozenset({"avx2", "fma"})


def test_auto_dtype_is_bfloat16_where_the_cpu_multiplies_it_natively():
    assert choose("auto", None, CPU, None, ZEN4).dtype == "bfloat16"
    amx = choose("auto", None, CPU, None, SAPPHIRE_RAPIDS)
    assert amx.dtype == "bfloat16" and "AMX-BF16" in amx.reason
    plain = choose("auto", None, CPU, None, OLD_CPU)
    assert plain.dtype == "float32" and "no native bfloat16" in plain.reason


def test_auto_quantization_is_int4_only_for_weights_that_came_in_4_bits():
    assert choose("auto", "auto", CPU, 4, ZEN4).quantization == "int4"
    for bits in (None, 8, 16, 32):
        chosen = choose("auto", "auto", CPU, bits, ZEN4)
        assert chosen.quantization is None and "--quantization" in chosen.reason


def test_a_checkpoint_whose_experts_stay_in_mxfp4_says_so_instead_of_no_quantization():
    chosen = choose("auto", "auto", CPU, None, OLD_CPU, kept_experts="MXFP4")
    assert chosen.quantization is None and "no quantization" not in chosen.reason
    assert "experts in MXFP4 as the checkpoint has them" in chosen.reason
    assert "--quantization" in chosen.reason  # the other matrices could still be asked


def test_explicit_values_pass_through_untouched():
    chosen = choose("float32", "int8", CPU, 4, SAPPHIRE_RAPIDS)
    assert (chosen.dtype, chosen.quantization, chosen.reason) == ("float32", "int8", "as asked")
    assert choose("bfloat16", None, CPU, 4, OLD_CPU).quantization is None


def test_the_row_invariant_scheme_is_the_default_where_the_int8_matmul_runs():
    for flags, hardware in ((ZEN4, "AVX512-VNNI"), (SAPPHIRE_RAPIDS, "AMX-INT8")):
        for bits in (4, 16, None):
            chosen = choose("auto", "auto", CPU, bits, flags, "auto", int8_gemm=True)
            assert chosen.row_invariant and chosen.activations == "int8"
            assert chosen.quantization is None and chosen.dtype == "bfloat16"
            assert "row-invariant" in chosen.reason and hardware in chosen.reason
    # Not without the native matmul, in float32, or when a flag was given.
    assert not choose("auto", "auto", CPU, 4, ZEN4, "auto", int8_gemm=False).row_invariant
    assert not choose("auto", "auto", CPU, 4, OLD_CPU, "auto", int8_gemm=True).row_invariant
    assert not choose("float32", "auto", CPU, 4, ZEN4, "auto", int8_gemm=True).row_invariant
    assert not choose("auto", "int4", CPU, 4, ZEN4, "auto", int8_gemm=True).row_invariant
    assert not choose("auto", "auto", CPU, 4, ZEN4, "int8", int8_gemm=True).row_invariant
    assert not choose("auto", "auto", CPU, 4, ZEN4, None, int8_gemm=True).row_invariant


def test_without_the_int8_matmul_auto_activations_are_int8_with_vnni_and_quantized_weights():
    chosen = choose("auto", "auto", CPU, 4, ZEN4, activations="auto", int8_gemm=False)
    assert chosen.activations == "int8" and "AVX512-VNNI" in chosen.reason
    assert not chosen.row_invariant
    amx = choose("auto", "auto", CPU, 4, SAPPHIRE_RAPIDS, activations="auto", int8_gemm=False)
    assert amx.activations == "int8" and "AMX-INT8" in amx.reason
    assert choose("auto", "auto", CPU, 4, OLD_CPU, activations="auto").activations is None
    # Weights that stay unquantized keep their activations too.
    unquantized = choose("auto", "auto", CPU, 16, ZEN4, activations="auto", int8_gemm=False)
    assert unquantized.activations is None
    assert choose("auto", None, CPU, 4, ZEN4, activations="auto").activations is None
    # Explicit values pass through; the default argument asks for none.
    assert choose("bfloat16", "int4", CPU, 4, OLD_CPU, activations="int8").activations == "int8"
    assert choose("auto", "auto", CPU, 4, ZEN4).activations is None


def test_decoder_weight_bits_reads_the_decoder_matrices_only():
    types = {"token_embd.weight": "Q8_0", "blk.0.attn_norm.weight": "F32",
             "blk.0.ffn_up.weight": "Q4_1", "blk.0.attn_q.weight": "Q4_1"}  # fmt: skip
    assert decoder_weight_bits(types) == 4
    assert decoder_weight_bits({"blk.0.ffn_up.weight": "F16"}) == 16
    assert decoder_weight_bits({"blk.0.attn_norm.weight": "F32"}) is None
    assert decoder_weight_bits(None) is None


@pytest.mark.slow
def test_the_embedded_model_loads_with_the_default_scheme_of_this_cpu(embedded_model_dir):
    """Row-invariant int8 matmuls where the native int8 matmul runs (bfloat16),
    else int4 weights (they came in 4 bits)."""
    assert decoder_weight_bits(source_tensor_types(embedded_model_dir)) == 4
    loaded = load_model(ModelConfig(cache_dir=embedded_model_dir.parent))
    expected_dtype = "bfloat16" if has_native_bf16(CPU, cpu_flags()) else "float32"
    row_invariant = expected_dtype == "bfloat16" and int8_gemm_kernels() is not None
    assert loaded.choices.row_invariant == row_invariant
    expected_quantization = None if row_invariant else "int4"
    assert (loaded.choices.dtype, loaded.choices.quantization) == (
        expected_dtype, expected_quantization,
    )  # fmt: skip
    assert loaded.model.dtype == getattr(torch, expected_dtype)


@pytest.mark.parametrize("flag", ["--dtype", "--quantization", "--activation-quantization"])
def test_the_cli_defaults_are_auto(flag):
    from sluice.cli import build_parser

    args = build_parser().parse_args(["serve"])
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == "auto"
