"""ServedModel: the server's reading of the model must agree with the engine's."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from sluice.config import CacheConfig, EngineConfig, ModelConfig, ServerConfig
from sluice.engine.messages import EngineReady
from sluice.errors import ModelLoadError
from sluice.server.http.app import create_app
from sluice.server.served_models.served_model import ServedModel
from sluice.testing.fake_engine import FakeEngine
from sluice.testing.fake_tokenizer import ChatFakeTokenizer

SERVED = ServedModel("tiny-llama", ChatFakeTokenizer(), max_model_len=256)
READY = EngineReady(
    model_name="tiny-llama", max_model_len=256, num_kv_blocks=8, block_size_tokens=16,
    vocab_size=512,
)  # fmt: skip


def test_an_engine_that_loaded_the_described_model_passes():
    assert SERVED.served_by(READY) == SERVED
    assert SERVED.served_by(None) == SERVED  # an engine that loads no model


def test_an_engine_that_fitted_a_shorter_context_to_memory_serves_that_context():
    served = SERVED.served_by(msgspec.structs.replace(READY, max_model_len=128))
    assert served.max_model_len == 128 and served.name == SERVED.name


@pytest.mark.parametrize(
    "ready",
    [
        msgspec.structs.replace(READY, model_name="other-model"),
        msgspec.structs.replace(READY, max_model_len=2048),
    ],
)
def test_an_engine_that_loaded_another_model_or_context_is_refused(ready):
    with pytest.raises(ModelLoadError, match="the engine loaded"):
        SERVED.served_by(ready)


def test_the_app_does_not_start_on_an_engine_that_disagrees():
    engine = FakeEngine()
    engine.info = EngineReady("other-model", 256, 8, 16, 512)
    app = create_app(ServerConfig(), engine, SERVED)

    async def start() -> None:
        async with app.router.lifespan_context(app):
            pass

    with pytest.raises(ModelLoadError, match="'other-model'"):
        asyncio.run(start())
    assert not engine.is_alive  # the engine it started was stopped again


def test_the_app_serves_the_context_its_engine_fitted_and_refuses_longer_prompts():
    engine = FakeEngine()
    engine.info = EngineReady("tiny-llama", 128, 8, 16, 512)  # fitted below the 256 described
    app = create_app(ServerConfig(), engine, SERVED)

    async def run() -> tuple[int, int, dict]:
        import httpx

        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                models = (await client.get("/v1/models")).json()["data"][0]["max_model_len"]
                body = {"model": "tiny-llama", "prompt": "x " * 200, "max_tokens": 1}
                reply = await client.post("/v1/completions", json=body)
                return models, reply.status_code, reply.json()

    max_model_len, status, body = asyncio.run(run())
    assert max_model_len == 128
    assert status == 400 and "128" in body["error"]["message"]


def test_the_server_and_the_engine_read_a_model_folder_alike(tiny_folder):
    from sluice.engine.core import EngineCore
    from sluice.server.http.launch import describe_model

    model = ModelConfig(model=str(tiny_folder), dtype="float32", quantization=None,
                        cache_dir=tiny_folder.parent / "cache")  # fmt: skip
    core = EngineCore(EngineConfig(model=model, cache=CacheConfig(kv_cache_memory_bytes=8 << 20)))
    describe_model(model).served_by(core.info)
