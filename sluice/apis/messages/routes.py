"""Anthropic's Messages routes, as Claude Code and Anthropic's SDKs call them:

    POST /v1/messages               generate: SSE events (stream) or one message
    POST /v1/messages/count_tokens  the prompt's token count

Generation goes the way of chat (`routes.Routes.respond`): the same admission,
first-token deadline, disconnect abort, access log, metrics and stream
writer; the events and body are projected by `events.MessagesEvents`. Any
`model` name is served (agents pick their own: `is_any_name_served`). Errors
take Anthropic's shape (`ErrorShape.ANTHROPIC` in the API table).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
from fastapi import Request
from starlette.responses import Response

from sluice.apis.messages.events import MessagesEvents
from sluice.apis.messages.protocol import CountTokensRequest, MessagesRequest
from sluice.apis.messages.to_internal import count_tokens, messages_request
from sluice.apis.surface import MESSAGES_COUNT_TOKENS, MESSAGES_CREATE, ApiRoute
from sluice.server.http.app_routes import AppRoutes


class MessagesRoutes:
    def __init__(self, routes: AppRoutes):
        self._routes = routes

    def handlers(self) -> dict[ApiRoute, Callable[..., Awaitable[Response]]]:
        """The API routes served here (the app registers them from its API table)."""
        return {MESSAGES_CREATE: self.create, MESSAGES_COUNT_TOKENS: self.count_tokens}

    async def create(self, request: Request) -> Response:
        routes = self._routes
        body = await routes.bodies.parse(request, MessagesRequest)
        async with routes.model_for(request, body.value.model, is_any_name_served=True) as model:
            queue_timeout = routes.admit(request, 1, model)
            generation = await routes.bodies.convert(body, messages_request, model.model.conversion)
            chunks = MessagesEvents(generation, model.frontend.strings)
            return await routes.respond(request, generation, queue_timeout, chunks, model=model)

    async def count_tokens(self, request: Request) -> Response:
        routes = self._routes
        body = await routes.bodies.parse(request, CountTokensRequest)
        name = routes.models.resolve(body.value.model, is_any_name_served=True)
        options = await routes.options_for(name)
        num_tokens = await routes.bodies.convert(body, count_tokens, options.conversion)
        return _json({"input_tokens": num_tokens})


def _json(content: object) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")
