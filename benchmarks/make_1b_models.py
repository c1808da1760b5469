"""Random 1B-class models in bfloat16, as HF folders, for serving sluice and vLLM side by side.

    .venv/bin/python benchmarks/make_1b_models.py [OUT_DIR]    # default /work/peers/models

No download: each model is built by transformers from its family's config
class and filled with N(0, 0.02) weights (seed 0), then saved beside the
embedded model's tokenizer and chat template (vocabulary 49,152; `sluice
serve` must have converted the embedded model once, into its cache):
- `llama-1b`: LlamaForCausalLM, hidden 2,048, 16 layers, 32 heads of 64, 8 KV
  heads, MLP 8,192 (Llama 3.2 1B's shape but for the vocabulary): 1.07 B;
- `qwen3-1b`: Qwen3ForCausalLM, hidden 2,048, 20 layers, 16 heads of 128, 8
  KV heads, MLP 6,144, q/k norms: 1.11 B.
`tokenizer_class` is set to PreTrainedTokenizerFast, which vLLM's loader needs.
docs/MODELS.md has the side-by-side run.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
import transformers

COMMON = {
    "vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2, "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
}  # fmt: skip
FAMILIES = {
    "llama-1b": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "rope_theta": 500000.0}),
    "qwen3-1b": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {
        "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 20,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "rope_theta": 1000000.0}),
}  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def embedded_folder() -> Path:
    found = sorted(Path.home().joinpath(".cache/sluice").glob("SmolLM2-135M-Instruct*"))
    if not found:
        sys.exit("run `sluice serve` once first: it converts the embedded model into its cache")
    return found[0]


def write_model(name: str, out: Path, tokenizer_from: Path, family=None) -> Path:
    """`family`: (config class, model class, shape); default FAMILIES[name]."""
    config_class, model_class, shape = family or FAMILIES[name]
    folder = out / name
    torch.manual_seed(0)
    model = model_class._from_config(config_class(**{**COMMON, **shape}), dtype=torch.bfloat16)
    for parameter in model.parameters():
        torch.nn.init.normal_(parameter, std=0.02)
    model.save_pretrained(folder)
    for file in TOKENIZER_FILES:
        shutil.copy(tokenizer_from / file, folder / file)
    tokenizer_config = folder / "tokenizer_config.json"
    settings = json.loads(tokenizer_config.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config.write_text(json.dumps(settings, indent=1))
    count = sum(p.numel() for p in model.parameters())
    print(f"{name}: {count / 1e9:.2f} B parameters -> {folder}", flush=True)
    return folder


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/peers/models")
    source = embedded_folder()
    for name in FAMILIES:
        write_model(name, out, source)


if __name__ == "__main__":
    main()
