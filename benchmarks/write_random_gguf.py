"""A random Llama-shaped GGUF written tensor by tensor, for shapes too big to build in memory.

    .venv/bin/python benchmarks/write_random_gguf.py --quantize BIN [--shape llama-8b]
        [--out /work/peers/models] [--type Q4_K_M] [--context-length 131072]

make_gguf_models.py builds each model whole in transformers (bfloat16) and
saves an HF folder before llama.cpp's converter reads it: for Llama 3.1 8B's
shape that is 15 GB of memory and twice 15 GB of disk. This writes the same
kind of model straight into a Q8_0 GGUF, one tensor at a time (the largest,
the 49,152 x 4,096 embedding, is 0.8 GB of float32): N(0, 0.02) weights
(norms too, like make_1b_models.py; seeded per tensor), llama.cpp's tensor
names and `llama.*` keys from the shape of make_gguf_models.SHAPES, and every
`tokenizer.*` key copied from the embedded model's GGUF (vocabulary 49,152,
its chat template: the tokenizer of the 1B and 3B files). Then llama.cpp's own
`llama-quantize --allow-requantize` makes the type asked (Q4_K_M: about
4.6 GB for 8B) and the Q8_0 file (8 GB) is removed. Peak disk: 12.6 GB.
Each file is written under a temporary name and renamed when complete.
The context length defaults to Llama 3.1's 131,072 (no RoPE scaling keys: the
weights are random), so a 16k-token prompt is within the model's length.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import make_1b_models  # noqa: E402

Q8_0 = gguf.GGMLQuantizationType.Q8_0
FILE_TYPE_Q8_0 = 7  # llama_ftype LLAMA_FTYPE_MOSTLY_Q8_0


def tensor_shapes(shape: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """llama.cpp's Llama tensors in file order, each (name, (rows, columns)) or (name, (n,))."""
    hidden, ffn = shape["hidden_size"], shape["intermediate_size"]
    head_dim = shape.get("head_dim", hidden // shape["num_attention_heads"])
    q_width = shape["num_attention_heads"] * head_dim
    kv_width = shape["num_key_value_heads"] * head_dim
    vocab = shape["vocab_size"]
    yield "token_embd.weight", (vocab, hidden)
    yield "output_norm.weight", (hidden,)
    if not shape.get("tie_word_embeddings", True):
        yield "output.weight", (vocab, hidden)
    for layer in range(shape["num_hidden_layers"]):
        block = f"blk.{layer}"
        yield f"{block}.attn_norm.weight", (hidden,)
        yield f"{block}.attn_q.weight", (q_width, hidden)
        yield f"{block}.attn_k.weight", (kv_width, hidden)
        yield f"{block}.attn_v.weight", (kv_width, hidden)
        yield f"{block}.attn_output.weight", (hidden, q_width)
        yield f"{block}.ffn_norm.weight", (hidden,)
        yield f"{block}.ffn_gate.weight", (ffn, hidden)
        yield f"{block}.ffn_up.weight", (ffn, hidden)
        yield f"{block}.ffn_down.weight", (hidden, ffn)


def random_values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    generator = torch.Generator().manual_seed(seed)
    return torch.empty(shape).normal_(0.0, 0.02, generator=generator).numpy()


def encoded(values: np.ndarray) -> np.ndarray:
    """Vectors stay float32 (llama.cpp's rule for norms); matrices become Q8_0 blocks."""
    return values if values.ndim == 1 else gguf.quants.quantize(values, Q8_0)


def add_llama_keys(writer: gguf.GGUFWriter, name: str, shape: dict, context_length: int) -> None:
    head_dim = shape.get("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    writer.add_name(name)
    writer.add_block_count(shape["num_hidden_layers"])
    writer.add_context_length(context_length)
    writer.add_embedding_length(shape["hidden_size"])
    writer.add_feed_forward_length(shape["intermediate_size"])
    writer.add_head_count(shape["num_attention_heads"])
    writer.add_head_count_kv(shape["num_key_value_heads"])
    writer.add_rope_freq_base(shape.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(shape.get("rms_norm_eps", 1e-6))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(shape["vocab_size"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_file_type(FILE_TYPE_Q8_0)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def copy_tokenizer_keys(writer: gguf.GGUFWriter, tokenizer_gguf: Path) -> None:
    reader = gguf.GGUFReader(tokenizer_gguf)
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), field.types[0], sub_type)


def write_random_gguf(
    path: Path, name: str, shape: dict, tokenizer_gguf: Path, context_length: int, seed: int = 0
) -> Path:
    """The Q8_0 GGUF of a random Llama `shape` at `path` (written as PATH.part, then renamed)."""
    partial = path.with_name(path.name + ".part")
    writer = gguf.GGUFWriter(partial, "llama")
    add_llama_keys(writer, name, shape, context_length)
    copy_tokenizer_keys(writer, tokenizer_gguf)
    tensors = list(tensor_shapes(shape))
    for tensor, dims in tensors:
        if len(dims) == 1:
            writer.add_tensor_info(tensor, dims, np.dtype(np.float32), dims[0] * 4)
        else:
            rows, columns = dims
            byte_shape = (rows, columns // 32 * 34)  # a Q8_0 block: fp16 scale + 32 int8
            writer.add_tensor_info(
                tensor, byte_shape, np.dtype(np.uint8), rows * byte_shape[1], Q8_0
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for index, (_name, dims) in enumerate(tensors):
        writer.write_tensor_data(encoded(random_values(dims, seed + index)))
    writer.close()
    os.replace(partial, path)
    return path


def requantize(quantize: Path, source: Path, target: Path, quant_type: str) -> None:
    partial = target.with_name(target.name + ".part")
    command = [str(quantize), "--allow-requantize", str(source), str(partial), quant_type]
    print("+", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        sys.exit(f"llama-quantize failed:\n{done.stderr[-3000:]}")
    os.replace(partial, target)


def main() -> None:
    from make_gguf_models import SHAPES

    from sluice.loader.sources import embedded_gguf_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quantize", type=Path, required=True, help="llama.cpp's llama-quantize")
    parser.add_argument("--shape", default="llama-8b", choices=[s for s in SHAPES if "llama" in s])
    parser.add_argument("--out", type=Path, default=Path("/work/peers/models"))
    parser.add_argument("--type", default="Q4_K_M")
    parser.add_argument("--context-length", type=int, default=131072)
    args = parser.parse_args()
    target = args.out / f"{args.shape}-{args.type}.gguf"
    if target.exists():
        sys.exit(f"{target} is already there")
    shape = {**make_1b_models.COMMON, **SHAPES[args.shape][2]}
    q8 = args.out / f"{args.shape}-Q8_0.gguf"
    write_random_gguf(q8, args.shape, shape, embedded_gguf_path(), args.context_length)
    print(f"{args.shape}: {q8} ({q8.stat().st_size / 1e6:.0f} MB)", flush=True)
    requantize(args.quantize, q8, target, args.type)
    q8.unlink()
    print(f"{args.shape}: {target} ({target.stat().st_size / 1e6:.0f} MB)", flush=True)


if __name__ == "__main__":
    main()
