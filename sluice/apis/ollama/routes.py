"""Ollama's routes, as the official clients and LangChain's ChatOllama call them:

    POST /api/chat, /api/generate   generate: NDJSON lines (default) or one object
    GET  /api/tags, /api/ps         the served model (it is always loaded)
    POST /api/show                  its template, parameters, model info, capabilities
    GET  /api/version               the Ollama version whose API this follows
    /api/pull, push, create, copy, delete   a 400 saying what sluice does instead

Generation goes the way of chat (`app.Routes.respond`): the same admission,
first-token deadline, disconnect abort, access log, metrics and stream
writer (lines coalesce under a lagging reader as SSE events do); the lines
are projected by `lines.OllamaLines`. A request with nothing to generate (no
messages, no prompt) is Ollama's "load the model" call: answered at once with
`done_reason` "load", the model named checked first. Errors take Ollama's
shape (`{"error": message}`, `ErrorShape.OLLAMA` in the API table).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

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
    check_model,
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
from sluice.engine.client_base import QueueTimeout
from sluice.errors import InvalidRequestError
from sluice.frontend.request import GenerationRequest
from sluice.frontend.serving import ResponseChunks
from sluice.server.body import BodyReader
from sluice.server.served_model import ServedTokenizer
from sluice.server.to_internal import RequestOptions

# The Ollama release whose API these routes follow (clients check a minimum).
OLLAMA_API_VERSION = "0.12.6"
_MODEL_ADMIN_ANSWER = (
    "sluice serves the model it was started with (`sluice serve --model PATH`: an HF "
    "folder or a .gguf file); it does not {what} models"
)


class GenerationRoutes(Protocol):
    """What these routes use of the app's (`app.Routes`)."""

    bodies: BodyReader
    options: RequestOptions
    tokenizer: ServedTokenizer
    served_name: str
    max_model_len: int

    def admit(self, request: Request, n: int) -> QueueTimeout | None: ...

    async def respond(
        self,
        request: Request,
        generation: GenerationRequest,
        queue_timeout: QueueTimeout | None,
        chunks: ResponseChunks | None = None,
        media_type: str = ...,
    ) -> Response: ...


class OllamaRoutes:
    def __init__(self, routes: GenerationRoutes):
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
            return self._load(body.value.model, "chat")
        return await self._generate(request, body, ollama_chat_request, "chat")

    async def generate(self, request: Request) -> Response:
        body = await self._routes.bodies.parse(request, GenerateRequest)
        if not body.value.prompt:
            return self._load(body.value.model, "generate")
        return await self._generate(request, body, ollama_generate_request, "generate")

    async def _generate(self, request: Request, body: Any, convert: Any, route: Route) -> Response:
        routes = self._routes
        queue_timeout = routes.admit(request, 1)
        generation = await routes.bodies.convert(body, convert)
        lines = OllamaLines(generation, route)
        return await routes.respond(request, generation, queue_timeout, lines, NDJSON_MEDIA_TYPE)

    def _load(self, model: str, route: Route) -> Response:
        model_name = check_model(model, self._routes.served_name)
        return _json(load_body(model_name, route))

    async def tags(self) -> Response:
        return _json({"models": [self._model_entry()]})

    async def ps(self) -> Response:
        entry = self._model_entry() | {
            # Loaded for the server's life: Ollama's "never" is far in the future.
            "expires_at": "2318-01-01T00:00:00Z",
            "size_vram": 0,
            "context_length": self._routes.max_model_len,
        }
        return _json({"models": [entry]})

    async def show(self, request: Request) -> Response:
        body = (await self._routes.bodies.parse(request, ShowRequest)).value
        model = body.model or body.name
        if model is None:
            raise InvalidRequestError("'model' is required", param="model")
        check_model(model, self._routes.served_name)
        return _json(self._model_card())

    async def version(self) -> Response:
        return _json({"version": OLLAMA_API_VERSION})

    def _model_entry(self) -> dict[str, Any]:
        name = self._routes.served_name
        return {
            "name": name,
            "model": name,
            "modified_at": self._started_at,
            "size": 0,
            "digest": "",
            "details": _details(),
        }

    def _model_card(self) -> dict[str, Any]:
        options = self._routes.options
        template = self._routes.tokenizer.chat_template_source
        capabilities = ["completion", "tools"]
        if options.reasoning_parser is not None:
            capabilities.append("thinking")
        return {
            "template": template or "",
            "parameters": f"num_ctx {self._routes.max_model_len}",
            "modelfile": "",
            "license": "",
            "details": _details(),
            "model_info": {
                "general.architecture": "sluice",
                "general.name": self._routes.served_name,
                "sluice.context_length": self._routes.max_model_len,
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
