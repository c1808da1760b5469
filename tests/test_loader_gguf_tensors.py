"""A GGUF's tensors read for the model: kept block types as codes, the rest as float32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from sluice.loader.gguf_blocks import BlockCodes
from sluice.loader.gguf_tensors import gguf_weights
from tests.gguf_files import llama_cpp_permute
from tests.gguf_quants import quantize_q4_k, quantize_q6_k


def write(path: Path, tensors: dict[str, tuple[np.ndarray, GGMLQuantizationType | None]]):
    writer = GGUFWriter(str(path), "llama")
    for name, (array, kind) in tensors.items():
        if kind is None:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, array, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFReader(path)


def test_kept_blocks_come_as_codes_with_q_rows_unpermuted(tmp_path):
    rng = np.random.default_rng(0)
    q_proj = rng.standard_normal((8, 256)).astype(np.float32)  # 2 heads of 4 rows
    q_blocks, q_values = quantize_q4_k(llama_cpp_permute(q_proj, 2))
    down = rng.standard_normal((4, 512)).astype(np.float32)
    down_blocks, down_values = quantize_q6_k(down)
    norm = rng.standard_normal(256).astype(np.float32)
    up = rng.standard_normal((4, 64)).astype(np.float32)
    reader = write(
        tmp_path / "t.gguf",
        {
            "blk.0.attn_q.weight": (q_blocks, GGMLQuantizationType.Q4_K),
            "blk.0.ffn_down.weight": (down_blocks, GGMLQuantizationType.Q6_K),
            "blk.0.attn_norm.weight": (norm, None),
            "blk.0.ffn_up.weight": (up.astype(np.float16), None),  # float: float32
        },
    )
    out = dict(gguf_weights(reader, {"num_attention_heads": 2, "num_key_value_heads": 1}))
    q = out["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, BlockCodes) and q.format.name == "Q4_K"
    # The codes hold the file's values, rows back in HF's order.
    assert np.array_equal(q.dequantize(), llama_cpp_permute_inverse(q_values, 2))
    d = out["model.layers.0.mlp.down_proj.weight"]
    assert isinstance(d, BlockCodes) and np.array_equal(d.dequantize(), down_values)
    assert torch.equal(out["model.layers.0.input_layernorm.weight"], torch.from_numpy(norm))
    u = out["model.layers.0.mlp.up_proj.weight"]
    assert isinstance(u, torch.Tensor) and u.dtype == torch.float32
    assert torch.equal(u, torch.from_numpy(up.astype(np.float16).astype(np.float32)))


def llama_cpp_permute_inverse(weights: np.ndarray, num_heads: int) -> np.ndarray:
    half = weights.shape[0] // num_heads // 2
    return (
        weights.reshape(num_heads, half, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )
