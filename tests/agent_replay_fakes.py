"""A fake agent-API upstream for the agent benchmark tools' tests (aiohttp.web on a thread).

It answers each generation route with a short stream in that route's shape
(Responses, Messages, chat, completions), reporting as prompt tokens the
length of the body in bytes and as cached the same less 5, and keeps every
(path, query, headers, body) it got, so a test sees what was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass(slots=True)
class Upstream:
    received: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)


def _events(path: str, num_prompt: int) -> list[dict[str, Any]]:
    cached = max(0, num_prompt - 5)
    if path == "/v1/responses":
        usage = {"input_tokens": num_prompt, "input_tokens_details": {"cached_tokens": cached}}
        return [{"type": "response.created", "response": {"usage": None}},
                {"type": "response.output_text.delta", "delta": "ok"},
                {"type": "response.completed", "response": {"usage": usage}}]  # fmt: skip
    if path == "/v1/messages":
        usage = {"input_tokens": num_prompt - cached, "cache_read_input_tokens": cached}
        return [{"type": "message_start", "message": {"usage": usage}},
                {"type": "content_block_delta", "index": 0, "delta": {"text": "ok"}},
                {"type": "message_stop"}]  # fmt: skip
    usage = {"prompt_tokens": num_prompt, "prompt_tokens_details": {"cached_tokens": cached}}
    choice = {"index": 0, "text": "ok"} if path == "/v1/completions" else {
        "index": 0, "delta": {"content": "ok"}}  # fmt: skip
    return [{"choices": [choice]}, {"choices": [], "usage": usage}]


def make_app(upstream: Upstream) -> web.Application:
    async def answer(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        upstream.received.append(
            (request.path, request.query_string, dict(request.headers), json.loads(raw or "null"))
        )
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for event in _events(request.path, len(raw)):
            kind = event.get("type")
            head = f"event: {kind}\n" if kind else ""
            await response.write(f"{head}data: {json.dumps(event)}\n\n".encode())
        if request.path in ("/v1/chat/completions", "/v1/completions"):
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        upstream.received.append((request.path, request.query_string, dict(request.headers), None))
        return web.json_response({"data": [{"id": "fake-model"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/{tail:.*}", answer)
    return app


@contextlib.contextmanager
def fake_upstream():
    """The fake on a background thread's loop; yields (base_url, upstream)."""
    upstream, loop = Upstream(), asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> web.AppRunner:
        runner = web.AppRunner(make_app(upstream))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    runner = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", upstream
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def serve_forever(port: int) -> None:
    """The fake as a server process (with /health), for the replay's start-and-stop path."""
    app = make_app(Upstream())
    app.router.add_get("/health", lambda request: web.Response(text="ok"))
    web.run_app(app, host="127.0.0.1", port=port, print=None)


if __name__ == "__main__":
    import sys

    # Called as `SCRIPT serve --host H --port PORT [more flags]`, as sluice is.
    serve_forever(int(sys.argv[sys.argv.index("--port") + 1]))
