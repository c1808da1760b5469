"""The completions route (OpenAI's legacy API, with vLLM's extensions):

    POST /v1/completions   generate: SSE chunks (stream) or one body

Parse the body (protocol.py) -> the model it names (`Routes.model_for`: a
404 naming the served ones) -> admission (`admit`: before any work, each of
`n` choices counted) -> check it and tokenize its prompts (to_internal.py) ->
answered by `Routes.respond` with its chunks (chunks.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request
from starlette.responses import Response

from sluice.apis.completions.chunks import CompletionChunks
from sluice.apis.completions.protocol import CompletionRequest
from sluice.apis.completions.to_internal import completion_request
from sluice.apis.surface import COMPLETIONS_CREATE, ApiRoute
from sluice.server.http.app_routes import AppRoutes


class CompletionsRoutes:
    def __init__(self, routes: AppRoutes):
        self._routes = routes

    def handlers(self) -> dict[ApiRoute, Callable[..., Awaitable[Response]]]:
        """The API routes served here (the app registers them from its API table)."""
        return {COMPLETIONS_CREATE: self.create}

    async def create(self, request: Request) -> Response:
        routes = self._routes
        body = await routes.bodies.parse(request, CompletionRequest)
        async with routes.model_for(request, body.value.model) as model:
            queue_timeout = routes.admit(request, body.value.n or 1, model)
            generation = await routes.bodies.convert(
                body, completion_request, model.model.conversion
            )
            chunks = CompletionChunks(generation, model.frontend.strings)
            return await routes.respond(request, generation, queue_timeout, chunks, model=model)
