"""benchmarks/write_random_gguf.py on a tiny shape: llama.cpp's names and keys, the tokenizer copied."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import gguf
import numpy as np

from tests.gguf_files import add_byte_bpe_vocab

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
write = importlib.import_module("write_random_gguf")

TINY = {
    "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}  # fmt: skip


def tokenizer_gguf(path: Path) -> Path:
    """A GGUF holding only a tokenizer: 320 byte-level BPE tokens and a chat template."""
    writer = gguf.GGUFWriter(path, "llama")
    add_byte_bpe_vocab(writer, 320, ["<unk>", "<s>", "</s>"])
    writer.add_chat_template("{{ messages }}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_random_llama_is_written_as_q8_0_with_the_tokenizer_copied(tmp_path):
    template = tokenizer_gguf(tmp_path / "tokenizer.gguf")
    out = tmp_path / "out"
    out.mkdir()
    path = write.write_random_gguf(out / "tiny.gguf", "tiny", TINY, template, 131072)
    assert [p.name for p in out.iterdir()] == ["tiny.gguf"]  # no .part left
    reader = gguf.GGUFReader(path)
    keys = {k: f.contents() for k, f in reader.fields.items() if k.startswith("llama.")}
    assert keys["llama.context_length"] == 131072 and keys["llama.block_count"] == 2
    assert keys["llama.attention.head_count_kv"] == 2 and keys["llama.rope.dimension_count"] == 32
    source = gguf.GGUFReader(template)
    tokenizer_keys = [k for k in source.fields if k.startswith("tokenizer.")]
    assert len(tokenizer_keys) == 8  # model, pre, tokens, types, merges, bos, eos, template
    for key in tokenizer_keys:
        assert reader.fields[key].contents() == source.fields[key].contents()
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 3 + 2 * 9  # embedding, norm, output; nine a layer
    assert tensors["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    q = tensors["blk.1.attn_q.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert list(q.shape) == [64, 128]  # GGUF order: columns first
    assert list(tensors["blk.0.ffn_down.weight"].shape) == [96, 64]
    values = gguf.quants.dequantize(q.data, q.tensor_type)
    assert 0.018 < float(np.std(values)) < 0.022  # N(0, 0.02)


def test_a_tied_shape_has_no_output_matrix():
    names = [name for name, _ in write.tensor_shapes({**TINY, "tie_word_embeddings": True})]
    assert "output.weight" not in names and "token_embd.weight" in names
