"""Engine clients: in-process on a thread, and the engine in its own process.

Deltas reach their sinks once, in order, on the event loop; aborts end a
request at the next step; a dead engine process is noticed at once and every
open request hears EngineDeadError.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import signal

import pytest
import torch

from sluice.config import CacheConfig, EngineConfig, ModelConfig
from sluice.engine.client_base import EngineClient
from sluice.engine.engine_request import generation_request
from sluice.engine.inproc_client import InProcessEngineClient
from sluice.engine.process_client import MultiprocessEngineClient
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import EngineDeadError, ModelLoadError
from sluice.testing.fake_engine import FakeEngine
from sluice.testing.recording_sink import RecordingSink
from tests.model_factory import make_core

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def run_async(test):
    """Run an async test body on a fresh event loop (no pytest plugin needed)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        return asyncio.run(asyncio.wait_for(test(*args, **kwargs), 300))

    return wrapper


@run_async
async def test_in_process_client_delivers_every_token_once_on_the_loop(tiny_loaded):
    core = make_core(tiny_loaded)
    expected = []
    client = InProcessEngineClient(core)
    await client.start()
    try:
        sinks = [RecordingSink() for _ in range(4)]
        prompts = [[5 + i, 9, 13, 40 + i] for i in range(4)]
        for i, (prompt, sink) in enumerate(zip(prompts, sinks, strict=True)):
            client.add_request(generation_request(f"c{i}", prompt, GREEDY), sink)
        await asyncio.wait_for(asyncio.gather(*(s.done.wait() for s in sinks)), 60)
    finally:
        await client.shutdown()
    reference = make_core(tiny_loaded)
    for i, prompt in enumerate(prompts):
        reference.add_request(generation_request(f"c{i}", prompt, GREEDY))
    tokens: dict[str, list[int]] = {f"c{i}": [] for i in range(4)}
    while reference.has_unfinished_requests():
        for delta in reference.step():
            tokens[delta.request_id].extend(delta.new_token_ids)
    expected = [tokens[f"c{i}"] for i in range(4)]
    assert [s.token_ids for s in sinks] == expected
    for sink in sinks:
        assert [d.finish_reason for d in sink.deltas].count("length") == 1
        assert sink.deltas[-1].finish_reason == "length"


@run_async
async def test_in_process_abort_silences_the_sink_and_frees_blocks(tiny_loaded):
    core = make_core(tiny_loaded, num_blocks=64)
    client = InProcessEngineClient(core)
    await client.start()
    try:
        sink = RecordingSink()
        params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
        client.add_request(generation_request("long", [7, 8, 9], params), sink)
        await sink.has_delta.wait()
        client.abort(["long"])
        client.abort(["long"])  # idempotent
        async with asyncio.timeout(60):  # the engine thread's next step applies it
            while core.has_unfinished_requests():
                await asyncio.sleep(0.01)
        assert core.kv.num_free_blocks == 64
        assert all(not d.is_finished for d in sink.deltas)
    finally:
        await client.shutdown()


def engine_config(model_config) -> EngineConfig:
    return EngineConfig(
        model=dataclasses.replace(model_config, max_model_len=2048),
        cache=CacheConfig(kv_cache_memory_bytes=256 << 20),
        multiprocess=True,
    )


