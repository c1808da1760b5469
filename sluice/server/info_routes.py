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

from sluice.errors import EngineDeadError, InvalidRequestError
from sluice.frontend.preprocess import Preprocessor
from sluice.server import protocol, to_internal
from sluice.server.admission import AdmissionGate, ShuttingDownError
from sluice.server.body import BodyReader
from sluice.server.errors import unavailable_response
from sluice.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from sluice.server.metrics import ServerMetrics
from sluice.server.replicas import replica_health
from sluice.server.served_model import ServedTokenizer


def sluice_version() -> str:
    try:
        return version("sluice")
    except PackageNotFoundError:
        return "unknown"


class AppParts(Protocol):
    """What these routes read of the app's (`app.Routes`)."""

    gate: AdmissionGate
    tokenizer: ServedTokenizer
    served_name: str
    max_model_len: int
    metrics: ServerMetrics
    bodies: BodyReader


class InfoRoutes:
    def __init__(self, parts: AppParts):
        self.gate = parts.gate
        self.tokenizer = parts.tokenizer
        self.served_name = parts.served_name
        self.max_model_len = parts.max_model_len
        self.metrics = parts.metrics
        self.bodies = parts.bodies
        self.created = int(time.time())

    def add_to(self, app: FastAPI) -> None:
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/version", self.version, methods=["GET"])
        app.add_api_route("/metrics", self.metrics_text, methods=["GET"])
        app.add_api_route("/tokenize", self.tokenize, methods=["POST"])
        app.add_api_route("/detokenize", self.detokenize, methods=["POST"])
        app.add_api_route("/reset_prefix_cache", self.reset_prefix_cache, methods=["POST"])

    async def models(self) -> Response:
        card = {
            "id": self.served_name,
            "object": "model",
            "created": self.created,
            "owned_by": "sluice",
            "root": self.served_name,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        return _json({"object": "list", "data": [card]})

    async def health(self) -> Response:
        if self.gate.is_draining:
            return unavailable_response(ShuttingDownError("the server is shutting down"))
        replicas = self.gate.replicas()
        if replicas:  # data parallel: degraded (still 200) while one replica serves
            return replica_health(replicas)
        if self.gate.is_alive:
            return Response(status_code=200)
        return unavailable_response(EngineDeadError("the engine is not running"))

    async def reset_prefix_cache(self) -> Response:
        """vLLM's endpoint: the engine forgets every cached prefix before its
        next step (the API key guards it like every route but /health, /metrics)."""
        if not self.gate.is_alive:
            raise EngineDeadError("the engine is not running; retry later")
        self.gate.reset_prefix_cache()
        return Response(status_code=200)

    async def version(self) -> Response:
        return _json({"version": sluice_version()})

    async def metrics_text(self) -> Response:
        return Response(self.metrics.render(), media_type=METRICS_CONTENT_TYPE)

    async def tokenize(self, request: Request) -> Response:
        body = await self.bodies.parse(request, protocol.TokenizeRequest)
        return _json_bytes(await self.bodies.convert(body, self._tokenized))

    async def _tokenized(
        self, body: protocol.TokenizeRequest, options: to_internal.RequestOptions
    ) -> bytes:
        to_internal.check_model(body.model, options.served_model_name)
        token_ids = await self._tokenize(body, options.preprocessor)
        result: dict[str, object] = {
            "count": len(token_ids),
            "max_model_len": self.max_model_len,
            "tokens": token_ids,
        }
        if body.return_token_strs:
            result["token_strs"] = self.tokenizer.convert_ids_to_tokens(token_ids)
        return orjson.dumps(result)

    async def _tokenize(
        self, body: protocol.TokenizeRequest, preprocessor: Preprocessor
    ) -> list[int]:
        if (body.prompt is None) == (body.messages is None):
            raise InvalidRequestError("give exactly one of 'prompt' and 'messages'", param="prompt")
        if body.prompt is not None:
            add_special_tokens = (
                True if body.add_special_tokens is None else body.add_special_tokens
            )
            return await preprocessor.encode(body.prompt, add_special_tokens)
        messages = to_internal.chat_messages(body.messages)
        add_generation_prompt = body.add_generation_prompt is not False
        text = await preprocessor.render_chat(messages, add_generation_prompt)
        return await preprocessor.encode(text, bool(body.add_special_tokens))

    async def detokenize(self, request: Request) -> Response:
        body = await self.bodies.parse(request, protocol.DetokenizeRequest)
        return _json_bytes(await self.bodies.convert(body, _detokenized))


async def _detokenized(
    body: protocol.DetokenizeRequest, options: to_internal.RequestOptions
) -> bytes:
    to_internal.check_model(body.model, options.served_model_name)
    if body.tokens is None:
        raise InvalidRequestError("'tokens' is required", param="tokens")
    options.preprocessor.check_token_ids(body.tokens, "tokens")
    return orjson.dumps({"prompt": await options.preprocessor.decode(body.tokens)})


def _json(content: object) -> Response:
    return _json_bytes(orjson.dumps(content))


def _json_bytes(body: bytes) -> Response:
    return Response(body, media_type="application/json")
