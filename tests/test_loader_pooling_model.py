"""Which models pool, and how: `describe_pooling`'s table, the context, refusals."""

from __future__ import annotations

import json
import shutil

import pytest

from sluice.config import ModelConfig
from sluice.errors import ModelLoadError
from sluice.loader.pooling_model import pooling_max_model_len, pooling_spec_of
from tests.model_factory import build_tiny_model, write_tiny_tokenizer
from tests.pooling_models import (
    build_tiny_bert,
    build_tiny_embedder,
    build_tiny_reranker,
    minilm_folder,
)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    return minilm_folder(tmp_path_factory.mktemp("minilm"))


@pytest.fixture(scope="module")
def plain_decoder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decoder")
    build_tiny_model("qwen3_tied", folder)
    write_tiny_tokenizer(folder)
    return folder


def spec(folder, task="auto"):
    return pooling_spec_of(ModelConfig(model=str(folder), task=task))


def test_minilm_embeds_by_its_sentence_transformers_mean_pooling_normalized(minilm):
    got = spec(minilm)
    assert (got.task, got.pooling, got.normalize, got.num_dimensions) == (
        "embed",
        "mean",
        True,
        384,
    )
    assert got.pair_format == "embeddings" and got.matryoshka_dimensions == ()


def test_the_context_is_sentence_transformers_max_seq_length_capped_by_the_flag(minilm):
    assert pooling_max_model_len(minilm, None) == 256
    assert pooling_max_model_len(minilm, 100) == 100
    with pytest.raises(ModelLoadError, match="exceeds the model's limit 256"):
        pooling_max_model_len(minilm, 300)


def test_a_bert_without_pooling_files_embeds_its_cls_token(minilm, tmp_path):
    folder, _ = build_tiny_bert(tmp_path, minilm)
    got = spec(folder)
    assert (got.pooling, got.normalize) == ("cls", True)


def test_a_one_label_cross_encoder_scores_pairs_with_a_sigmoid(minilm, tmp_path):
    folder, _ = build_tiny_bert(tmp_path, minilm, is_cross_encoder=True)
    got = spec(folder)
    assert (got.task, got.pair_format, got.apply_sigmoid) == ("score", "pair", True)


def test_a_cross_encoder_with_two_labels_is_refused_by_name(minilm, tmp_path):
    folder, _ = build_tiny_bert(tmp_path, minilm, is_cross_encoder=True)
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="2 labels"):
        spec(folder)


def test_an_encoder_asked_to_generate_is_refused(minilm):
    with pytest.raises(ModelLoadError, match="encoder"):
        spec(minilm, "generate")


def test_a_decoder_generates_unless_its_files_or_the_task_say_it_pools(plain_decoder):
    assert spec(plain_decoder) is None
    embedder = spec(plain_decoder, "embed")
    assert (embedder.task, embedder.pooling, embedder.normalize) == ("embed", "last", True)


def test_a_decoder_with_sentence_transformers_pooling_embeds_by_it(tmp_path):
    build_tiny_embedder(tmp_path)
    got = spec(tmp_path)
    assert (got.pooling, got.normalize, got.matryoshka_dimensions) == ("last", True, (0,))
    assert got.check_dimensions(16) is None
    assert "between 1 and 64" in got.check_dimensions(65)


def test_a_decoder_scores_by_its_yes_and_no_tokens(tmp_path):
    build_tiny_reranker(tmp_path)
    got = spec(tmp_path, "score")
    assert (got.pair_format, got.yes_token_id, got.no_token_id) == ("yes_no", 259, 260)


def test_a_decoder_without_single_yes_and_no_tokens_cannot_score(plain_decoder):
    with pytest.raises(ModelLoadError, match="'yes' is 3 tokens"):
        spec(plain_decoder, "score")


def test_sentence_transformers_modules_sluice_does_not_run_are_named(minilm, tmp_path):
    folder = tmp_path / "dense"
    shutil.copytree(minilm, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense",
                    "type": "sentence_transformers.models.Dense"})  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError, match="Dense"):
        spec(folder)
