"""The native library's ABI on the Python side: one table of every exported
function's C signature and every struct passed across (sluice_abi.h, restated
in C's own words), from which every ctypes binding is set.

`declare(library)` gives each function of the table its argtypes and restype
when the library loads (native/__init__.py); no wrapper sets its own. The
structs' ctypes classes (`Int8Matrix`, `DecoderLayer`) are built from the same
table. tests/test_native_abi.py parses sluice_abi.h and holds it equal to this
table, prototype by prototype and field by field, checks the classes' sizes
against the compiler's, and checks that the built library exports exactly
these names: a wrong order or type here would be silent memory corruption.

Types are written as in C ("const uint16_t *", "int64_t"): every data pointer
passes as c_void_p (the callers hand over tensors' data_ptr()), a pointer to
a struct of the table as POINTER(that struct).
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from typing import Any

# (name, C type) of every field, in order.
StructFields = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Function:
    """One exported function: its C return type and parameter list."""

    returns: str  # "void", "int", "int64_t"
    params: str  # "const uint16_t *x, int64_t rows, ...", or "void"

    def param_types(self) -> tuple[str, ...]:
        return tuple(c_type for c_type, _ in parse_params(self.params))

    def argtypes(self) -> list[Any]:
        return [ctype_of(c_type) for c_type in self.param_types()]

    def restype(self) -> Any:
        return ctype_of(self.returns)


def parse_params(params: str) -> tuple[tuple[str, str], ...]:
    """C parameters -> ((type, name), ...), types spaced as "const int8_t *"."""
    if params.strip() == "void":
        return ()
    parsed = []
    for param in params.split(","):
        found = re.fullmatch(r"\s*(.+?)\s*(\w+)\s*", param)
        assert found is not None, f"not a C parameter: {param!r}"
        parsed.append((normal_type(found[1]), found[2]))
    return tuple(parsed)


def normal_type(c_type: str) -> str:
    """One spelling per C type: single spaces, a space before each `*`."""
    return re.sub(r"\s+", " ", c_type.replace("*", " *")).strip()


_SCALARS = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float}
_STRUCTURES: dict[str, type[ctypes.Structure]] = {}


def ctype_of(c_type: str) -> Any:
    """The ctypes type a C type of this ABI passes as (None for void)."""
    if c_type == "void":
        return None
    if c_type.endswith("*"):
        pointee = c_type.removeprefix("const ").removesuffix("*").strip()
        structure = _STRUCTURES.get(pointee)
        return ctypes.c_void_p if structure is None else ctypes.POINTER(structure)
    return _STRUCTURES.get(c_type) or _SCALARS[c_type]


STRUCTS: dict[str, StructFields] = {
    # A W8A8 matrix of a fused decoder layer (fused_decode.py).
    "Int8Matrix": (
        ("packed", "const int8_t *"),
        ("compensation", "const int32_t *"),
        ("col_scales", "const float *"),
        ("inv_smooth", "const float *"),
        ("bias", "const uint16_t *"),
        ("out_features", "int64_t"),
        ("in_features", "int64_t"),
        ("pairs", "int64_t"),
    ),
    # One GGUF-block part of a fused layer's projection (qblock_gemm.c's layout).
    "QBlockPart": (
        ("packed", "const uint8_t *"),
        ("out_features", "int64_t"),
        ("bits", "int64_t"),
        ("sub", "int64_t"),
        ("super_block", "int64_t"),
        ("has_scales", "int64_t"),
        ("has_min", "int64_t"),
        ("offset", "int64_t"),
    ),
    # A fused layer's projection: W8A8, or GGUF-block parts where num_parts > 0.
    "LayerMatrix": (
        ("int8", "Int8Matrix"),
        ("num_parts", "int64_t"),
        ("parts", "const QBlockPart *"),
    ),
    # One expert of an MoE layer in GGUF blocks (moe_qblock.c).
    "QBlockExpert": (
        ("gate_up", "const QBlockPart *"),
        ("num_gate_up", "int64_t"),
        ("down", "const QBlockPart *"),
        ("num_down", "int64_t"),
    ),
    # A Llama decoder layer's weights and shapes (decode_layer.c).
    "DecoderLayer": (
        ("attention_norm", "const uint16_t *"),
        ("mlp_norm", "const uint16_t *"),
        ("qkv", "LayerMatrix"),
        ("o", "LayerMatrix"),
        ("gate_up", "LayerMatrix"),
        ("down", "LayerMatrix"),
        ("hidden_size", "int64_t"),
        ("num_heads", "int64_t"),
        ("num_kv_heads", "int64_t"),
        ("head_dim", "int64_t"),
        ("intermediate_size", "int64_t"),
        ("eps", "float"),
        ("scale", "float"),
        ("decode_amx", "int64_t"),
    ),
}


def _structure(cls: type[ctypes.Structure]) -> type[ctypes.Structure]:
    """Give a struct class its fields from STRUCTS (by its name), and register it."""
    cls._fields_ = [(name, ctype_of(c_type)) for name, c_type in STRUCTS[cls.__name__]]
    _STRUCTURES[cls.__name__] = cls
    return cls


@_structure
class Int8Matrix(ctypes.Structure):
    """sluice_abi.h's Int8Matrix (fields: STRUCTS)."""


