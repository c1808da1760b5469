"""Fuzz the embedding, rerank and score routes: random bodies against a live
server on a tiny BERT's pooling engine never cause a 5xx or a 422, and every
refusal is its API's error object (OpenAI's `{"error": {...}}` with the
field named, Ollama's `{"error": message}`).

Bodies mix plausible values of every field (texts empty and long, token
arrays in and out of the vocabulary, nested lists, dimensions, every
encoding_format, truncation in and out of range, documents as texts and
objects, top_n, Ollama's truncate, keep_alive and options) with arbitrary
JSON of any type and nesting in up to two fields, and bodies padded past the
worker threshold, as the chat fuzz does (tests/test_server_fuzz.py).
"""

from __future__ import annotations

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.config import EngineConfig, ModelConfig
from sluice.engine.inproc_client import InProcessEngineClient
from sluice.engine.pooling_core import PoolingCore, engine_core_for
from sluice.server.served_models.model_pool import ModelSpec
from sluice.server.served_models.served_model import ServedModel
from sluice.testing.json_strategies import deep, json_text, json_values
from sluice.testing.live_server import LiveServer
from tests.pooling_models import build_tiny_bert, minilm_folder

NUM_EXAMPLES = 200
texts = st.text(max_size=20) | st.just("word " * 80)  # past the tiny model's 64 tokens
token_ids = st.lists(st.integers(-2, 31000), max_size=8)
truncation = st.integers(-3, 100)
EMBEDDINGS = {
    "model": st.sampled_from(["bert", "other"]),
    "input": texts | st.lists(texts, max_size=3) | token_ids | st.lists(token_ids, max_size=3),
    "encoding_format": st.sampled_from(["float", "base64", "int8"]),
    "dimensions": st.integers(-1, 40),
    "user": st.text(max_size=3),
    "truncate_prompt_tokens": truncation,
    "add_special_tokens": st.booleans(),
}  # fmt: skip
documents = st.lists(texts | st.fixed_dictionaries({"text": texts}), max_size=4)
RERANK = {
    "model": EMBEDDINGS["model"], "query": texts, "documents": documents,
    "top_n": st.integers(-1, 6), "return_documents": st.booleans(),
    "truncate_prompt_tokens": truncation,
}  # fmt: skip
SCORE = {
    "model": EMBEDDINGS["model"], "text_1": texts | st.lists(texts, max_size=3),
    "text_2": texts | st.lists(texts, max_size=3), "truncate_prompt_tokens": truncation,
}  # fmt: skip
OLLAMA_EMBED = {
    "model": st.sampled_from(["bert", "bert:latest", "llama3"]),
    "input": texts | st.lists(texts, max_size=3), "truncate": st.booleans(),
    "dimensions": st.integers(-1, 40), "keep_alive": st.sampled_from(["5m", 0, -1]),
    "options": st.fixed_dictionaries({}, optional={"num_ctx": st.integers(-1, 9000)}),
}  # fmt: skip
OLLAMA_EMBEDDINGS = {"model": OLLAMA_EMBED["model"], "prompt": texts, "options": json_values}
PATHS = {
    "/v1/embeddings": EMBEDDINGS, "/v1/rerank": RERANK, "/v2/rerank": RERANK, "/rerank": RERANK,
    "/v1/score": SCORE, "/api/embed": OLLAMA_EMBED, "/api/embeddings": OLLAMA_EMBEDDINGS,
}  # fmt: skip


@st.composite
def requests(draw) -> tuple[str, object]:
    path = draw(st.sampled_from(sorted(PATHS)))
    valid = PATHS[path]
    body = draw(st.fixed_dictionaries({}, optional=valid))
    if path.startswith("/api"):
        body.setdefault("model", "bert")
    for field in draw(st.lists(st.sampled_from(sorted(valid)), max_size=2)):
        body[field] = draw(json_values | deep)
    if draw(st.sampled_from([False, False, False, True])):
        body["padding"] = "x" * 9000
    if draw(st.integers(0, 19)) == 0:
        return path, draw(json_values)
    return path, body


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    minilm = minilm_folder(tmp_path_factory.mktemp("minilm"))
    folder, _ = build_tiny_bert(tmp_path_factory.mktemp("bert"), minilm)
    model = ModelConfig(model=str(folder), cache_dir=tmp_path_factory.mktemp("cache"))
    core = engine_core_for(EngineConfig(model=model, multiprocess=False))
    assert isinstance(core, PoolingCore)
    loaded = core.loaded
    served = ServedModel(loaded.name, loaded.tokenizer, loaded.max_model_len, core.spec)
    spec = ModelSpec("bert", lambda: served, lambda: InProcessEngineClient(core), is_pinned=True)
    server = LiveServer(None, None, model_specs=[spec], startup_timeout_s=60)
    with server as live, httpx2.Client(base_url=live.url, timeout=30) as http:
        yield http


def check_answer(path: str, response: httpx2.Response) -> None:
    assert response.status_code < 500 and response.status_code != 422, response.text
    if response.status_code < 400:
        return
    error = response.json()
    if path.startswith("/api"):
        assert set(error) == {"error"} and isinstance(error["error"], str)
    else:
        assert set(error) == {"error"} and isinstance(error["error"]["message"], str)


def test_random_embedding_rerank_and_score_bodies_never_cause_a_5xx(client):
    counts = {"requests": 0, "ok": 0}

    @settings(max_examples=NUM_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(request=requests())
    def send(request: tuple[str, object]) -> None:
        path, body = request
        raw = json_text(body).encode()
        response = client.post(path, content=raw, headers={"Content-Type": "application/json"})
        counts["requests"] += 1
        counts["ok"] += response.status_code == 200
        check_answer(path, response)

    send()
    print(f"embeddings fuzz: {counts['requests']} requests, {counts['ok']} answered 200")
    assert counts["requests"] >= NUM_EXAMPLES and counts["ok"] > 0
