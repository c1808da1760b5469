"""Pooling models (embedders, rerankers): which models are, and loading them.

`describe_pooling` decides from a model's small files what it serves, the
same in the server process (`launch.describe_model`) and the engine process
(`load_pooling_model`), which check each other through `EngineReady.pooling`:

    --task      files                                         serves
    auto        BertForSequenceClassification (one label)     score: cross-encoder
    auto        BertModel                                     embed (ST pooling, else [CLS])
    auto        a decoder with sentence-transformers pooling  embed (Qwen3-Embedding: last token)
    auto        any other decoder                             generate (not here: None)
    embed       a decoder without ST files                    embed: last token, normalized
    score       a decoder                                     score: "yes" vs "no" (Qwen3-Reranker)
    score       an embedding model                            score: cosine of the embeddings

sentence-transformers' files: modules.json lists the modules in order;
a `Pooling` module's folder holds its config.json (pooling_mode_*), a
`Normalize` module normalizes. Modules sluice does not run (Dense layers)
are a ModelLoadError naming them. The context is the model's
max_position_embeddings, capped by sentence_bert_config.json's max_seq_length
(what sentence-transformers truncates to) and by --max-model-len.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.config import ModelConfig
from sluice.engine.pooling_params import PoolingSpec, PoolingType
from sluice.errors import ModelLoadError
from sluice.loader.loaded_model import LoadedModel, load_model, read_config_json, torch_dtype
from sluice.loader.sources import resolve_source
from sluice.loader.weights import checkpoint_files, iter_weights
from sluice.models.bert import BERT_ARCHITECTURES, BertConfig, BertEncoder
from sluice.models.families.registry import parse_hf_config
from sluice.tokenizer import Tokenizer

_ST_POOLING_MODES: dict[str, PoolingType] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
_ST_MODULES_RUN = ("Transformer", "Pooling", "Normalize")


@dataclass(slots=True)
class LoadedPoolingModel:
    spec: PoolingSpec
    tokenizer: Tokenizer
    # Longest input, in tokens (the model's limit, capped as the module docstring says).
    max_model_len: int
    name: str
    vocab_size: int
    # Exactly one of the two: a BERT encoder, or a decoder (its hidden states, its logits).
    encoder: BertEncoder | None = None
    decoder: LoadedModel | None = None


def pooling_spec_of(config: ModelConfig) -> PoolingSpec | None:
    """What `config`'s model serves, if it pools (None: it generates); small files only."""
    source = resolve_source(config.model)
    if source.kind != "hf_folder":
        if config.task in ("embed", "score"):
            raise ModelLoadError("embedding and score models load from Hugging Face folders")
        return None
    return describe_pooling(source.path, config.task, Tokenizer.from_folder(source.path))


def describe_pooling(folder: Path, task: str, tokenizer: Tokenizer) -> PoolingSpec | None:
    """The model's `PoolingSpec` under `task` (the table above), or None to generate."""
    config_json = read_config_json(folder)
    architecture = (config_json.get("architectures") or [""])[0]
    if architecture in BERT_ARCHITECTURES:
        if task == "generate":
            raise ModelLoadError(
                f"{architecture} is an encoder: it embeds or scores, not generates"
            )
        return _encoder_spec(folder, BertConfig.from_hf(config_json), task)
    if task == "generate":
        return None
    parse_hf_config(config_json)  # a decoder sluice runs, or the one-line refusal
    st_pooling = _sentence_transformers_pooling(folder)
    hidden_size = int(config_json["hidden_size"])
    if task == "score":
        return _yes_no_spec(tokenizer)
    if st_pooling is None and task == "auto":
        return None
    pooling, normalize = st_pooling or ("last", True)
    return PoolingSpec(
        task="embed",
        pooling=pooling,
        normalize=normalize,
        num_dimensions=hidden_size,
        matryoshka_dimensions=_matryoshka(config_json),
    )


def _encoder_spec(folder: Path, config: BertConfig, task: str) -> PoolingSpec:
    if config.num_labels:
        if config.num_labels != 1 or task == "embed":
            raise ModelLoadError(
                f"{config.architecture} with {config.num_labels} labels: sluice serves "
                "one-label cross-encoders, for scoring"
            )
        return PoolingSpec(
            task="score", pooling="cls", normalize=False, num_dimensions=1,
            pair_format="pair", apply_sigmoid=True,
        )  # fmt: skip
    pooling, normalize = _sentence_transformers_pooling(folder) or ("cls", True)
    return PoolingSpec(
        task="score" if task == "score" else "embed",
        pooling=pooling,
        normalize=normalize,
        num_dimensions=config.hidden_size,
        matryoshka_dimensions=_matryoshka(read_config_json(folder)),
    )


