"""What "auto" dtype and quantization become, and why; explicit values always win."""

from __future__ import annotations

import pytest
import torch

from sluice.config import ModelConfig
from sluice.loader.choices import choose, cpu_flags, decoder_weight_bits, has_native_bf16
from sluice.loader.gguf_convert import source_tensor_types
from sluice.loader.loaded_model import load_model

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


def test_explicit_values_pass_through_untouched():
    chosen = choose("float32", "int8", CPU, 4, SAPPHIRE_RAPIDS)
    assert (chosen.dtype, chosen.quantization, chosen.reason) == ("float32", "int8", "as asked")
    assert choose("bfloat16", None, CPU, 4, OLD_CPU).quantization is None


def test_auto_activations_are_int8_with_vnni_and_quantized_weights():
    chosen = choose("auto", "auto", CPU, 4, ZEN4, activations="auto")
    assert chosen.activations == "int8" and "AVX512-VNNI" in chosen.reason
    amx = choose("auto", "auto", CPU, 4, SAPPHIRE_RAPIDS, activations="auto")
    assert amx.activations == "int8" and "AMX-INT8" in amx.reason
    assert choose("auto", "auto", CPU, 4, OLD_CPU, activations="auto").activations is None
    # Weights that stay unquantized keep their activations too.
    assert choose("auto", "auto", CPU, 16, ZEN4, activations="auto").activations is None
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
def test_the_embedded_model_came_in_4_bits_and_loads_as_int4_by_default(embedded_model_dir):
    assert decoder_weight_bits(source_tensor_types(embedded_model_dir)) == 4
    loaded = load_model(ModelConfig(cache_dir=embedded_model_dir.parent))
    expected_dtype = "bfloat16" if has_native_bf16(CPU, cpu_flags()) else "float32"
    assert (loaded.choices.dtype, loaded.choices.quantization) == (expected_dtype, "int4")
    assert loaded.model.dtype == getattr(torch, expected_dtype)


@pytest.mark.parametrize("flag", ["--dtype", "--quantization", "--activation-quantization"])
def test_the_cli_defaults_are_auto(flag):
    from sluice.cli import build_parser

    args = build_parser().parse_args(["serve"])
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == "auto"
