"""The Responses API's routes (OpenAI's, as Codex CLI speaks it):

    POST   /v1/responses               generate, streamed (SSE events) or not
    GET    /v1/responses/{id}          a stored response
    DELETE /v1/responses/{id}          forget it
    POST   /v1/responses/input_tokens  the prompt's token count (vLLM, llama.cpp)

Generation goes the way of chat (`routes.Routes.respond`): the same admission,
first-token deadline, disconnect abort, access log and metrics. The store is
owned by the event loop: a follow-up's stored conversation is read here,
before the body is converted (possibly in a worker thread), and a response is
stored when its builder makes its final object. Every read, write and delete
names the request's API key as the owner: a key sees only its own responses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import Request
from starlette.responses import Response

from sluice.apis import openai_request
from sluice.apis.responses.events import ResponsesEvents
from sluice.apis.responses.protocol import InputTokensRequest, ResponsesRequest
from sluice.apis.responses.store import ResponseStore, StoredResponse
from sluice.apis.responses.to_internal import ResponsesPlan, responses_request
from sluice.apis.surface import (
    RESPONSES_CREATE,
    RESPONSES_DELETE,
    RESPONSES_INPUT_TOKENS,
    RESPONSES_RETRIEVE,
    ApiRoute,
)
from sluice.server.http.app_routes import AppRoutes
from sluice.server.in_flight.request_context import context_of
from sluice.server.served_models.model_parts import ModelOptions


class ResponsesRoutes:
    def __init__(self, routes: AppRoutes, store: ResponseStore):
        self._routes = routes
        self._store = store

    def handlers(self) -> dict[ApiRoute, Callable[..., Awaitable[Response]]]:
        """The API routes served here (the app registers them from its API table)."""
        return {
            RESPONSES_CREATE: self.create,
            RESPONSES_INPUT_TOKENS: self.input_tokens,
            RESPONSES_RETRIEVE: self.retrieve,
            RESPONSES_DELETE: self.delete,
        }

    async def create(self, request: Request) -> Response:
        routes = self._routes
        body = await routes.bodies.parse(request, ResponsesRequest)
        async with routes.model_for(request, body.value.model) as model:
            queue_timeout = routes.admit(request, 1, model)
            owner = _owner(request)
            plan = await self._plan(body.value, body, owner, model.model)
            generation = plan.request

            def on_response(response: dict[str, Any]) -> None:
                if plan.is_stored:
                    self._store.put(StoredResponse(response, plan.messages, owner))

            chunks = ResponsesEvents(generation, model.frontend.strings, on_response)
            return await routes.respond(request, generation, queue_timeout, chunks, model=model)

    async def retrieve(self, request: Request, response_id: str) -> Response:
        return _json(self._store.get(response_id, _owner(request)).response)

    async def delete(self, request: Request, response_id: str) -> Response:
        self._store.delete(response_id, _owner(request))
        return _json({"id": response_id, "object": "response.deleted", "deleted": True})

    async def input_tokens(self, request: Request) -> Response:
        body = await self._routes.bodies.parse(request, InputTokensRequest)
        fields = body.value.model_dump(by_alias=True, exclude_none=True)
        responses_body = ResponsesRequest.model_validate(fields)
        model = await self._routes.options_for(responses_body.model)
        plan = await self._plan(responses_body, body, _owner(request), model)
        num_tokens = len(plan.request.prompts[0].token_ids)
        return _json({"object": "response.input_tokens", "input_tokens": num_tokens})

    async def _plan(
        self, value: ResponsesRequest, body: Any, owner: bytes | None, model: ModelOptions
    ) -> ResponsesPlan:
        previous: list[dict[str, Any]] = []
        if value.previous_response_id is not None:
            stored = self._store.get(value.previous_response_id, owner, "previous_response_id")
            previous = stored.conversation()

        async def convert(
            value: ResponsesRequest, options: openai_request.RequestOptions
        ) -> ResponsesPlan:
            return await responses_request(value, options, previous)

        return await self._routes.bodies.convert(
            _with_value(body, value), convert, model.conversion
        )


def _owner(request: Request) -> bytes | None:
    """Whose responses the request reads and writes: its API key's (None without keys)."""
    key = context_of(request.scope).key
    return None if key is None else key.digest


def _with_value(body: Any, value: ResponsesRequest) -> Any:
    """The parsed body (its size decides where it is converted) holding `value`."""
    if body.value is value:
        return body
    return type(body)(value, body.num_bytes)


def _json(content: object) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")