def _yes_no_spec(tokenizer: Tokenizer) -> PoolingSpec:
    ids = {}
    for word in ("yes", "no"):
        token_ids = tokenizer.encode(word)
        if len(token_ids) != 1:
            raise ModelLoadError(
                f"--task score on a decoder compares the tokens 'yes' and 'no' "
                f"(Qwen3-Reranker); {word!r} is {len(token_ids)} tokens in this tokenizer"
            )
        ids[word] = token_ids[0]
    return PoolingSpec(
        task="score", pooling="last", normalize=False, num_dimensions=1,
        pair_format="yes_no", yes_token_id=ids["yes"], no_token_id=ids["no"],
    )  # fmt: skip


def _sentence_transformers_pooling(folder: Path) -> tuple[PoolingType, bool] | None:
    """(pooling, normalize) from modules.json; None without a Pooling module."""
    modules = _read_json(folder / "modules.json")
    if not isinstance(modules, list):
        return None
    kinds = [str(module.get("type", "")).rpartition(".")[2] for module in modules]
    unknown = [kind for kind in kinds if kind not in _ST_MODULES_RUN]
    if unknown:
        raise ModelLoadError(f"sentence-transformers modules sluice does not run: {unknown}")
    if "Pooling" not in kinds:
        return None
    pooling_path = folder / modules[kinds.index("Pooling")].get("path", "") / "config.json"
    pooling_config = _read_json(pooling_path)
    if not isinstance(pooling_config, dict):
        raise ModelLoadError(f"no pooling config at {pooling_path}")
    on = [key for key, value in pooling_config.items() if key.startswith("pooling_mode_") and value]
    if len(on) != 1 or on[0] not in _ST_POOLING_MODES:
        raise ModelLoadError(
            f"pooling {on} in {pooling_path}: sluice pools by one of {', '.join(_ST_POOLING_MODES)}"
        )
    return _ST_POOLING_MODES[on[0]], "Normalize" in kinds


def _matryoshka(config_json: dict[str, Any]) -> tuple[int, ...]:
    dimensions = config_json.get("matryoshka_dimensions")
    if isinstance(dimensions, list) and all(isinstance(d, int) for d in dimensions):
        return tuple(dimensions)
    return (0,) if config_json.get("is_matryoshka") is True else ()


def pooling_max_model_len(folder: Path, requested: int | None) -> int:
    """The longest input: the model's positions, sentence-transformers' cap, the user's cap."""
    limit = int(read_config_json(folder).get("max_position_embeddings", 512))
    st_config = _read_json(folder / "sentence_bert_config.json")
    if isinstance(st_config, dict) and isinstance(st_config.get("max_seq_length"), int):
        limit = min(limit, st_config["max_seq_length"])
    if requested is None:
        return limit
    if requested > limit:
        raise ModelLoadError(f"max_model_len {requested} exceeds the model's limit {limit}")
    return requested


def load_pooling_model(config: ModelConfig, spec: PoolingSpec) -> LoadedPoolingModel:
    """The model `spec` describes (from `pooling_spec_of(config)`), loaded."""
    source = resolve_source(config.model)
    folder = source.path
    tokenizer = Tokenizer.from_folder(folder)
    max_model_len = pooling_max_model_len(folder, config.max_model_len)
    config_json = read_config_json(folder)
    if (config_json.get("architectures") or [""])[0] not in BERT_ARCHITECTURES:
        decoder = load_model(config)
        return LoadedPoolingModel(
            spec, tokenizer, min(max_model_len, decoder.max_model_len), source.name,
            decoder.model_config.vocab_size, decoder=decoder,
        )  # fmt: skip
    bert_config = BertConfig.from_hf(config_json)
    # Encoders run in float32 unless asked: their embeddings are compared by cosine
    # to sentence-transformers' (1e-5), which bfloat16's 8 bits cannot hold.
    dtype = torch_dtype("float32" if config.dtype == "auto" else config.dtype)
    encoder = BertEncoder(bert_config, dtype, config.device)
    encoder.load_weights(iter_weights(checkpoint_files(folder)))
    encoder.eval()
    return LoadedPoolingModel(
        spec, tokenizer, max_model_len, source.name, bert_config.vocab_size, encoder=encoder
    )


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"unreadable {path}: {exc}") from exc
