"""The FastAPI app: OpenAI-compatible routes over one engine and one tokenizer.

    POST /v1/completions, /v1/chat/completions   generation, streamed (SSE) or not
    POST /v1/messages, /v1/messages/count_tokens Anthropic's Messages API (the same path)
    /v1/responses...                             OpenAI's Responses API (responses_routes.py)
    GET  /v1/models, /version, /health, /metrics and POST /tokenize, /detokenize,
    /reset_prefix_cache                          everything but generation (info_routes.py)

The APIs' routes are registered from the API table (sluice/apis/surface.py),
each with the handler that serves it; the middleware and the error handlers
read the same table.

Each generation route: parse the body (body, protocol) -> check it and
tokenize (to_internal, preprocess) -> hand the frozen `GenerationRequest` to
the `Frontend`; a large body is parsed and converted off the loop (body.py).
Invariants:
- Nothing is sent before the first event exists, so an error before the first
  token (engine dead, queue full) is a real HTTP error, not a 200 stream.
- A client that goes away is noticed by waiting on the ASGI `receive` channel
  for `http.disconnect` (never by polling) and cancels the request, which the
  frontend turns into an engine abort; streams are closed in every case.
- The engine starts and stops with the app (lifespan), and so do its
  supervisor (restart or exit when it dies) and the loop watchdog.
- Every engine request passes the `AdmissionGate`: a full queue or a draining
  server is a 503 with Retry-After before any work; a request that waits past
  its queue timeout for its first token gets one clear error. A wait for its
  model to start counts against the same timeout: one deadline.
- A stream whose writes stay stuck for `send_timeout_s` is cut and its engine
  requests aborted; other streams never wait for it.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from sluice.apis.embeddings.routes import EmbeddingsRoutes
from sluice.apis.ollama.routes import OllamaRoutes
from sluice.apis.surface import (
    API_TABLE,
    CHAT_CREATE,
    COMPLETIONS_CREATE,
    MESSAGES_COUNT_TOKENS,
    MESSAGES_CREATE,
    ApiRoute,
    ApiTable,
)
from sluice.config import ServerConfig
from sluice.engine.client_base import EngineClient, QueueTimeout, ReplicaState
from sluice.engine.supervisor import EngineSupervisor
from sluice.errors import EngineDeadError, InvalidRequestError, ModelUnavailableError
from sluice.frontend.observer import RequestObserver
from sluice.frontend.request import GenerationRequest
from sluice.frontend.serving import Frontend, ResponseChunks
from sluice.server import (
    admission,
    messages_protocol,
    messages_to_internal,
    protocol,
    to_internal,
)
from sluice.server.admission import AdmissionCollector, AdmissionGate
from sluice.server.api_keys import KeyRing
from sluice.server.body import BodyReader
from sluice.server.connection import unless_disconnected
from sluice.server.errors import install_error_handlers
from sluice.server.event_stream import (
    EVENT_STREAM_MEDIA_TYPE,
    EventStreamResponse,
    completion_tokens,
)
from sluice.server.info_routes import InfoRoutes, sluice_version
from sluice.server.key_limits import KeyLease, KeyLimiter
from sluice.server.loop_watchdog import LoopWatchdog
from sluice.server.metrics import ServerMetrics
from sluice.server.middleware import CLIENT_CLOSED_STATUS, RequestLog, middleware_stack
from sluice.server.model_catalog import pool_limits
from sluice.server.model_entry import ModelSpec
from sluice.server.model_parts import ModelOptions, ModelParts, model_options, model_parts
from sluice.server.model_pool import ModelPool
from sluice.server.pages import add_pages
from sluice.server.read_metrics import ReadCounter, ReadInfos, ReadModelCounters
from sluice.server.replicas import ReplicaCollector
from sluice.server.request_series import SeriesObserver
from sluice.server.request_spans import RequestTrace, TracedObserver
from sluice.server.response_store import ResponseStore
from sluice.server.responses_routes import ResponsesRoutes
from sluice.server.served_model import ServedModel, ServedTokenizer
from sluice.server.shutdown import GracefulShutdown
from sluice.tracing import otlp_tracer

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

# An API route's handler (the route's path parameters as keyword arguments).
Handler = Callable[..., Awaitable[Response]]


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
    """The app serving `models` (sluice/server/model_pool.py: each started on
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
    registry.register(ReadCounter("sluice:engine_restarts", "Dead engines brought back.",
                                  lambda: pool.num_restarts))  # fmt: skip
    registry.register(ReadModelCounters(
        "sluice:model_loads", "Engine starts of each model (a switch to a loaded model: none).",
        lambda: {name: pool.num_loads(name) for name in pool.names},
    ))  # fmt: skip
    watchdog = LoopWatchdog(registry)
    registry.register(AdmissionCollector(pool))
    registry.register(ReplicaCollector(routes.replicas))
    registry.register(ReadInfos(
        "sluice:kernel_plan", "The kernels each engine chose at load (--kernel-plan).",
        lambda: [{"model_name": name, "plan": active.gate.engine.info.kernel_plan}
                 for name, active in pool.loaded() if getattr(active.gate.engine.info,
                                                              "kernel_plan", "")],
    ))  # fmt: skip

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
    responses = ResponsesRoutes(routes, ResponseStore(config.responses_store_bytes))
    ollama = OllamaRoutes(routes)
    embeddings = EmbeddingsRoutes(routes)
    handlers = {
        **routes.handlers(),
        **responses.handlers(),
        **ollama.handlers(),
        **embeddings.handlers(),
    }
    add_api_routes(app, apis, handlers)
    InfoRoutes(routes).add_to(app)
    add_pages(app)  # the chat at / and the dashboard at /dashboard
    return app


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


class Routes:
    """The route handlers of one app and what they share; each request takes
    the parts of the model it names (`model_for`)."""

    def __init__(
        self,
        config: ServerConfig,
        models: list[ModelSpec],
        on_exit: Callable[[], None] = lambda: None,
        is_keyed: bool = False,
        clock: Callable[[], float] | None = None,
    ):
        """`clock`: seconds, the pool's (its waits for starts; default the loop's time)."""
        self.config = config
        self.send_timeout_s = config.send_timeout_s
        self.queue_timeout_s = config.queue_timeout_s
        self.metrics = ServerMetrics(is_keyed=is_keyed)
        self.bodies = BodyReader(
            config.limits, default_conversion=lambda: self.default_parts().model.conversion
        )
        self._on_exit = on_exit
        self._options: dict[str, ModelOptions] = {}
        num_replicas = 1 if config.data_parallel is None else config.data_parallel.num_replicas
        capacity = num_replicas * admission.capacity_of(config.engine.scheduler)
        self.models: ModelPool[ModelParts] = ModelPool(
            models, pool_limits(config, capacity), self._prepare, self._supervise, clock
        )

    def handlers(self) -> dict[ApiRoute, Handler]:
        """The API routes served here."""
        return {
            COMPLETIONS_CREATE: self.completions,
            CHAT_CREATE: self.chat_completions,
            MESSAGES_CREATE: self.messages,
            MESSAGES_COUNT_TOKENS: self.count_tokens,
        }

    # -- the model a request names -------------------------------------------------

    @asynccontextmanager
    async def model_for(
        self,
        request: Request,
        name: str | None,
        *,
        keep_alive_s: float | None = None,
        is_any_name_served: bool = False,
    ) -> AsyncIterator[ModelParts]:
        """The running model `name` names (404 naming the served ones), held
        while the route works; started first if need be, waiting at most the
        request's queue timeout (the access log shows the wait, and its wait
        for the first token gets what is left: `admit`). `keep_alive_s`:
        how long it stays loaded once idle (None: the server's default; 0: stop
        it after this request; inf: ever); `is_any_name_served`: an unknown
        name means the first model (the agent APIs)."""
        resolved = self.models.resolve(name, is_any_name_served=is_any_name_served)
        wait_s = admission.queue_timeout_s(
            request.headers.get(admission.QUEUE_TIMEOUT_HEADER), self.queue_timeout_s
        )
        log = _request_log(request)
        on_wait = None if log is None else functools.partial(setattr, log, "model_wait_s")
        async with self.models.use(resolved, wait_s, keep_alive_s, on_wait) as lease:
            request.state.model_wait_s = lease.waited_s  # off its queue timeout (admit)
            yield lease.model.parts

    async def options_for(self, name: str | None) -> ModelOptions:
        """The request options of model `name` (its engine need not run)."""
        resolved = self.models.resolve(name)
        options = self._options.get(resolved)
        if options is None:
            served = await self.models.describe(resolved)
            options = self._options.setdefault(
                resolved, model_options(self.config, resolved, served)
            )
        return options

    def default_parts(self) -> ModelParts:
        """The first model's parts (a server of one model: its model's); a 503
        while it is not running."""
        active = self.models.active(self.models.default_name)
        if active is None:
            raise ModelUnavailableError(f"the model `{self.models.default_name}` is not loaded")
        return active.parts

    # The first model's, for routes that name no model (a server of one model).
    @property
    def served_name(self) -> str:
        return self.models.default_name

    @property
    def gate(self) -> AdmissionGate:
        return self.default_parts().gate

    @property
    def frontend(self) -> Frontend:
        return self.default_parts().frontend

    @property
    def options(self) -> to_internal.RequestOptions:
        return self.default_parts().model.options

    @property
    def tokenizer(self) -> ServedTokenizer:
        return self.default_parts().model.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.default_parts().model.max_model_len

    def replicas(self) -> list[ReplicaState]:
        """The replicas of a data-parallel engine (a server of one model)."""
        loaded = self.models.loaded()
        return loaded[0][1].gate.replicas() if len(loaded) == 1 else []

    def _prepare(self, name: str, served: ServedModel, gate: AdmissionGate) -> ModelParts:
        options = self._options.get(name) or self._options.setdefault(
            name, model_options(self.config, name, served)
        )

        def is_running(gate: AdmissionGate) -> bool:
            active = self.models.active(name)
            return active is not None and active.gate is gate

        return model_parts(options, gate, self.metrics, is_running)

    def _supervise(self, engine: EngineClient) -> EngineSupervisor:
        return EngineSupervisor(engine, self.config.on_engine_death, on_exit=self._on_exit)

    # -- generation ------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        body = await self.bodies.parse(request, protocol.CompletionRequest)
        async with self.model_for(request, body.value.model) as model:
            queue_timeout = self.admit(request, body.value.n or 1, model)
            generation = await self.bodies.convert(
                body, to_internal.completion_request, model.model.conversion
            )
            return await self.respond(request, generation, queue_timeout, model=model)

    async def chat_completions(self, request: Request) -> Response:
        body = await self.bodies.parse(request, protocol.ChatCompletionRequest)
        async with self.model_for(request, body.value.model) as model:
            queue_timeout = self.admit(request, body.value.n or 1, model)
            generation = await self.bodies.convert(
                body, to_internal.chat_request, model.model.conversion
            )
            return await self.respond(request, generation, queue_timeout, model=model)

    async def messages(self, request: Request) -> Response:
        body = await self.bodies.parse(request, messages_protocol.MessagesRequest)
        async with self.model_for(request, body.value.model, is_any_name_served=True) as model:
            queue_timeout = self.admit(request, 1, model)
            generation = await self.bodies.convert(
                body, messages_to_internal.messages_request, model.model.conversion
            )
            return await self.respond(request, generation, queue_timeout, model=model)

    async def count_tokens(self, request: Request) -> Response:
        body = await self.bodies.parse(request, messages_protocol.CountTokensRequest)
        name = self.models.resolve(body.value.model, is_any_name_served=True)
        options = await self.options_for(name)
        num_tokens = await self.bodies.convert(
            body, messages_to_internal.count_tokens, options.conversion
        )
        return _json({"input_tokens": num_tokens})

    def admit(
        self, request: Request, n: int, model: ModelParts | None = None, *, is_pooling: bool = False
    ) -> QueueTimeout | None:
        """Refuse before any work if the request cannot run on `model` (None:
        the first model's, running); its queue timeout. `is_pooling`: an
        embedding, rerank or score request (a generation one to an embedding
        or reranking model is a 400 naming the model)."""
        model = model or self.default_parts()
        pooling = model.model.served.pooling
        if pooling is not None and not is_pooling:
            kind = "an embedding" if pooling.task == "embed" else "a reranking"
            raise InvalidRequestError(
                f"model {model.name} is {kind} model: it serves /v1/embeddings, /v1/rerank "
                "and /v1/score, not generation",
                param="model",
            )
        timeout_s = self._queue_timeout_left(request)
        if not model.gate.is_alive:
            raise EngineDeadError(f"the engine of `{model.name}` is not running; retry later")
        model.gate.check_open(n)
        lease = _key_lease(request)
        if lease is not None:  # a choice is a request to the key's limits
            lease.seat_choices(n)
        return None if timeout_s is None else QueueTimeout(timeout_s)

    def _queue_timeout_left(self, request: Request) -> float | None:
        """What is left of the request's queue timeout after its wait for its
        model to start: one deadline bounds both waits (None: no timeout)."""
        timeout_s = admission.queue_timeout_s(
            request.headers.get(admission.QUEUE_TIMEOUT_HEADER), self.queue_timeout_s
        )
        waited_s: float | None = getattr(request.state, "model_wait_s", None)
        if timeout_s is None or waited_s is None:
            return timeout_s
        if waited_s >= timeout_s:
            raise admission.QueueTimeoutError(
                f"the request waited {waited_s:.3g} s for its model to load, its whole "
                f"queue timeout ({timeout_s:g} s); retry later"
            )
        return timeout_s - waited_s

    async def respond(
        self,
        request: Request,
        generation: GenerationRequest,
        queue_timeout: QueueTimeout | None,
        chunks: ResponseChunks | None = None,
        media_type: str = EVENT_STREAM_MEDIA_TYPE,
        *,
        model: ModelParts | None = None,
    ) -> Response:
        """Run `generation` on `model` (None: the first model's, running) and
        answer with its stream or body; `chunks`: a builder the route made
        (default: the one its kind names); `media_type`: the stream's (Ollama's
        NDJSON lines)."""
        model = model or self.default_parts()
        if len(generation.prompts) > 1:  # n was checked; n times the prompts may not fit
            model.gate.check_open(generation.num_choices)
        num_prompt_tokens = sum(len(p.token_ids) for p in generation.prompts)
        lease = _key_lease(request)
        if lease is not None:  # before any engine work: the key's seats and tokens
            lease.seat_choices(generation.num_choices)
            num_max_new_tokens = generation.num_choices * generation.params.max_tokens
            lease.reserve(num_prompt_tokens, num_max_new_tokens)
        log = _request_log(request)
        if log is not None:
            log.num_prompt_tokens = num_prompt_tokens
        observer = self._observer_of(request, model)
        run = _Run(request, model, generation, queue_timeout, log, chunks, observer,
                   media_type=media_type)  # fmt: skip
        trace: RequestTrace | None = getattr(request.state, "request_trace", None)
        if trace is not None:
            trace.received(generation.response_id, generation.model_name, num_prompt_tokens)
            observer = TracedObserver(run.observer or model.metrics, trace)
            run = dataclasses.replace(run, observer=observer, trace_context=trace.traceparent)
        if generation.stream:
            return await self._stream(run)
        return await self._complete(run)

    def _observer_of(self, request: Request, model: ModelParts) -> SeriesObserver | None:
        """The observer of a request made with an API key (None: the model's own)."""
        lease = _key_lease(request)
        if lease is None:
            return None
        return model.metrics.observer_for(lease.key_name, lease.charge)

    async def _stream(self, run: _Run) -> Response:
        events = run.model.frontend.stream(
            run.generation, run.queue_timeout, run.chunks, run.observer, run.trace_context
        )
        # Wait for the first event before sending headers: an error up to here
        # propagates from it and becomes a real HTTP error (errors.py).
        try:
            first_event = await unless_disconnected(run.request.receive, anext(events))
        except BaseException:
            await events.aclose()
            raise
        if first_event is None:
            await events.aclose()
            return Response(status_code=CLIENT_CLOSED_STATUS)
        usage_log = run.log if run.generation.include_usage else None
        return EventStreamResponse(
            first_event,
            events,
            self.send_timeout_s,
            usage_log,
            on_write_wait=run.model.metrics.stream_write_waits.inc,
            media_type=run.media_type,
        )

    async def _complete(self, run: _Run) -> Response:
        body = await unless_disconnected(
            run.request.receive,
            run.model.frontend.complete(
                run.generation, run.queue_timeout, run.chunks, run.observer, run.trace_context
            ),
        )
        if body is None:
            return Response(status_code=CLIENT_CLOSED_STATUS)
        if run.log is not None:
            run.log.num_completion_tokens = completion_tokens(body)
        return Response(body, media_type="application/json")


@dataclass(frozen=True, slots=True)
class _Run:
    """One generation route's request on its way to the frontend."""

    request: Request
    model: ModelParts
    generation: GenerationRequest
    queue_timeout: QueueTimeout | None
    log: RequestLog | None
    chunks: ResponseChunks | None
    # The key's observer, or the trace's (None: the app's).
    observer: RequestObserver | None
    # The traceparent the engine's spans continue (None: not traced).
    trace_context: str | None = None
    media_type: str = EVENT_STREAM_MEDIA_TYPE


def _request_log(request: Request) -> RequestLog | None:
    return getattr(request.state, "request_log", None)


def _key_lease(request: Request) -> KeyLease | None:
    return getattr(request.state, "key_lease", None)


def _json(content: object) -> Response:
    return _json_bytes(orjson.dumps(content))


def _json_bytes(body: bytes) -> Response:
    return Response(body, media_type="application/json")
