"""benchmarks/_agent_proxy.py over real sockets: the agent's requests reach the server
unchanged, its streamed answer comes back whole, and each body is kept with its turn."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path

import aiohttp

from sluice.testing.server_process import free_port
from tests.agent_replay_fakes import fake_upstream

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the modules import their siblings
proxy_module = importlib.import_module("_agent_proxy")

BODY = {"model": "claude", "messages": [{"role": "user", "content": "hi ünïcode"}], "stream": True}


async def _agent_session(upstream_url: str):
    proxy = proxy_module.RecordingProxy(upstream_url)
    url = await proxy.start(free_port())
    try:
        async with aiohttp.ClientSession() as client:
            proxy.turn = 1
            async with client.get(f"{url}/v1/models") as answer:
                models = await answer.json()
            proxy.turn = 2
            headers = {"anthropic-version": "2023-06-01", "x-api-key": "k"}
            async with client.post(f"{url}/v1/messages?beta=true", json=BODY,
                                   headers=headers) as answer:  # fmt: skip
                status, stream = answer.status, await answer.text()
    finally:
        await proxy.stop()
    return proxy.requests, models, status, stream


def test_the_proxy_forwards_streams_back_and_records_each_body_with_its_turn():
    with fake_upstream() as (upstream_url, upstream):
        requests, models, status, stream = asyncio.run(_agent_session(upstream_url))
    assert models == {"data": [{"id": "fake-model"}]}
    assert status == 200 and stream.count("data: ") == 3 and '"content_block_delta"' in stream
    # The server got the body, the query and the agent's headers as sent.
    path, query, headers, body = upstream.received[-1]
    assert (path, query, body) == ("/v1/messages", "beta=true", BODY)
    assert headers["x-api-key"] == "k" and headers["anthropic-version"] == "2023-06-01"
    assert [(r.turn, r.method, r.path, r.status) for r in requests] == [
        (1, "GET", "/v1/models", 200), (2, "POST", "/v1/messages", 200)]  # fmt: skip
    assert requests[1].body == BODY and requests[1].query == "beta=true"
    assert requests[1].headers == {"content-type": "application/json",
                                   "anthropic-version": "2023-06-01"}  # fmt: skip
    assert requests[0].body is None


def test_a_body_that_is_not_json_is_kept_as_text():
    assert proxy_module.parse_body(b"not json") == {"__raw_text__": "not json"}
    assert proxy_module.parse_body(b"") is None
    assert proxy_module.parse_body(json.dumps({"a": 1}).encode()) == {"a": 1}
