"""The FastAPI app: OpenAI-compatible routes over the models it serves.

    POST /v1/completions, /v1/chat/completions   generation, streamed (SSE) or not
                                                 (apis/completions/, apis/chat/)
    POST /v1/messages, /v1/messages/count_tokens Anthropic's Messages API (apis/messages/)
    (each over routes.py's Routes, answered by generation_reply.py)
    /v1/responses...                             OpenAI's Responses API (apis/responses/)
    /api/...                                     Ollama's API (apis/ollama/routes.py)
    /v1/embeddings, /v1/rerank, /v1/score        pooling (apis/embeddings/routes.py)
    GET  /v1/models, /version, /health, /metrics and POST /tokenize, /detokenize,
    /reset_prefix_cache                          everything but generation (info_routes.py)

`create_app` assembles them: the API routes are registered from the API
table (sluice/apis/surface.py), each with the handler that serves it; the
middleware and the error handlers read the same table.
Invariants:
- The engines start and stop with the app (lifespan: the preloaded models of
  the pool, model_pool.py), and so do their supervisors (restart or exit
  when one dies) and the loop watchdog.
- /metrics reads one registry: the request series and engine gauges of each
  model (labelled `model_name`), admission, replicas, restarts, model loads.
- The drain on SIGTERM (shutdown.py) covers every model's engine.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from sluice.apis.chat.routes import ChatRoutes
from sluice.apis.completions.routes import CompletionsRoutes
from sluice.apis.embeddings.routes import EmbeddingsRoutes
from sluice.apis.messages.routes import MessagesRoutes
from sluice.apis.ollama.routes import OllamaRoutes
from sluice.apis.responses.routes import ResponsesRoutes
from sluice.apis.responses.store import ResponseStore
from sluice.apis.surface import (
    API_TABLE,
    ApiRoute,
    ApiTable,
)
from sluice.config import ServerConfig
from sluice.engine.client_base import EngineClient
from sluice.server.http.errors import install_error_handlers
from sluice.server.http.info_routes import InfoRoutes, sluice_version
from sluice.server.http.middleware import middleware_stack
from sluice.server.http.pages import add_pages
from sluice.server.http.routes import Handler, Routes
from sluice.server.http.shutdown import GracefulShutdown
from sluice.server.in_flight.admission import AdmissionCollector
from sluice.server.keys.api_keys import KeyRing
from sluice.server.keys.key_limits import KeyLimiter
from sluice.server.observability.loop_watchdog import LoopWatchdog
from sluice.server.observability.read_metrics import ReadInfos, ReadModelCounters
from sluice.server.observability.replicas import ReplicaCollector
from sluice.server.served_models.model_entry import ModelSpec
from sluice.server.served_models.model_parts import ModelParts
from sluice.server.served_models.model_pool import ModelPool
from sluice.server.served_models.served_model import ServedModel
from sluice.tracing import otlp_tracer

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


def create_app(
    config: ServerConfig,
    engine: EngineClient | None = None,
    model: ServedModel | None = None,
    clock: Callable[[], float] = time.monotonic,
    tracer: Tracer | None = None,
    apis: ApiTable = API_TABLE,
    *,
    models: list[ModelSpec] | None = None,
) -> FastAPI:
    """The app serving `models` (sluice/server/served_models/model_pool.py: each started on
    first use or at startup, stopped least recently used), or one `engine`
    already built serving `model` as its name (ServerConfig.served_model_name
    wins); `clock`: the seconds the API keys' rate windows are measured in;
    `tracer`: where request spans go (default: the OTLP endpoint of the config,
    if any); `apis`: the APIs served, whose routes, keys, traces and error
    shapes it reads."""
    if models is None:
        assert engine is not None and model is not None, "an engine and its model, or models"
        models = [_built_model(config, engine, model)]
    endpoint = config.engine.otlp_traces_endpoint
    if tracer is None and endpoint is not None:
        tracer = otlp_tracer(endpoint, "sluice-server")
    keys = KeyRing(config.api_key, config.api_key_file)
    routes = Routes(
        config, models, on_exit=lambda: shutdown.exit(1), is_keyed=keys.is_enabled, clock=clock
    )
    pool = routes.models
    shutdown = GracefulShutdown(pool, config.drain_timeout_s, _PoolSupervisors(pool))
    registry = routes.metrics.registry
    _register_read_metrics(registry, pool)
    watchdog = LoopWatchdog(registry)
    registry.register(AdmissionCollector(pool.counts_by_model))
    registry.register(ReplicaCollector(routes.replicas))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await pool.start()
        except BaseException:
            await pool.shutdown()
            raise
        watchdog.start()
        try:
            yield
        finally:
            await watchdog.stop()
            await pool.shutdown()

    app = FastAPI(
        title="sluice",
        version=sluice_version(),
        lifespan=lifespan,
        middleware=middleware_stack(config, keys, KeyLimiter(clock), tracer, apis),
    )
    install_error_handlers(app, apis.error_shape_of)
    app.state.routes = routes
    # The server (launch.make_server) reloads them on SIGHUP.
    app.state.api_keys = keys
    # The server (launch.make_server) runs this on SIGTERM.
    app.state.shutdown = shutdown
    handlers = _api_handlers(routes, config)
    add_api_routes(app, apis, handlers)
    InfoRoutes(routes).add_to(app)
    add_pages(app)  # the chat at / and the dashboard at /dashboard
    return app


def _register_read_metrics(registry: CollectorRegistry, pool: ModelPool[ModelParts]) -> None:
    """The series /metrics reads from each model's entry when scraped."""
    registry.register(ReadModelCounters(
        "sluice:engine_restarts", "Dead engines brought back.",
        lambda: {name: entry.num_restarts for name, entry in pool.counts_by_model().items()},
    ))  # fmt: skip
    registry.register(ReadModelCounters(
        "sluice:model_loads", "Engine starts of each model (a switch to a loaded model: none).",
        lambda: {name: pool.num_loads(name) for name in pool.names},
    ))  # fmt: skip
    registry.register(ReadInfos(
        "sluice:kernel_plan", "The kernels each engine chose at load (--kernel-plan).",
        lambda: [{"model_name": name, "plan": active.gate.engine.info.kernel_plan}
                 for name, active in pool.loaded() if getattr(active.gate.engine.info,
                                                              "kernel_plan", "")],
    ))  # fmt: skip


