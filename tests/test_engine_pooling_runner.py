"""The pooling runner against references: all-MiniLM-L6-v2 against
sentence-transformers' own embeddings, the tiny models against transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from sluice.apis.embeddings.inputs import (
    PoolingModelView,
    pair_inputs,
    pooling_backend,
    text_inputs,
)
from sluice.config import ModelConfig
from sluice.engine.pooling_runner import PoolingRunner
from sluice.loader.pooling_model import LoadedPoolingModel, load_pooling_model, pooling_spec_of
from sluice.models.pooling import finish
from tests.pooling_models import (
    build_tiny_bert,
    build_tiny_embedder,
    build_tiny_reranker,
    minilm_folder,
    reranker_token_ids,
)

REFERENCE = Path(__file__).parent / "data" / "minilm_sentence_transformers.json"
TEXTS = ["hello there", "a much longer text about pooling models and their batches", "x"]


def load(folder: Path, tmp_path: Path, task: str = "auto") -> LoadedPoolingModel:
    config = ModelConfig(
        model=str(folder), task=task, dtype="float32", quantization=None,
        activation_quantization=None, cache_dir=tmp_path,
    )  # fmt: skip
    spec = pooling_spec_of(config)
    assert spec is not None
    return load_pooling_model(config, spec)


def view(loaded: LoadedPoolingModel) -> PoolingModelView:
    backend = pooling_backend(loaded.tokenizer.backend)
    return PoolingModelView(
        loaded.name, backend, loaded.vocab_size, loaded.max_model_len, loaded.spec
    )


def embed(loaded: LoadedPoolingModel, texts: list[str]) -> torch.Tensor:
    inputs = text_inputs(texts, view(loaded), None, "input")
    return finish(PoolingRunner(loaded).execute(inputs), loaded.spec.normalize, None)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> LoadedPoolingModel:
    folder = minilm_folder(tmp_path_factory.mktemp("minilm"))
    return load(folder, tmp_path_factory.mktemp("cache"))


def test_minilm_embeddings_equal_sentence_transformers_within_1e_5_cosine(minilm):
    reference = json.loads(REFERENCE.read_text())
    expected = torch.tensor(reference["embeddings"])
    got = embed(minilm, reference["texts"])
    distance = 1 - F.cosine_similarity(got, expected)
    assert float(distance.abs().max()) < 1e-5
    assert torch.allclose(got.norm(dim=-1), torch.ones(len(got)), atol=1e-5)


def test_a_text_gets_the_same_embedding_alone_and_in_a_batch(minilm):
    batch = embed(minilm, TEXTS)
    for index, text in enumerate(TEXTS):
        alone = embed(minilm, [text])[0]
        assert float(1 - F.cosine_similarity(alone, batch[index], dim=0)) < 1e-6


def test_a_bert_without_pooling_files_embeds_its_cls_state_normalized(tmp_path_factory):
    minilm = minilm_folder(tmp_path_factory.mktemp("minilm"))
    folder, hf_model = build_tiny_bert(tmp_path_factory.mktemp("bert"), minilm)
    loaded = load(folder, tmp_path_factory.mktemp("cache"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        cls = hf_model(**batch).last_hidden_state[:, 0]
    distance = 1 - F.cosine_similarity(embed(loaded, TEXTS), F.normalize(cls, dim=-1))
    assert float(distance.abs().max()) < 1e-5


def test_a_cross_encoder_scores_pairs_as_transformers_with_a_sigmoid(tmp_path_factory):
    minilm = minilm_folder(tmp_path_factory.mktemp("minilm"))
    directory = tmp_path_factory.mktemp("cross")
    folder, hf_model = build_tiny_bert(directory, minilm, is_cross_encoder=True)
    loaded = load(folder, tmp_path_factory.mktemp("cache"))
    pairs = [("what is a cat", "a cat is an animal"), ("q", "a document about nothing")]
    inputs = pair_inputs(pairs, view(loaded), None, "documents")
    got = PoolingRunner(loaded).execute(inputs)[:, 0]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    batch = tokenizer(
        [q for q, _ in pairs], [d for _, d in pairs], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        expected = torch.sigmoid(hf_model(**batch).logits[:, 0])
    assert inputs[0].token_type_ids is not None and 1 in inputs[0].token_type_ids
    assert torch.allclose(got, expected, atol=1e-5)


def test_a_decoder_embedder_pools_its_last_token_as_transformers(tmp_path_factory):
    tiny = build_tiny_embedder(tmp_path_factory.mktemp("embedder"))
    loaded = load(tiny.path, tmp_path_factory.mktemp("cache"))
    assert loaded.spec.pooling == "last" and loaded.spec.normalize
    got = embed(loaded, TEXTS)
    for index, text in enumerate(TEXTS):
        ids = loaded.tokenizer.backend.encode(text).ids
        assert ids[-1] == 2  # the tokenizer's end token, as Qwen3-Embedding's
        with torch.no_grad():
            hidden = tiny.hf_model.model(torch.tensor([ids])).last_hidden_state[0, -1]
        assert float(1 - F.cosine_similarity(got[index], F.normalize(hidden, dim=0), dim=0)) < 1e-5


def test_a_decoder_reranker_scores_yes_against_no_as_transformers(tmp_path_factory):
    tiny = build_tiny_reranker(tmp_path_factory.mktemp("reranker"))
    loaded = load(tiny.path, tmp_path_factory.mktemp("cache"), task="score")
    yes, no = reranker_token_ids(tiny.path)
    assert (loaded.spec.yes_token_id, loaded.spec.no_token_id) == (yes, no)
    pairs = [("what is sluice", "an inference server"), ("tea", "a drink made of leaves")]
    inputs = pair_inputs(pairs, view(loaded), None, "documents")
    got = PoolingRunner(loaded).execute(inputs)[:, 0]
    for index, one in enumerate(inputs):
        with torch.no_grad():
            logits = tiny.hf_model(torch.tensor([one.token_ids])).logits[0, -1]
        expected = torch.sigmoid(logits[yes] - logits[no])
        assert abs(float(got[index]) - float(expected)) < 1e-5
