"""A fake OpenAI-compatible SSE server for the benchmark tools' tests (aiohttp.web).

It streams a fixed plan of chunks with known token counts and small sleeps,
fails on two chosen prompts, and counts requests in flight. It runs on a
thread (`fake_server()`) for in-process tests and as a subprocess
(`serve_forever(port)`) for the `--server` path.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))
load = importlib.import_module("_load")

# (text, tokens) per content chunk: the last chunk coalesces three tokens.
CHUNK_PLAN = (("Hel", 1), ("lo", 1), (" wor", 1), ("ld, friends", 3))
NUM_TOKENS = sum(n for _, n in CHUNK_PLAN)
GAP_S = 0.01  # the fake server sleeps this long before every content chunk
HTTP_ERROR_PROMPT = load.PROMPTS[2]  # answered with HTTP 503
EVENT_ERROR_PROMPT = load.PROMPTS[6]  # answered with a mid-stream error event


@dataclass
class FakeState:
    bodies: list[dict] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0


def _event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _chunk(is_chat: bool, text: str | None, finish: str | None = None) -> dict:
    if is_chat:
        delta = {} if text is None else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish}
    return {"id": "x", "model": "fake-model", "choices": [choice]}


async def _stream(response: web.StreamResponse, body: dict, is_chat: bool, prompt: str) -> None:
    if is_chat:
        await response.write(_event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
    if prompt == EVENT_ERROR_PROMPT:
        await response.write(_event({"error": {"message": "engine died", "type": "x"}}))
        await response.write(b"data: [DONE]\n\n")
        return
    is_continuous = (body.get("stream_options") or {}).get("continuous_usage_stats", False)
    num_sent = 0
    for text, num_tokens in CHUNK_PLAN:
        await asyncio.sleep(GAP_S)
        num_sent += num_tokens
        chunk = _chunk(is_chat, text)
        if is_continuous:
            chunk["usage"] = {"completion_tokens": num_sent}
        await response.write(_event(chunk))
    await response.write(_event(_chunk(is_chat, None, finish="length")))
    await response.write(_event({"choices": [], "usage": {"completion_tokens": NUM_TOKENS}}))
    await response.write(b"data: [DONE]\n\n")


def make_app(state: FakeState) -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.bodies.append(body)
        state.paths.append(request.path)
        is_chat = request.path.endswith("/chat/completions")
        prompt = body["messages"][0]["content"] if is_chat else body["prompt"]
        if prompt == HTTP_ERROR_PROMPT:
            return web.json_response({"error": {"message": "busy"}}, status=503)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            await _stream(response, body, is_chat, prompt)
        finally:
            state.in_flight -= 1
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/completions", generate)
    return app


def serve_forever(port: int) -> None:
    """Entry point for the subprocess that plays a `--server` command."""
    web.run_app(make_app(FakeState()), host="127.0.0.1", port=port, print=None)


@contextlib.contextmanager
def fake_server():
    """The fake server on a background thread's loop; yields (base_url, state)."""
    state, loop = FakeState(), asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> web.AppRunner:
        runner = web.AppRunner(make_app(state))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    runner = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", state
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
