"""Embeddings, rerank and score over a real socket: all-MiniLM-L6-v2 and a
tiny cross-encoder on their pooling engines (in this process), `sluice
serve --model` on MiniLM (its own engine process), and a generation model's
server, with every refusal in its API's own error shape."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import numpy as np
import ollama
import openai
import pytest
from langchain_ollama import OllamaEmbeddings

from sluice.apis.surface import POOLING_ROUTES
from sluice.config import EngineConfig, ModelConfig
from sluice.engine.inproc_client import InProcessEngineClient
from sluice.engine.pooling_core import PoolingCore, engine_core_for
from sluice.server.http.launch import describe_model
from sluice.server.served_models.model_pool import ModelSpec
from sluice.server.served_models.served_model import ServedModel
from sluice.testing import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from tests.pooling_models import (
    build_tiny_bert,
    build_tiny_embedder,
    build_tiny_reranker,
    minilm_folder,
)
from tests.sluice_server import SERVER_ENV, stop, wait_until_healthy

REFERENCE = json.loads(
    (Path(__file__).parent / "data" / "minilm_sentence_transformers.json").read_text()
)
MINILM = "all-MiniLM-L6-v2"
LONG_TEXT = "retrieval " * 300  # ~300 tokens, past MiniLM's 256


def pooling_server(folder: Path, cache: Path, name: str) -> LiveServer:
    """The app over an in-process pooling engine on `folder`, served as `name`."""
    config = EngineConfig(model=ModelConfig(model=str(folder), cache_dir=cache), multiprocess=False)
    core = engine_core_for(config)
    assert isinstance(core, PoolingCore)
    loaded = core.loaded
    served = ServedModel(loaded.name, loaded.tokenizer, loaded.max_model_len, core.spec)
    spec = ModelSpec(name, lambda: served, lambda: InProcessEngineClient(core), is_pinned=True)
    return LiveServer(None, None, model_specs=[spec], startup_timeout_s=60)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> Path:
    return minilm_folder(tmp_path_factory.mktemp("minilm"))


@pytest.fixture(scope="module")
def server(minilm, tmp_path_factory) -> Iterator[LiveServer]:
    with pooling_server(minilm, tmp_path_factory.mktemp("cache"), MINILM) as live:
        yield live


@pytest.fixture(scope="module")
def reranker(minilm, tmp_path_factory) -> Iterator[LiveServer]:
    folder, _ = build_tiny_bert(tmp_path_factory.mktemp("cross"), minilm, is_cross_encoder=True)
    with pooling_server(folder, tmp_path_factory.mktemp("cache"), "cross") as live:
        yield live


def post(live: LiveServer, path: str, body: dict) -> httpx2.Response:
    return httpx2.post(live.url + path, json=body, timeout=60)


def cosine_distance(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(1 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_openai_client_gets_sentence_transformers_embeddings(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    texts = REFERENCE["texts"]
    # The SDK asks for base64 and decodes it; floats are the other format.
    for encoding in ("base64", "float"):
        answer = client.embeddings.create(model=MINILM, input=texts, encoding_format=encoding)
        assert [item.index for item in answer.data] == list(range(len(texts)))
        if encoding == "base64":
            vectors = [np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in answer.data]
        else:
            vectors = [d.embedding for d in answer.data]
        for got, expected in zip(vectors, REFERENCE["embeddings"], strict=True):
            assert cosine_distance(got, expected) < 1e-5
        assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(texts)


def test_every_input_shape_embeds_and_counts_its_tokens(server):
    one = post(server, "/v1/embeddings", {"input": "Hello world"}).json()
    assert one["object"] == "list" and one["model"] == MINILM
    assert one["usage"] == {"prompt_tokens": 4, "total_tokens": 4}  # [CLS] hello world [SEP]
    ids = [101, 7592, 2088, 102]
    for body in ({"input": ids}, {"input": [ids, ids]}, {"input": ["Hello world"] * 2}):
        answer = post(server, "/v1/embeddings", body).json()
        for item in answer["data"]:
            assert cosine_distance(item["embedding"], one["data"][0]["embedding"]) < 1e-6
        assert answer["usage"]["prompt_tokens"] == 4 * len(answer["data"])


def test_concurrent_requests_get_the_answers_they_get_alone(server):
    texts = [f"sentence number {i} about {'x' * i}" for i in range(24)]
    alone = {t: post(server, "/v1/embeddings", {"input": t}).json() for t in texts[:4]}
    with ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda i: post(server, "/v1/embeddings", {"input": texts[i::4]}), range(4))
        )
    for text, answer in zip(texts[:4], answers, strict=True):
        got = answer.json()["data"][0]["embedding"]
        assert cosine_distance(got, alone[text]["data"][0]["embedding"]) < 1e-6


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": ""}, "input", "empty"),
        ({"input": []}, "input", "empty"),
        ({"input": ["a", ""]}, "input", "input 1 is an empty string"),
        ({"input": [[101, 102], []]}, "input", "empty list"),
        ({"input": 5}, "input", ""),
        ({"input": [1, "a"]}, "input", ""),
        ({"input": [True]}, "input", ""),
        ({"input": [-1]}, "input", "outside the vocabulary"),
        ({"input": "a", "dimensions": 8}, "dimensions", "not Matryoshka"),
        ({"input": "a", "dimensions": 0}, "dimensions", ""),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", ""),
        ({"input": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens", ""),
        ({"input": LONG_TEXT}, "input", "at most 256"),
        ({"input": "a", "model": "other"}, "model", "does not exist"),
    ],
)
def test_bad_embedding_requests_are_openai_400s_naming_the_field(server, body, param, words):
    response = post(server, "/v1/embeddings", body)
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_truncation_cuts_a_long_input_to_the_limit_keeping_its_end_token(server):
    answer = post(server, "/v1/embeddings", {"input": LONG_TEXT, "truncate_prompt_tokens": -1})
    assert answer.json()["usage"]["prompt_tokens"] == 256
    cut = post(server, "/v1/embeddings", {"input": LONG_TEXT, "truncate_prompt_tokens": 10})
    same = post(server, "/v1/embeddings", {"input": [101] + [26384] * 8 + [102]})
    assert cut.json()["usage"]["prompt_tokens"] == 10
    distance = cosine_distance(
        cut.json()["data"][0]["embedding"], same.json()["data"][0]["embedding"]
    )
    assert distance < 1e-6


def test_generation_routes_refuse_an_embedding_model_in_their_own_shapes(server):
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400
    assert "is an embedding model" in chat.json()["error"]["message"]
    assert chat.json()["error"]["param"] == "model"
    messages = post(server, "/v1/messages", {"model": MINILM, "max_tokens": 5,
                                             "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert messages.status_code == 400 and messages.json()["type"] == "error"
    assert "is an embedding model" in messages.json()["error"]["message"]
    ollama = post(
        server, "/api/chat", {"model": MINILM, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert ollama.status_code == 400 and "is an embedding model" in ollama.json()["error"]
    generate = post(server, "/api/generate", {"model": MINILM, "prompt": "hi"})
    assert generate.status_code == 400 and "is an embedding model" in generate.json()["error"]
    for path, body in (("/v1/completions", {"prompt": "hi"}), ("/v1/responses", {"input": "hi"})):
        refused = post(server, path, {"model": MINILM, **body})
        assert refused.status_code == 400, path
        assert "is an embedding model" in refused.json()["error"]["message"], path


def test_ollama_embed_truncates_by_default_and_refuses_when_asked_not_to(server):
    answer = post(
        server, "/api/embed", {"model": MINILM + ":latest", "input": ["Hello world", LONG_TEXT]}
    )
    body = answer.json()
    assert set(body) == {
        "model",
        "embeddings",
        "total_duration",
        "load_duration",
        "prompt_eval_count",
    }
    assert body["prompt_eval_count"] == 4 + 256 and len(body["embeddings"]) == 2
    one = post(server, "/v1/embeddings", {"input": "Hello world"}).json()["data"][0]["embedding"]
    assert cosine_distance(body["embeddings"][0], one) < 1e-6
    refused = post(server, "/api/embed", {"model": MINILM, "input": LONG_TEXT, "truncate": False})
    assert refused.status_code == 400 and "at most 256" in refused.json()["error"]
    empty = post(server, "/api/embed", {"model": MINILM, "input": []}).json()
    assert empty["embeddings"] == []
    old = post(server, "/api/embeddings", {"model": MINILM, "prompt": "Hello world"}).json()
    assert cosine_distance(old["embedding"], one) < 1e-6
    wrong = post(server, "/api/embed", {"model": MINILM, "input": [1, 2]})
    assert wrong.status_code == 400 and "input" in wrong.json()["error"]


def test_the_ollama_client_and_langchain_embed_as_sentence_transformers(server):
    texts, expected = REFERENCE["texts"][:3], REFERENCE["embeddings"][:3]
    client = ollama.Client(host=server.url)
    answer = client.embed(model=MINILM, input=texts)
    assert answer.model == MINILM and answer.prompt_eval_count > len(texts)
    for got, reference in zip(answer.embeddings, expected, strict=True):
        assert cosine_distance(got, reference) < 1e-5
    old = client.embeddings(model=MINILM, prompt=texts[0])
    assert cosine_distance(old.embedding, expected[0]) < 1e-5
    langchain = OllamaEmbeddings(model=MINILM, base_url=server.url)
    for got, reference in zip(langchain.embed_documents(texts), expected, strict=True):
        assert cosine_distance(got, reference) < 1e-5
    assert cosine_distance(langchain.embed_query(texts[1]), expected[1]) < 1e-5


def test_an_embedding_model_reranks_and_scores_by_cosine_similarity(server):
    documents = ["The cat sat on the mat.", "Stock markets fell today.", "A kitten is a young cat."]
    body = {"model": MINILM, "query": "cats", "documents": documents, "top_n": 2}
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        answer = post(server, path, body).json()
        indices = [result["index"] for result in answer["results"]]
        scores = [result["relevance_score"] for result in answer["results"]]
        assert len(indices) == 2 and 1 not in indices and scores == sorted(scores, reverse=True)
        assert answer["results"][0]["document"]["text"] == documents[indices[0]]
    score = post(server, "/v1/score", {"text_1": "cats", "text_2": documents}).json()
    assert [item["index"] for item in score["data"]] == [0, 1, 2]
    by_score = sorted(range(3), key=lambda i: -score["data"][i]["score"])
    assert by_score[:2] == indices


def test_a_too_long_rerank_or_score_pair_names_the_limit_unless_truncated(reranker):
    body = {"query": "which", "documents": ["short", LONG_TEXT]}
    refused = post(reranker, "/v1/rerank", body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "documents"
    assert "cross takes at most 64" in refused.json()["error"]["message"]  # the tiny one's
    score = post(reranker, "/v1/score", {"text_1": "which", "text_2": LONG_TEXT})
    assert score.status_code == 400 and "at most 64" in score.json()["error"]["message"]
    cut = post(reranker, "/v1/rerank", {**body, "truncate_prompt_tokens": -1})
    assert cut.status_code == 200, cut.text
    assert cut.json()["usage"]["total_tokens"] == 5 + 64  # [CLS] which [SEP] short [SEP]
    scored = post(reranker, "/v1/score",
                  {"text_1": "which", "text_2": LONG_TEXT, "truncate_prompt_tokens": 12})  # fmt: skip
    assert scored.status_code == 200 and scored.json()["usage"]["prompt_tokens"] == 12


def test_a_cross_encoder_reranks_by_its_own_scores_and_refuses_to_embed(reranker):
    documents = ["first document", "second one", "a third"]
    body = {"query": "which", "documents": documents, "return_documents": False}
    answer = post(reranker, "/v1/rerank", body).json()
    score = post(reranker, "/v1/score", {"text_1": "which", "text_2": documents}).json()
    expected = sorted(range(3), key=lambda i: -score["data"][i]["score"])
    assert [result["index"] for result in answer["results"]] == expected
    assert all("document" not in result for result in answer["results"])
    assert all(0 < item["score"] < 1 for item in score["data"])  # a sigmoid's
    refused = post(reranker, "/v1/embeddings", {"input": "text"})
    assert refused.status_code == 400 and "is a reranker" in refused.json()["error"]["message"]
    mismatched = post(reranker, "/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert mismatched.status_code == 400 and mismatched.json()["error"]["param"] == "text_2"


def test_a_generation_model_refuses_embeddings_in_each_api_shape():
    engine = FakeEngine(lambda request_id, prompt, params: iter([5]), seed=1)
    with LiveServer(engine, ChatFakeTokenizer()) as live:
        openai_error = post(live, "/v1/embeddings", {"input": "text"})
        assert openai_error.status_code == 400
        assert "is a generation model" in openai_error.json()["error"]["message"]
        ollama_error = post(live, "/api/embed", {"model": live.model_name, "input": "text"})
        assert (
            ollama_error.status_code == 400 and "generation model" in ollama_error.json()["error"]
        )
        rerank_error = post(live, "/v1/rerank", {"query": "q", "documents": ["d"]})
        assert rerank_error.status_code == 400
        assert "is a generation model" in rerank_error.json()["error"]["message"]
        score_error = post(live, "/v1/score", {"text_1": "q", "text_2": "d"})
        assert score_error.status_code == 400
        assert "is a generation model" in score_error.json()["error"]["message"]
        old_error = post(live, "/api/embeddings", {"model": live.model_name, "prompt": "text"})
        assert old_error.status_code == 400 and "generation model" in old_error.json()["error"]


@contextlib.contextmanager
def sluice_serve(*flags: str, log_path: Path) -> Iterator[str]:
    command = [
        sys.executable,
        "-m",
        "sluice.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *flags,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, env={**os.environ, **SERVER_ENV}, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            yield wait_until_healthy(process, log_path)
        finally:
            stop(process)


def test_sluice_serve_model_serves_minilm_from_its_own_engine_process(minilm, tmp_path):
    flags = ("--model", str(minilm), "--cache-dir", str(tmp_path / "cache"))
    with sluice_serve(*flags, log_path=tmp_path / "serve.log") as url:
        models = httpx2.get(url + "/v1/models", timeout=10).json()
        assert [card["id"] for card in models["data"]] == [MINILM]
        answer = httpx2.post(
            url + "/v1/embeddings", json={"input": REFERENCE["texts"][:2]}, timeout=60
        )
        for got, expected in zip(answer.json()["data"], REFERENCE["embeddings"], strict=False):
            assert cosine_distance(got["embedding"], expected) < 1e-5


def access_line(caplog) -> str:
    """The one access line, written after the response's last byte was sent."""
    deadline = time.monotonic() + 30
    while not (lines := [r.getMessage() for r in caplog.records if r.name == "sluice.access"]):
        assert time.monotonic() < deadline, "no access line"
        time.sleep(0.005)
    (line,) = lines
    return line