@pytest.mark.slow
@run_async
async def test_engine_process_streams_tokens_and_reports_its_death(embedded_model_config):
    config = engine_config(embedded_model_config)
    client = MultiprocessEngineClient(config)
    await client.start()
    try:
        assert client.is_alive
        assert client.info.max_model_len == 2048
        finished = RecordingSink()
        client.add_request(generation_request("short", [1, 4093, 198], GREEDY), finished)
        await asyncio.wait_for(finished.done.wait(), 120)
        assert len(finished.token_ids) == 12
        assert finished.deltas[-1].finish_reason == "length"

        # The prefix cache across the process boundary: a repeat hits, a reset forgets.
        prompt = list(range(1000, 1040))  # two full blocks of 16, and 8 more tokens
        cached = []
        for name in ("first", "repeat", "reset"):
            if name == "reset":
                client.reset_prefix_cache()
            sink = RecordingSink()
            client.add_request(generation_request(name, prompt, GREEDY), sink)
            await asyncio.wait_for(sink.done.wait(), 120)
            cached.append(sink.deltas[-1].num_cached_tokens)
        assert cached == [0, 32, 0]
        assert client.stats().prefix_cache_hit_tokens == 32

        hanging = RecordingSink()
        long_params = SamplingParams(temperature=0.0, max_tokens=4000, ignore_eos=True)
        client.add_request(generation_request("long", [1, 4093, 198], long_params), hanging)
        await asyncio.wait_for(hanging.has_delta.wait(), 120)
        os.kill(client._process.pid, signal.SIGKILL)
        # At once (the process sentinel), not by the heartbeat's silence: well within it.
        await asyncio.wait_for(hanging.done.wait(), config.heartbeat_timeout_s / 4)
        assert len(hanging.errors) == 1
        assert isinstance(hanging.errors[0], EngineDeadError)
        assert not client.is_alive
        with pytest.raises(EngineDeadError):
            client.add_request(generation_request("after", [1, 2, 3], GREEDY), RecordingSink())
    finally:
        await client.shutdown()


@run_async
async def test_engine_process_that_cannot_load_its_model_fails_start(tmp_path):
    from sluice.config import ModelConfig

    config = engine_config(ModelConfig(model=str(tmp_path / "missing"), cache_dir=tmp_path))
    client = MultiprocessEngineClient(config)
    with pytest.raises(ModelLoadError, match="missing"):
        await client.start()
    await client.shutdown()


def test_torch_is_the_pinned_cpu_build():
    assert torch.__version__.startswith("2.13.0")


# -- one abort contract for every engine client ---------------------------------------


def fake_client(request) -> EngineClient:
    return FakeEngine(step_interval_s=0.01)


def in_process_client(request) -> EngineClient:
    return InProcessEngineClient(make_core(request.getfixturevalue("tiny_loaded")))


def process_client(request) -> EngineClient:
    folder = request.getfixturevalue("tiny_folder")
    model = ModelConfig(model=str(folder), dtype="float32", quantization=None,
                        cache_dir=folder.parent / "cache")  # fmt: skip
    cache = CacheConfig(kv_cache_memory_bytes=8 << 20)
    return MultiprocessEngineClient(EngineConfig(model=model, cache=cache))


@pytest.mark.parametrize("make_client", [fake_client, in_process_client, process_client])
def test_after_abort_a_sink_hears_nothing_more_on_every_engine_client(request, make_client):
    client = make_client(request)

    async def go() -> tuple[RecordingSink, int, RecordingSink]:
        await client.start()
        try:
            aborted, after = RecordingSink(), RecordingSink()
            endless = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
            client.add_request(generation_request("aborted", [7, 8, 9], endless), aborted)
            await aborted.has_delta.wait()
            client.abort(["aborted"])
            num_heard = len(aborted.deltas)
            client.abort(["aborted", "unknown"])  # idempotent; unknown ids ignored
            # The engine applies its inputs in order: by the time this one
            # finishes, the engine's final "abort" delta was handled too.
            client.add_request(generation_request("after", [7, 8, 9], GREEDY), after)
            await asyncio.wait_for(after.done.wait(), 120)
            return aborted, num_heard, after
        finally:
            await client.shutdown()

    aborted, num_heard, after = asyncio.run(asyncio.wait_for(go(), 300))
    assert len(aborted.deltas) == num_heard and not aborted.errors
    assert not any(delta.is_finished for delta in aborted.deltas)
    assert after.deltas[-1].finish_reason == "length" and not after.errors
