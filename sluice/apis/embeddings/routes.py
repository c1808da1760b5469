"""The embedding, rerank and score routes:

    POST /v1/embeddings                      OpenAI's embeddings (vLLM's extensions)
    POST /v1/rerank, /rerank, /v2/rerank     query + documents -> sorted relevance scores
    POST /v1/score                           text_1 x text_2 -> a score per pair
    POST /api/embed, /api/embeddings         Ollama's

One API request is one engine request (a `Pooling` payload) holding all
its inputs: they are pooled together, and with other requests' inputs, in
the engine's steps (sluice/engine/pooling_core.py). Each route: parse and
check the fields -> the model the request names (`Routes.model_for`: the
one place a name is resolved) -> admit (`Routes.admit`: the gate's queue
bound and timeout, the key's seat, as generation) -> write the inputs
(inputs.py, off the loop for a large body) -> one engine request
(engine_request.py: aborted if the client leaves first, counted in the
metrics) -> the body (bodies.py). Ollama's routes hand their `keep_alive`
to the model pool, as /api/chat does.

A pooling route on a generation model is a 400 naming the model (vLLM serves
no embeddings from a generation model by default either); a generation route
on a pooling model is the app's 400 (`routes.Routes.admit`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import numpy as np
from fastapi import Request
from starlette.responses import Response

from sluice.apis.embeddings import bodies
from sluice.apis.embeddings.engine_request import answering_disconnects, pool
from sluice.apis.embeddings.inputs import (
    PoolingModelView,
    pair_inputs,
    pooling_backend,
    text_inputs,
    token_inputs,
    truncation_of,
)
from sluice.apis.embeddings.protocol import (
    EmbeddingsRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    RerankRequest,
    ScoreRequest,
)
from sluice.apis.ollama.to_internal import LATEST_TAG, keep_alive_s
from sluice.apis.surface import (
    EMBEDDINGS_CREATE,
    OLLAMA_EMBED,
    OLLAMA_EMBEDDINGS,
    RERANK_CREATE,
    RERANK_JINA,
    RERANK_V2,
    SCORE_CREATE,
    ApiRoute,
)
from sluice.engine.outputs import PooledOutput
from sluice.engine.pooling_params import PoolingInput, PoolingParams
from sluice.errors import InvalidRequestError
from sluice.server.body.body import ParsedBody
from sluice.server.http.app_routes import AppRoutes
from sluice.server.served_models.model_parts import ModelParts
from sluice.tokenizer import Tokenizer


class EmbeddingsRoutes:
    def __init__(self, routes: AppRoutes):
        self._routes = routes
        # Each served pooling model's view, built once (its tokenizer copied).
        self._views: dict[int, PoolingModelView] = {}

    def handlers(self) -> dict[ApiRoute, Callable[..., Awaitable[Response]]]:
        """The API routes served here (the app registers them from its API table)."""
        handlers = {
            EMBEDDINGS_CREATE: self.embeddings,
            RERANK_CREATE: self.rerank,
            RERANK_JINA: self.rerank,
            RERANK_V2: self.rerank,
            SCORE_CREATE: self.score,
            OLLAMA_EMBED: self.ollama_embed,
            OLLAMA_EMBEDDINGS: self.ollama_embeddings,
        }
        return {route: answering_disconnects(handler) for route, handler in handlers.items()}

    # -- routes ------------------------------------------------------------------

    async def embeddings(self, request: Request) -> Response:
        body = await self._routes.bodies.parse(request, EmbeddingsRequest)
        value = body.value
        _check_embedding_input(value.input)
        async with self._routes.model_for(request, value.model) as parts:
            model = self._embedder(parts)
            params = _params(model, value.dimensions)
            truncate_to = truncation_of(value.truncate_prompt_tokens, model.max_model_len)
            write = lambda: _embedding_inputs(value, model, truncate_to)  # noqa: E731
            pooled, num_tokens = await (await self._run(request, parts, body, write, params))
        vectors = bodies.vectors_of(pooled)
        encoding = value.encoding_format or "float"
        return _json(bodies.embeddings_body(model.name, vectors, encoding, num_tokens))

    async def rerank(self, request: Request) -> Response:
        body = await self._routes.bodies.parse(request, RerankRequest)
        value = body.value
        documents = value.document_texts()
        if not documents:
            raise InvalidRequestError("documents must not be empty", param="documents")
        _check_texts([value.query], "query")
        _check_texts(documents, "documents")
        pairs = [(value.query, document) for document in documents]
        async with self._routes.model_for(request, value.model) as parts:
            model = self._pooling_model(parts)
            truncate_to = truncation_of(value.truncate_prompt_tokens, model.max_model_len)
            scores, num_tokens = await self._scores(request, parts, body, model, pairs, truncate_to)
        return_documents = value.return_documents is not False
        top_n = value.top_n
        return _json(
            bodies.rerank_body(model.name, scores, documents, top_n, return_documents, num_tokens)
        )

    async def score(self, request: Request) -> Response:
        body = await self._routes.bodies.parse(request, ScoreRequest)
        value = body.value
        pairs = _score_pairs(value.text_1, value.text_2)
        async with self._routes.model_for(request, value.model) as parts:
            model = self._pooling_model(parts)
            truncate_to = truncation_of(value.truncate_prompt_tokens, model.max_model_len)
            scores, num_tokens = await self._scores(request, parts, body, model, pairs, truncate_to)
        return _json(bodies.score_body(model.name, scores, num_tokens))

    async def ollama_embed(self, request: Request) -> Response:
        start_ns = time.perf_counter_ns()
        body = await self._routes.bodies.parse(request, OllamaEmbedRequest)
        value = body.value
        texts = [value.input] if isinstance(value.input, str) else value.input
        texts = [text for text in texts if text]  # Ollama skips an empty text
        name, keep_alive = _ollama_name(value.model), keep_alive_s(value.keep_alive)
        async with self._routes.model_for(request, name, keep_alive_s=keep_alive) as parts:
            model = self._embedder(parts)
            params = _params(model, value.dimensions)
            if not texts:
                return _json(bodies.ollama_embed_body(model.name, np.zeros((0, 0)), 0, 0))
            truncate_to = None if value.truncate is False else model.max_model_len
            run = await self._run(
                request,
                parts,
                body,
                lambda: text_inputs(texts, model, truncate_to, "input"),
                params,
            )
            pooled, num_tokens = await run
        total_ns = time.perf_counter_ns() - start_ns
        vectors = bodies.vectors_of(pooled)
        return _json(bodies.ollama_embed_body(model.name, vectors, num_tokens, total_ns))

    async def ollama_embeddings(self, request: Request) -> Response:
        body = await self._routes.bodies.parse(request, OllamaEmbeddingsRequest)
        value = body.value
        name, keep_alive = _ollama_name(value.model), keep_alive_s(value.keep_alive)
        async with self._routes.model_for(request, name, keep_alive_s=keep_alive) as parts:
            model = self._embedder(parts)
            if not value.prompt:
                return _json(bodies.ollama_embedding_body(np.zeros((0, 0))))
            prompt = value.prompt
            write = lambda: text_inputs([prompt], model, model.max_model_len, "prompt")  # noqa: E731
            pooled, _ = await (await self._run(request, parts, body, write))
        return _json(bodies.ollama_embedding_body(bodies.vectors_of(pooled)))

    # -- steps -------------------------------------------------------------------

    def _pooling_model(self, parts: ModelParts) -> PoolingModelView:
        """The view of a pooling model; a 400 naming a generation model."""
        served = parts.model.served
        if served.pooling is None:
            raise InvalidRequestError(
                f"model {parts.name} is a generation model: it serves chat and completions, "
                "not embeddings, rerank or score (serve an embedding model, or a decoder with "
                "--task embed or --task score)",
                param="model",
            )
        view = self._views.get(id(served))
        if view is None:
            backend = pooling_backend(cast(Tokenizer, served.tokenizer).backend)
            view = PoolingModelView(
                parts.name, backend, served.tokenizer.vocab_size, served.max_model_len,
                served.pooling,
            )  # fmt: skip
            self._views = {id(served): view}  # the latest model's (one per server for now)
        return view

    def _embedder(self, parts: ModelParts) -> PoolingModelView:
        model = self._pooling_model(parts)
        if model.spec.pair_format != "embeddings":
            raise InvalidRequestError(
                f"model {model.name} is a reranker: it serves /v1/rerank and /v1/score, "
                "not embeddings",
                param="model",
            )
        return model

    async def _run(
        self,
        request: Request,
        parts: ModelParts,
        body: ParsedBody[Any],
        write: Callable[[], list[PoolingInput]],
        params: PoolingParams | None = None,
    ) -> Awaitable[tuple[PooledOutput, int]]:
        """Admit, write the inputs (off the loop for a large body), start the
        engine request: its (pooled output, tokens), to await."""
        queue_timeout = self._routes.admit(request, 1, parts, is_pooling=True)

        async def convert(value: Any, options: Any) -> list[PoolingInput]:
            return write()

        inputs = await self._routes.bodies.convert(body, convert, parts.model.conversion)
        return pool(request, parts, inputs, params or PoolingParams(), queue_timeout)

    async def _scores(
        self,
        request: Request,
        parts: ModelParts,
        body: ParsedBody[Any],
        model: PoolingModelView,
        pairs: list[tuple[str, str]],
        truncate_to: int | None,
    ) -> tuple[np.ndarray, int]:
        """[num_pairs] scores: the model's own, or its embeddings' cosine similarity."""
        if model.spec.pair_format != "embeddings":
            write = lambda: pair_inputs(pairs, model, truncate_to, "documents")  # noqa: E731
            pooled, num_tokens = await (await self._run(request, parts, body, write))
            return bodies.vectors_of(pooled)[:, 0], num_tokens
        texts = [query for query, _ in pairs] + [document for _, document in pairs]
        write = lambda: text_inputs(texts, model, truncate_to, "input")  # noqa: E731
        pooled, num_tokens = await (await self._run(request, parts, body, write))
        vectors = bodies.vectors_of(pooled)
        return bodies.cosine(vectors[: len(pairs)], vectors[len(pairs) :]), num_tokens


def _params(model: PoolingModelView, dimensions: int | None) -> PoolingParams:
    if dimensions is not None and (problem := model.spec.check_dimensions(dimensions)):
        raise InvalidRequestError(f"{problem} (asked for {dimensions})", param="dimensions")
    return PoolingParams(dimensions=dimensions)


def _embedding_inputs(
    value: EmbeddingsRequest, model: PoolingModelView, truncate_to: int | None
) -> list[PoolingInput]:
    raw = value.input
    if isinstance(raw, str):
        return text_inputs([raw], model, truncate_to, "input")
    if isinstance(raw[0], str):
        return text_inputs(cast(list[str], raw), model, truncate_to, "input")
    if isinstance(raw[0], int):
        return token_inputs([cast(list[int], raw)], model, truncate_to)
    return token_inputs(cast(list[list[int]], raw), model, truncate_to)


def _ollama_name(requested: str) -> str:
    """The model an Ollama client names (its ":latest" tag dropped, as /api/chat's)."""
    return requested.removesuffix(LATEST_TAG)


def _check_embedding_input(raw: str | list[str] | list[int] | list[list[int]]) -> None:
    """An input with nothing to embed is a 400: "", [], [""], [[]]."""
    if isinstance(raw, str):
        _check_texts([raw])
    elif not raw:
        raise InvalidRequestError("input must not be empty", param="input")
    elif isinstance(raw[0], str):
        _check_texts(cast(list[str], raw))
    elif isinstance(raw[0], list) and not all(raw):
        raise InvalidRequestError("input holds an empty list of token ids", param="input")


def _check_texts(texts: list[str], param: str = "input") -> None:
    if not texts:
        raise InvalidRequestError(f"{param} must not be empty", param=param)
    for index, text in enumerate(texts):
        if not text:
            raise InvalidRequestError(f"{param} {index} is an empty string", param=param)


def _score_pairs(text_1: str | list[str], text_2: str | list[str]) -> list[tuple[str, str]]:
    """vLLM's pairing: one text_1 against every text_2, else one to one."""
    firsts = [text_1] if isinstance(text_1, str) else text_1
    seconds = [text_2] if isinstance(text_2, str) else text_2
    _check_texts(firsts, "text_1")
    _check_texts(seconds, "text_2")
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    if len(firsts) != len(seconds):
        raise InvalidRequestError(
            f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: give one text_1, "
            "or as many as text_2",
            param="text_2",
        )
    return list(zip(firsts, seconds, strict=True))


def _json(body: bytes) -> Response:
    return Response(body, media_type="application/json")
