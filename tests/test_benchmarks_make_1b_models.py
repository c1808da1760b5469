"""benchmarks/make_1b_models.py on a tiny shape: a loadable folder with the tokenizer beside it."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import transformers

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
make = importlib.import_module("make_1b_models")


def test_a_family_is_written_random_in_bfloat16_with_the_tokenizer_vllm_reads(
    tmp_path, monkeypatch
):
    tokenizer = tmp_path / "embedded"
    tokenizer.mkdir()
    for file in make.TOKENIZER_FILES:
        (tokenizer / file).write_text("{}" if file.endswith(".json") else "{{ messages }}")
    tiny = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}  # fmt: skip
    monkeypatch.setattr(make, "COMMON", {**make.COMMON, "vocab_size": 128})
    for name in make.FAMILIES:
        config_class, model_class, _ = make.FAMILIES[name]
        monkeypatch.setitem(make.FAMILIES, name, (config_class, model_class, tiny))
        folder = make.write_model(name, tmp_path / "out", tokenizer)
        config = json.loads((folder / "config.json").read_text())
        assert config["architectures"] == [model_class.__name__]
        assert config["dtype"] == "bfloat16" and config["vocab_size"] == 128
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        assert settings["tokenizer_class"] == "PreTrainedTokenizerFast"
        model = transformers.AutoModelForCausalLM.from_pretrained(folder)
        weights = model.model.layers[0].mlp.up_proj.weight.float()
        assert 0.01 < weights.std().item() < 0.03  # N(0, 0.02), not an initialiser's
