"""Several real models in one server, end to end: the embedded model under two
names, each in its own engine process, and a third whose weights file is
truncated, behind `--models-max 1`.

Both names answer under mixed load; every stream passes the streaming
contract and equals its model's non-streamed answer (greedy, float32: the
same alone or batched) although the models take turns in the one slot
(least recently used stopped, each stream finished first); an unknown name
is a 404 naming the served models; the broken model's requests get a 503
naming it and the engine's cause, and the others keep answering.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from pathlib import Path

import aiohttp
import httpx2
import pytest

from sluice.config import CacheConfig, EngineConfig, ServerConfig
from sluice.server.http.launch import describe_model
from sluice.server.served_models.model_catalog import model_specs
from sluice.testing.contract import Expectations, check_stream
from sluice.testing.event_loops import run
from sluice.testing.live_server import LiveServer

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
PROMPTS = ("Once upon a time", "The capital of France is")
EXPECT = Expectations("completion", 1, include_usage=True)


@pytest.fixture(scope="module")
def broken_model(embedded_model_dir: Path, tmp_path_factory) -> Path:
    """The embedded model's folder with its weights cut in half."""
    folder = Path(shutil.copytree(embedded_model_dir, tmp_path_factory.mktemp("m") / "broken"))
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return folder


def test_two_real_models_take_turns_in_one_slot_and_every_stream_stays_exact(
    embedded_model_config, broken_model
):
    engine = EngineConfig(
        model=dataclasses.replace(embedded_model_config, max_model_len=1024),
        cache=CacheConfig(kv_cache_memory_bytes=64 << 20),
        multiprocess=True,
        num_threads=1,
    )
    flags = {"engine": engine, "models_max": 1, "queue_timeout_s": 600.0,
             "models": ("alpha=embedded", "beta=embedded", f"broken={broken_model}")}  # fmt: skip
    specs = model_specs(ServerConfig(**flags), describe_model)
    with (
        LiveServer(None, None, model_specs=specs, startup_timeout_s=60, **flags) as live,
        httpx2.Client(base_url=live.url, timeout=600) as http,
    ):
        references = {
            (model, prompt): _complete(http, model, prompt)
            for model in ("alpha", "beta")
            for prompt in PROMPTS
        }
        assert references[("alpha", PROMPTS[0])] == references[("beta", PROMPTS[0])]
        # The broken model's engine fails to load: its requests only.
        refused = http.post("/v1/completions", json={"model": "broken", "prompt": "hi"})
        assert refused.status_code == 503
        message = refused.json()["error"]["message"]
        assert "`broken` failed to load" in message and "weights" in message, message
        # Its weights' check failed before its start stopped beta, the loaded one.
        statuses = {m["id"]: m["status"] for m in http.get("/v1/models").json()["data"]}
        assert statuses == {"alpha": "unloaded", "beta": "loaded", "broken": "unloaded"}
        unknown = http.post("/v1/completions", json={"model": "gamma", "prompt": "hi"})
        assert unknown.status_code == 404
        assert "`alpha`, `beta`, `broken`" in unknown.json()["error"]["message"]

        streams = run(_mixed_load(live.url), timeout_s=900)
        for model, prompt, text in streams:
            assert text == references[(model, prompt)], (model, prompt)
        assert http.get("/health").status_code == 200
        listed = http.get("/v1/models").json()["data"]
        assert sorted(m["status"] for m in listed) == ["loaded", "unloaded", "unloaded"]


def _complete(http: httpx2.Client, model: str, prompt: str) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


async def _mixed_load(url: str) -> list[tuple[str, str, str]]:
    """Streams to both models at once, interleaved."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def one(model: str, prompt: str) -> tuple[str, str, str]:
            body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                    "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            async with session.post(url + "/v1/completions", json=body) as response:
                assert response.status == 200, await response.text()
                raw = await response.read()
            return model, prompt, check_stream(raw, EXPECT).choices[0].text

        jobs = [(model, prompt) for prompt in PROMPTS for model in ("alpha", "beta")]
        return await asyncio.gather(*(one(model, prompt) for model, prompt in jobs))