def _api_handlers(routes: Routes, config: ServerConfig) -> dict[ApiRoute, Handler]:
    """Every API's route handlers, by route (each API's own routes object)."""
    responses = ResponsesRoutes(routes, ResponseStore(config.responses_store_bytes))
    return {
        **CompletionsRoutes(routes).handlers(),
        **ChatRoutes(routes).handlers(),
        **responses.handlers(),
        **MessagesRoutes(routes).handlers(),
        **OllamaRoutes(routes).handlers(),
        **EmbeddingsRoutes(routes).handlers(),
    }


def _built_model(config: ServerConfig, engine: EngineClient, model: ServedModel) -> ModelSpec:
    """The one model of a server handed its engine already built: started with
    the app, never stopped before it."""
    return ModelSpec(
        config.served_model_name or model.name,
        describe=lambda: model,
        make_engine=lambda: engine,
        is_pinned=True,
    )


class _PoolSupervisors:
    """The supervisors of the pool's running engines, as the drain stops them."""

    def __init__(self, pool: ModelPool[ModelParts]):
        self._pool = pool

    async def stop(self) -> None:
        await self._pool.stop_supervising()


def add_api_routes(app: FastAPI, apis: ApiTable, handlers: Mapping[ApiRoute, Handler]) -> None:
    """Every route of `apis`, served by its handler (each route must have one)."""
    for route in apis.routes():
        handler = handlers.get(route)
        assert handler is not None, f"no handler serves {route.method} {route.path}"
        app.add_api_route(route.path, handler, methods=[route.method])
