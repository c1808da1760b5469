"""benchmarks/embeddings.py against a live server on a tiny BERT's pooling
engine: every batch size is measured, the same sentences go to every server,
a server that drops inputs gets no figure. The figures mean nothing here."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path

import pytest

from sluice.config import EngineConfig, ModelConfig
from sluice.engine.inproc_client import InProcessEngineClient
from sluice.engine.pooling_core import PoolingCore, engine_core_for
from sluice.server.served_models.model_pool import ModelSpec
from sluice.server.served_models.served_model import ServedModel
from sluice.testing.fake_engine import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer
from sluice.testing.live_server import LiveServer
from tests.pooling_models import build_tiny_bert, minilm_folder

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
embeddings = importlib.import_module("embeddings")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    minilm = minilm_folder(tmp_path_factory.mktemp("minilm"))
    folder, _ = build_tiny_bert(tmp_path_factory.mktemp("bert"), minilm)
    model = ModelConfig(model=str(folder), cache_dir=tmp_path_factory.mktemp("cache"))
    core = engine_core_for(EngineConfig(model=model, multiprocess=False))
    assert isinstance(core, PoolingCore)
    loaded = core.loaded
    served = ServedModel(loaded.name, loaded.tokenizer, loaded.max_model_len, core.spec)
    spec = ModelSpec("bert", lambda: served, lambda: InProcessEngineClient(core), is_pinned=True)
    with LiveServer(None, None, model_specs=[spec], startup_timeout_s=60) as live:
        yield live


def test_the_sentences_are_distinct_and_the_same_for_every_run():
    texts = embeddings.sentences(100)
    assert len(set(texts)) == 100 and texts == embeddings.sentences(100)
    assert all(10 <= len(text.split()) - 1 <= 30 for text in texts)
    assert [len(b) for b in embeddings.batches(texts, 64)] == [64, 36]


def test_every_server_and_batch_size_gets_a_figure(server, tmp_path, capsys):
    out = tmp_path / "results.json"
    argv = ["--server", f"a={server.url}", "--base-url", server.url, "--batch-sizes", "1,8",
            "--sentences", "16", "--concurrency", "2", "--out", str(out)]  # fmt: skip
    assert embeddings.main(argv) == 0
    results = json.loads(out.read_text())
    assert [(r["server"], r["batch_size"]) for r in results] == [
        ("a", 1),
        ("a", 8),
        (server.url, 1),
        (server.url, 8),
    ]
    assert all(r["sentences_per_s"] > 0 and r["num_sentences"] == 16 for r in results)
    assert "sentences/s" in capsys.readouterr().out


def test_a_server_that_refuses_gets_no_figure():
    with LiveServer(FakeEngine(), ChatFakeTokenizer()) as live:  # a generation model
        texts = embeddings.sentences(4)
        with pytest.raises(RuntimeError, match="400"):
            asyncio.run(embeddings.measure_server("gen", live.url, None, texts, 2, 1))