POOLING_BODIES = {
    "/v1/embeddings": {"input": "hi"},
    "/v1/rerank": {"query": "q", "documents": ["d"]},
    "/rerank": {"query": "q", "documents": ["d"]},
    "/v2/rerank": {"query": "q", "documents": ["d"]},
    "/v1/score": {"text_1": "q", "text_2": "d"},
    "/api/embed": {"model": MINILM, "input": "hi"},
    "/api/embeddings": {"model": MINILM, "prompt": "hi"},
}


def test_each_pooling_route_reads_its_tables_model_and_counts_its_tokens(server, caplog):
    """As tests/test_apis_surface.py checks the generation routes: the body
    model each handler parses is its table entry's; the access log counts tokens."""
    caplog.set_level(logging.INFO, logger="sluice.access")
    bodies = server.app.state.routes.bodies
    parsed_models = []
    parse = bodies.parse

    async def recording_parse(request, model):
        parsed_models.append(model)
        return await parse(request, model)

    bodies.parse = recording_parse
    try:
        for route in POOLING_ROUTES:
            parsed_models.clear()
            caplog.clear()
            response = post(server, route.path, POOLING_BODIES[route.path])
            assert response.status_code == 200, response.text
            assert parsed_models[0] is route.request_model, route.path
            assert "prompt_tokens=-" not in access_line(caplog), route.path
    finally:
        bodies.parse = parse


def test_the_server_describes_each_pooling_model_as_its_engine_loads_it(minilm, tmp_path):
    """`sluice serve` reads a model's small files in the server process and its
    weights in the engine's: the two readings agree (served_by) for an
    encoder, a decoder embedder and a decoder reranker."""
    embedder = build_tiny_embedder(tmp_path / "embedder").path
    reranker = build_tiny_reranker(tmp_path / "reranker").path
    for folder, task in ((minilm, "auto"), (embedder, "auto"), (reranker, "score")):
        model = ModelConfig(
            model=str(folder), task=task, dtype="float32", quantization=None,
            activation_quantization=None, cache_dir=tmp_path / "cache",
        )  # fmt: skip
        served = describe_model(model)
        core = engine_core_for(EngineConfig(model=model, multiprocess=False))
        served.served_by(core.info)
        assert isinstance(core, PoolingCore) and served.pooling == core.spec
