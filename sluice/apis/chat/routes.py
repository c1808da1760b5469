"""The chat completions route (OpenAI's, with vLLM's extensions):

    POST /v1/chat/completions   generate: SSE chunks (stream) or one body

Parse the body (protocol.py) -> the model it names (`Routes.model_for`: a
404 naming the served ones) -> admission (`admit`: before any work, each of
`n` choices counted) -> check it and render the template (to_internal.py) ->
answered by `Routes.respond` with its chunks (chunks.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request
from starlette.responses import Response

from sluice.apis.chat.chunks import ChatChunks
from sluice.apis.chat.protocol import ChatCompletionRequest
from sluice.apis.chat.to_internal import chat_request
from sluice.apis.surface import CHAT_CREATE, ApiRoute
from sluice.server.http.app_routes import AppRoutes


class ChatRoutes:
    def __init__(self, routes: AppRoutes):
        self._routes = routes

    def handlers(self) -> dict[ApiRoute, Callable[..., Awaitable[Response]]]:
        """The API routes served here (the app registers them from its API table)."""
        return {CHAT_CREATE: self.create}

    async def create(self, request: Request) -> Response:
        routes = self._routes
        body = await routes.bodies.parse(request, ChatCompletionRequest)
        async with routes.model_for(request, body.value.model) as model:
            queue_timeout = routes.admit(request, body.value.n or 1, model)
            generation = await routes.bodies.convert(body, chat_request, model.model.conversion)
            chunks = ChatChunks(generation, model.frontend.strings)
            return await routes.respond(request, generation, queue_timeout, chunks, model=model)