@_structure
class QBlockPart(ctypes.Structure):
    """sluice_abi.h's QBlockPart (fields: STRUCTS)."""


@_structure
class LayerMatrix(ctypes.Structure):
    """sluice_abi.h's LayerMatrix (fields: STRUCTS)."""


@_structure
class QBlockExpert(ctypes.Structure):
    """sluice_abi.h's QBlockExpert (fields: STRUCTS)."""


@_structure
class DecoderLayer(ctypes.Structure):
    """sluice_abi.h's DecoderLayer (fields: STRUCTS)."""


def _decode_attention(t: str) -> str:
    return (
        f"const {t} *q, const {t} *cache, const int64_t *block_ids, const int64_t *seq_lens, "
        "int64_t q_stride, int64_t num_seqs, int64_t blocks_per_seq, int64_t num_blocks, "
        "int64_t block_size, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, "
        f"float scale, {t} *out"
    )


_PREFILL_ATTENTION = (
    "const uint16_t *q, int64_t q_stride, const uint16_t *k, int64_t k_stride, "
    "const uint16_t *v, int64_t v_stride, int64_t num_queries, int64_t num_keys, "
    "int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float scale, uint16_t *out"
)


def _rms_norm(t: str) -> str:
    return (
        f"const {t} *x, const {t} *w, int64_t rows, int64_t hidden, int64_t row_stride, "
        f"float eps, {t} *out"
    )


def _silu_mul(t: str) -> str:
    return f"const {t} *x, int64_t rows, int64_t inter, int64_t row_stride, {t} *out"


def _clamped_swiglu(t: str) -> str:
    return (
        f"const {t} *x, int64_t rows, int64_t inter, int64_t row_stride, float alpha, "
        f"float limit, {t} *out"
    )


def _quantize_rows(t: str) -> str:
    return (
        f"const {t} *x, int64_t rows, int64_t cols, int64_t row_stride, "
        "const float *inv_smooth, int8_t *q, float *scales"
    )


def _dequantize_rows(t: str) -> str:
    return (
        "const int32_t *acc, int64_t rows, int64_t cols, const float *row_scales, "
        f"const float *col_scales, const {t} *bias, {t} *out"
    )


_RECURRENT_ROWS = (
    "const int64_t *spans, int64_t num_seqs, const int64_t *saves, int64_t num_saves, "
    "float *cache, int64_t cache_rows, int64_t cache_stride, float *kept, int64_t kept_rows, "
    "int64_t kept_stride"
)


