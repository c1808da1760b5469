"""Ollama's routes, as the official clients and LangChain's ChatOllama call them:

    POST /api/chat, /api/generate   generate: NDJSON lines (default) or one object
    GET  /api/tags, /api/ps         every model served; the running ones, and when
                                    their keep_alive runs out
    POST /api/show                  its template, parameters, model info, capabilities
    GET  /api/version               the Ollama version whose API this follows
    /api/pull, push, create, copy, delete   a 400 saying what sluice does instead

Generation goes the way of chat (`routes.Routes.respond`): the same admission,
first-token deadline, disconnect abort, access log, metrics and stream
writer (lines coalesce under a lagging reader as SSE events do); the lines
are projected by `lines.OllamaLines`. A request with nothing to generate (no
messages, no prompt) is Ollama's "load the model" call: answered at once with
`done_reason` "load", once the model named runs. Each request's model is
resolved by the app (`Routes.model_for`: a 404 naming the served ones), its
`keep_alive` (a Go duration or seconds; negative: for ever; 0: stopped after
the request) handed to the model pool. Errors take Ollama's
shape (`{"error": message}`, `ErrorShape.OLLAMA` in the API table).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response

from sluice.apis.ollama.lines import (
    NDJSON_MEDIA_TYPE,
    OllamaLines,
    Route,
    created_at,
    load_body,
)
from sluice.apis.ollama.protocol import ChatRequest, GenerateRequest, ShowRequest
from sluice.apis.ollama.to_internal import (
    LATEST_TAG,
    check_model,
    keep_alive_s,
    ollama_chat_request,
    ollama_generate_request,
)
from sluice.apis.surface import (
    OLLAMA_CHAT,
    OLLAMA_COPY,
    OLLAMA_CREATE,
    OLLAMA_DELETE,
    OLLAMA_GENERATE,
    OLLAMA_PS,
    OLLAMA_PULL,
    OLLAMA_PUSH,
    OLLAMA_SHOW,
    OLLAMA_TAGS,
    OLLAMA_VERSION,
    ApiRoute,
)
from sluice.errors import InvalidRequestError
from sluice.server.http.app_routes import AppRoutes
from sluice.server.served_models.model_entry import ModelStatus
from sluice.server.served_models.model_parts import ModelOptions

# A model loaded for ever expires, as Ollama writes it, in a far future.
_FOREVER_S = datetime(2318, 1, 1, tzinfo=UTC).timestamp()
# The Ollama release whose API these routes follow (clients check a minimum).
OLLAMA_API_VERSION = "0.12.6"
_MODEL_ADMIN_ANSWER = (
    "sluice serves the model it was started with (`sluice serve --model PATH`: an HF "
    "folder or a .gguf file); it does not {what} models"
)


class OllamaRoutes:
    def __init__(self, routes: AppRoutes):
        self._routes = routes
        self._started_at = created_at()

    def handlers(self) -> dict[ApiRoute, Callable[..., Awaitable[Response]]]:
        """The API routes served here (the app registers them from its API table)."""
        refusals = {
            route: _refusal(what)
            for route, what in (
                (OLLAMA_PULL, "pull"), (OLLAMA_PUSH, "push"), (OLLAMA_CREATE, "create"),
                (OLLAMA_COPY, "copy"), (OLLAMA_DELETE, "delete"),
            )
        }  # fmt: skip
        return {
            OLLAMA_CHAT: self.chat,
            OLLAMA_GENERATE: self.generate,
            OLLAMA_TAGS: self.tags,
            OLLAMA_SHOW: self.show,
            OLLAMA_PS: self.ps,
            OLLAMA_VERSION: self.version,
            **refusals,
        }

    async def chat(self, request: Request) -> Response:
        body = await self._routes.bodies.parse(request, ChatRequest)
        if not body.value.messages:
            return await self._load(request, body.value, "chat")
        return await self._generate(request, body, ollama_chat_request, "chat")

    async def generate(self, request: Request) -> Response:
        body = await self._routes.bodies.parse(request, GenerateRequest)
        if not body.value.prompt:
            return await self._load(request, body.value, "generate")
        return await self._generate(request, body, ollama_generate_request, "generate")

    async def _generate(self, request: Request, body: Any, convert: Any, route: Route) -> Response:
        routes = self._routes
        name = self._served_name(body.value.model)
        keep_alive = keep_alive_s(body.value.keep_alive)
        async with routes.model_for(request, name, keep_alive_s=keep_alive) as model:
            queue_timeout = routes.admit(request, 1, model)
            generation = await routes.bodies.convert(body, convert, model.model.conversion)
            lines = OllamaLines(generation, route)
            return await routes.respond(
                request, generation, queue_timeout, lines, NDJSON_MEDIA_TYPE, model=model
            )

    async def _load(self, request: Request, body: Any, route: Route) -> Response:
        """Ollama's load call: the model started (or kept) for its keep_alive."""
        name = self._served_name(body.model)
        keep_alive = keep_alive_s(body.keep_alive)
        async with self._routes.model_for(request, name, keep_alive_s=keep_alive) as model:
            model_name = check_model(body.model, model.name)
        return _json(load_body(model_name, route))

    def _served_name(self, requested: str) -> str:
        """The served model `requested` names (Ollama's ":latest" tag dropped)."""
        bare = requested.removesuffix(LATEST_TAG)
        return bare if bare != requested and bare in self._routes.models.names else requested

    async def tags(self) -> Response:
        return _json({"models": [self._model_entry(s) for s in self._routes.models.statuses()]})

    async def ps(self) -> Response:
        """The running models, and when their keep_alive runs out."""
        loop_now_s, now_s = asyncio.get_running_loop().time(), time.time()
        running = []
        for status in self._routes.models.statuses():
            if status.state != "loaded":
                continue
            expires_s = _FOREVER_S if status.expires_at is None else (
                now_s + status.expires_at - loop_now_s)  # fmt: skip
            running.append(self._model_entry(status) | {
                "expires_at": datetime.fromtimestamp(expires_s, UTC).isoformat().replace(
                    "+00:00", "Z"),
                "size_vram": 0,
                "context_length": None if status.served is None else status.served.max_model_len,
            })  # fmt: skip
        return _json({"models": running})

    async def show(self, request: Request) -> Response:
        body = (await self._routes.bodies.parse(request, ShowRequest)).value
        model = body.model or body.name
        if model is None:
            raise InvalidRequestError("'model' is required", param="model")
        options = await self._routes.options_for(self._served_name(model))
        check_model(model, options.name)
        return _json(self._model_card(options))

    async def version(self) -> Response:
        return _json({"version": OLLAMA_API_VERSION})

    def _model_entry(self, status: ModelStatus) -> dict[str, Any]:
        return {
            "name": status.name,
            "model": status.name,
            "modified_at": self._started_at,
            "size": status.estimated_bytes,
            "digest": "",
            "details": _details(),
        }

    def _model_card(self, model: ModelOptions) -> dict[str, Any]:
        template = model.tokenizer.chat_template_source
        capabilities = ["completion", "tools"]
        if model.options.reasoning_parser is not None:
            capabilities.append("thinking")
        return {
            "template": template or "",
            "parameters": f"num_ctx {model.max_model_len}",
            "modelfile": "",
            "license": "",
            "details": _details(),
            "model_info": {
                "general.architecture": "sluice",
                "general.name": model.name,
                "sluice.context_length": model.max_model_len,
            },
            "capabilities": capabilities,
            "modified_at": self._started_at,
        }


def _details() -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "sluice",
        "family": "",
        "families": None,
        "parameter_size": "",
        "quantization_level": "",
    }


def _refusal(what: str) -> Callable[[], Awaitable[Response]]:
    async def refuse() -> Response:
        raise InvalidRequestError(_MODEL_ADMIN_ANSWER.format(what=what))

    return refuse


def _json(content: object) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")
