"""The routes that are not generation: the model card, health, version,
metrics, vLLM's tokenize / detokenize and reset_prefix_cache.

    GET  /v1/models, /version, /health, /metrics
    POST /tokenize, /detokenize                  vLLM's helpers
    POST /reset_prefix_cache                     forget the engine's cached prefixes
"""

from __future__ import annotations

import time
from importlib.metadata import PackageNotFoundError, version
from typing import Protocol

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from sluice.apis import openai_request
from sluice.apis.chat import protocol as chat_protocol
from sluice.apis.chat import to_internal as chat_to_internal
from sluice.engine.client_base import ReplicaState
from sluice.errors import EngineDeadError, InvalidRequestError
from sluice.frontend.preprocess import Preprocessor
from sluice.server.body.body import BodyReader
from sluice.server.http.errors import unavailable_response
from sluice.server.in_flight.admission import ShuttingDownError
from sluice.server.observability.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from sluice.server.observability.metrics import ServerMetrics
from sluice.server.observability.replicas import replica_health
from sluice.server.served_models.model_parts import ModelOptions, ModelParts
from sluice.server.served_models.model_pool import ModelPool
from sluice.server.served_models.served_model import ServedTokenizer


def sluice_version() -> str:
    try:
        return version("sluice")
    except PackageNotFoundError:
        return "unknown"


class AppParts(Protocol):
    """What these routes read of the app's (`routes.Routes`)."""

    models: ModelPool[ModelParts]
    metrics: ServerMetrics
    bodies: BodyReader

    def replicas(self) -> list[ReplicaState]: ...

    async def options_for(self, name: str | None) -> ModelOptions: ...


class InfoRoutes:
    def __init__(self, parts: AppParts):
        self.parts = parts
        self.models = parts.models
        self.metrics = parts.metrics
        self.bodies = parts.bodies
        self.created = int(time.time())

    def add_to(self, app: FastAPI) -> None:
        app.add_api_route("/v1/models", self.list_models, methods=["GET"])
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/version", self.version, methods=["GET"])
        app.add_api_route("/metrics", self.metrics_text, methods=["GET"])
        app.add_api_route("/tokenize", self.tokenize, methods=["POST"])
        app.add_api_route("/detokenize", self.detokenize, methods=["POST"])
        app.add_api_route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"])

    async def list_models(self) -> Response:
        """Every model served, running or not (`status`: loaded, loading,
        unloading, unloaded; `load_error`: why its latest start failed)."""
        cards = []
        for status in self.models.statuses():
            card = {
                "id": status.name,
                "object": "model",
                "created": self.created,
                "owned_by": "sluice",
                "root": status.name,
                "parent": None,
                "max_model_len": None if status.served is None else status.served.max_model_len,
                "status": status.state,
            }
            if status.last_error is not None:
                card["load_error"] = status.last_error
            cards.append(card)
        return _json({"object": "list", "data": cards})

    async def health(self) -> Response:
        if self.models.is_draining:
            return unavailable_response(ShuttingDownError("the server is shutting down"))
        replicas = self.parts.replicas()
        if replicas:  # data parallel: degraded (still 200) while one replica serves
            return replica_health(replicas)
        dead = [name for name, active in self.models.loaded() if not active.gate.engine.is_alive]
        if not dead:
            return Response(status_code=200)
        return unavailable_response(EngineDeadError(_dead_message(dead)))

    async def reset_prefix_cache(self) -> Response:
        """vLLM's endpoint: every running engine forgets every cached prefix
        before its next step (the API key guards it like every route but
        /health, /metrics)."""
        loaded = self.models.loaded()
        dead = [name for name, active in loaded if not active.gate.engine.is_alive]
        if dead:
            raise EngineDeadError(_dead_message(dead) + "; retry later")
        for _, active in loaded:
            active.gate.engine.reset_prefix_cache()
        return Response(status_code=200)

    async def version(self) -> Response:
        return _json({"version": sluice_version()})

    async def metrics_text(self) -> Response:
        return Response(self.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def tokenize(self, request: Request) -> Response:
        body = await self.bodies.parse(request, chat_protocol.TokenizeRequest)
        model = await self.parts.options_for(body.value.model)

        async def tokenized(
            body: chat_protocol.TokenizeRequest, options: openai_request.RequestOptions
        ) -> bytes:
            return await self._tokenized(body, options, model.tokenizer)

        return _json_bytes(await self.bodies.convert(body, tokenized, model.conversion))

    async def _tokenized(
        self,
        body: chat_protocol.TokenizeRequest,
        options: openai_request.RequestOptions,
        tokenizer: ServedTokenizer,
    ) -> bytes:
        openai_request.check_model(body.model, options.served_model_name)
        token_ids = await self._tokenize(body, options.preprocessor)
        result: dict[str, object] = {
            "count": len(token_ids),
            "max_model_len": options.preprocessor.max_model_len,
            "tokens": token_ids,
        }
        if body.return_token_strs:
            result["token_strs"] = tokenizer.convert_ids_to_tokens(token_ids)
        return orjson.dumps(result)

    async def _tokenize(
        self, body: chat_protocol.TokenizeRequest, preprocessor: Preprocessor
    ) -> list[int]:
        if (body.prompt is None) == (body.messages is None):
            raise InvalidRequestError("give exactly one of 'prompt' and 'messages'", param="prompt")
        if body.prompt is not None:
            add_special_tokens = (
                True if body.add_special_tokens is None else body.add_special_tokens
            )
            return await preprocessor.encode(body.prompt, add_special_tokens)
        messages = chat_to_internal.chat_messages(body.messages)
        add_generation_prompt = body.add_generation_prompt is not False
        text = await preprocessor.render_chat(
            messages, add_generation_prompt, template_kwargs=body.chat_template_kwargs
        )
        return await preprocessor.encode(text, bool(body.add_special_tokens))

    async def detokenize(self, request: Request) -> Response:
        body = await self.bodies.parse(request, chat_protocol.DetokenizeRequest)
        model = await self.parts.options_for(body.value.model)
        return _json_bytes(await self.bodies.convert(body, _detokenized, model.conversion))


async def _detokenized(
    body: chat_protocol.DetokenizeRequest, options: openai_request.RequestOptions
) -> bytes:
    openai_request.check_model(body.model, options.served_model_name)
    if body.tokens is None:
        raise InvalidRequestError("'tokens' is required", param="tokens")
    options.preprocessor.check_token_ids(body.tokens, "tokens")
    return orjson.dumps({"prompt": await options.preprocessor.decode(body.tokens)})


def _dead_message(names: list[str]) -> str:
    if len(names) == 1 and names[0]:
        return f"the engine of `{names[0]}` is not running"
    return "the engines of " + ", ".join(f"`{n}`" for n in names) + " are not running"


def _json(content: object) -> Response:
    return _json_bytes(orjson.dumps(content))


def _json_bytes(body: bytes) -> Response:
    return Response(body, media_type="application/json")
