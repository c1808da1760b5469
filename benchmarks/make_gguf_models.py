"""Random Llama-shaped models as Q4_K_M GGUF files, quantized by llama.cpp's own tools.

    .venv/bin/python benchmarks/make_gguf_models.py --llama-cpp DIR --quantize BIN [--out DIR]
        [--shapes llama-1b llama-3b llama-8b] [--type Q4_K_M]

Needs `sentencepiece` installed (llama.cpp's converter imports it for Llama vocabularies).
DIR is llama.cpp's source tree (the `llama-cpp-python` sdist's vendor/llama.cpp),
BIN its built `llama-quantize`. For each shape: the HF folder of
make_1b_models.py (random N(0, 0.02) bfloat16 weights, the embedded model's
tokenizer, vocabulary 49,152), llama.cpp's `convert_hf_to_gguf.py` to an F16
GGUF, then `llama-quantize` to the type asked; the F16 file is removed after.
Shapes (Llama 3.2 1B / 3B and Llama 3.1 8B but for the vocabulary):
- `llama-1b`: hidden 2,048, 16 layers, 32 heads of 64, 8 KV heads, MLP 8,192, tied;
- `llama-3b`: hidden 3,072, 28 layers, 24 heads of 128, 8 KV heads, MLP 8,192, tied;
- `llama-8b`: hidden 4,096, 32 layers, 32 heads of 128, 8 KV heads, MLP 14,336;
- `qwen3-moe-a3b-3l`: Qwen3-30B-A3B's layer (hidden 2,048, 128 experts of width 768,
  top 8 with norm_topk_prob, 32 heads of 128, 4 KV heads) but 3 layers of its 48 and
  the 49,152 vocabulary, tied: 1.9 B, 1.1 GB in Q4_K_M. Three layers keep the random
  bfloat16 model (built whole in memory) under 4 GB; per token it reads the same
  experts' bytes a layer as the full model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import transformers

sys.path.insert(0, str(Path(__file__).parent))
import make_1b_models  # noqa: E402

SHAPES = {
    "llama-1b": make_1b_models.FAMILIES["llama-1b"],
    "llama-3b": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {
        "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
        "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
        "rope_theta": 500000.0}),
    "llama-8b": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rope_theta": 500000.0, "tie_word_embeddings": False}),
    "qwen3-moe-a3b-3l": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, {
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 3, "num_attention_heads": 32, "num_key_value_heads": 4,
        "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "rope_theta": 1000000.0}),
}  # fmt: skip


def gguf_file(name: str, out: Path, llama_cpp: Path, quantize: Path, quant_type: str) -> Path:
    target = out / f"{name}-{quant_type}.gguf"
    if target.exists():
        print(f"{name}: {target} already there", flush=True)
        return target
    folder = out / name
    if not (folder / "config.json").exists():
        make_1b_models.write_model(name, out, make_1b_models.embedded_folder(), SHAPES[name])
    f16 = out / f"{name}-F16.gguf"
    convert = llama_cpp / "convert_hf_to_gguf.py"
    run([sys.executable, str(convert), str(folder), "--outtype", "f16", "--outfile", str(f16)])
    run([str(quantize), str(f16), str(target), quant_type])
    f16.unlink()
    print(f"{name}: {target} ({target.stat().st_size / 1e6:.0f} MB)", flush=True)
    return target


def run(command: list[str]) -> None:
    print("+", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{command[0]} failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, required=True)
    parser.add_argument("--quantize", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("/work/peers/models"))
    parser.add_argument("--shapes", nargs="+", default=["llama-1b", "llama-3b"], choices=SHAPES)
    parser.add_argument("--type", default="Q4_K_M")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.shapes:
        gguf_file(name, args.out, args.llama_cpp, args.quantize, args.type)


if __name__ == "__main__":
    main()