FUNCTIONS: dict[str, Function] = {
    # paged_decode_attention.c, decode_attention_amx.c: native/__init__.py
    "decode_attention_bf16": Function("int", _decode_attention("uint16_t")),
    "decode_attention_f32": Function("int", _decode_attention("float")),
    "decode_attention_int8kv_bf16": Function(
        "int", _decode_attention("uint16_t").replace("const uint16_t *cache", "const int8_t *cache")
    ),
    "decode_attention_amx_available": Function("int", "void"),
    "decode_attention_amx_bf16": Function("int", _decode_attention("uint16_t")),
    # prefill_attention.c, prefill_attention_amx.c: prefill.py
    "prefill_attention_available": Function("int", "void"),
    "prefill_attention_bf16": Function("int", _PREFILL_ATTENTION),
    "prefill_attention_amx_available": Function("int", "void"),
    "prefill_attention_amx_bf16": Function("int", _PREFILL_ATTENTION),
    # rms_norm.c, rows.c: native/__init__.py
    "rms_norm_bf16": Function("void", _rms_norm("uint16_t")),
    "rms_norm_f32": Function("void", _rms_norm("float")),
    "silu_mul_bf16": Function("void", _silu_mul("uint16_t")),
    "silu_mul_f32": Function("void", _silu_mul("float")),
    "clamped_swiglu_bf16": Function("void", _clamped_swiglu("uint16_t")),
    "clamped_swiglu_f32": Function("void", _clamped_swiglu("float")),
    "argmax_f32": Function("void", "const float *x, int64_t rows, int64_t cols, int64_t *out"),
    "merge_attention_bf16": Function(
        "void",
        "const uint16_t *x, const float *lx, const uint16_t *y, const float *ly, "
        "int64_t tokens, int64_t heads, int64_t dim, uint16_t *out",
    ),
    # rope_kv.c: rope.py
    "rope_write_kv_bf16": Function(
        "int",
        "const uint16_t *qkv, int64_t tokens, int64_t token_stride, int64_t num_heads, "
        "int64_t num_kv_heads, int64_t head_dim, const float *cos, const float *sin, "
        "uint16_t *cache, int64_t num_slots, const int64_t *slot_mapping, uint16_t *q_out, "
        "uint16_t *k_out",
    ),
    # int8_rows.c: int8.py
    "quantize_rows_bf16": Function("int", _quantize_rows("uint16_t")),
    "quantize_rows_f32": Function("int", _quantize_rows("float")),
    "quantize_row_pairs_bf16": Function("int", _quantize_rows("uint16_t")),
    "dequantize_rows_bf16": Function("void", _dequantize_rows("uint16_t")),
    "dequantize_rows_f32": Function("void", _dequantize_rows("float")),
    # int8_gemm.c, int8_amx.c: int8.py
    "int8_gemm_available": Function("int", "void"),
    "int8_packed_bytes": Function("int64_t", "int64_t n, int64_t k"),
    "pack_int8_weights": Function(
        "int", "const int8_t *w, int64_t n, int64_t k, int8_t *packed, int32_t *compensation"
    ),
    "int8_gemm_bf16": Function(
        "void",
        "const int8_t *q, const float *row_scales, int64_t rows, int64_t k, "
        "const int8_t *packed, const int32_t *compensation, const float *col_scales, "
        "const uint16_t *bias, int64_t n, uint16_t *out, int pairs, int64_t amx_min_rows",
    ),
    "int8_linear_bf16": Function(
        "int",
        "const uint16_t *x, int64_t rows, int64_t k, int64_t x_stride, "
        "const float *inv_smooth, const int8_t *packed, const int32_t *compensation, "
        "const float *col_scales, const uint16_t *bias, int64_t n, uint16_t *out, int pairs, "
        "int64_t amx_min_rows",
    ),
    "int8_amx_available": Function("int", "void"),
    "int8_amx_gemm_bf16": Function(
        "int",
        "const int8_t *q, const float *row_scales, int64_t rows, int64_t k, "
        "const int8_t *packed, const float *col_scales, const uint16_t *bias, int64_t n, "
        "uint16_t *out, int pairs",
    ),
    # decode_layer.c: fused_decode.py
    "decoder_layer_rows_bf16": Function(
        "int",
        "const DecoderLayer *layer, uint16_t *hidden, int64_t rows, const float *cos, "
        "const float *sin, uint16_t *cache, int64_t num_blocks, int64_t block_size, "
        "const int64_t *slot_mapping, const int64_t *block_ids, int64_t blocks_per_seq, "
        "const int64_t *seq_lens, const int64_t *amx_min_rows",
    ),
    # qblock_gemm.c: qblock.py
    "qblock_gemm_available": Function("int", "void"),
    "qblock_super_bytes": Function(
        "int64_t", "int bits, int sub, int super_block, int has_scales, int has_min"
    ),
    "qblock_gemm": Function(
        "int",
        "const void *x, int x_bf16, int64_t rows, int64_t k, const uint8_t *packed, int64_t n, "
        "int bits, int sub, int super_block, int has_scales, int has_min, int offset, "
        "void *out, int out_bf16, int64_t out_stride",
    ),
    "qblock_linear": Function(
        "int",
        "const void *x, int x_bf16, int64_t rows, int64_t k, const QBlockPart *parts, "
        "int64_t num_parts, void *out, int out_bf16, int64_t out_stride",
    ),
    "qblock_rows": Function(
        "int",
        "const uint8_t *packed, int64_t n, int64_t k, int bits, int sub, int super_block, "
        "int has_scales, int has_min, int offset, const int64_t *ids, int64_t count, float *out",
    ),
    # moe_qblock.c: qblock.py
    "qblock_moe": Function(
        "int",
        "const void *x, int x_bf16, int64_t tokens, int64_t hidden, int64_t inter, "
        "const QBlockExpert *experts, int64_t num_experts, const int64_t *expert_ids, "
        "const float *weights, int64_t top_k, float *out",
    ),
    # mxfp4_gemm.c: mxfp4.py
    "mxfp4_gemm_available": Function("int", "void"),
    "mxfp4_gemm": Function(
        "int",
        "const void *x, int x_bf16, int64_t rows, int64_t k, const uint8_t *weights, int64_t n, "
        "void *out, int out_bf16, int64_t out_stride",
    ),
    # moe_mxfp4.c: mxfp4.py
    "mxfp4_moe": Function(
        "int",
        "const void *x, int x_bf16, int64_t tokens, int64_t hidden, int64_t inter, "
        "const uint8_t *gate_up, const uint8_t *down, const void *gate_up_bias, "
        "const void *down_bias, int64_t num_experts, const int64_t *expert_ids, "
        "const float *weights, int64_t top_k, float alpha, float limit, float *out",
    ),
    # gated_delta.c, mamba_scan.c: recurrent.py
    "gated_delta_rule_f32": Function(
        "int",
        "const float *conv, const float *z, const float *b, const float *a, "
        "const float *neg_a, const float *dt_bias, const float *norm_weight, "
        f"{_RECURRENT_ROWS}, int64_t num_k_heads, int64_t num_v_heads, "
        "int64_t key_head_dim, int64_t value_head_dim, float eps, int bf16, float *out",
    ),
    "mamba_scan_f32": Function(
        "int",
        "const float *x, const float *dt, const float *decay, const float *b_in, "
        f"const float *c_out, {_RECURRENT_ROWS}, int64_t num_heads, int64_t head_dim, "
        "int64_t num_groups, int64_t state_size, float *y",
    ),
}


def declare(library: ctypes.CDLL) -> None:
    """Set every function of the table's argtypes and restype on `library`."""
    for name, function in FUNCTIONS.items():
        bound = getattr(library, name)
        bound.argtypes = function.argtypes()
        bound.restype = function.restype()
