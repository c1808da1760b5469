"""What the route handlers of one app share (`Routes`): the models it serves
(model_pool.py), the model a request names, admission and the answer of a
generation; every API's routes (sluice/apis/<api>/routes.py) take it as an
`AppRoutes` (app_routes.py).

Each generation route: parse the body (body, protocol) -> the model it names
(`model_for`: a 404 naming the served ones; started if need be) -> admission
(`admit`: before any work) -> check it and tokenize (to_internal, preprocess)
-> hand the frozen `GenerationRequest` to the model's `Frontend`
(generation_reply.py); a large body is parsed and converted off the loop
(body.py). Invariants:
- Every engine request passes its model's `AdmissionGate`: a full queue or a
  draining server is a 503 with Retry-After before any work; a request that
  waits past its queue timeout for its first token gets one clear error. A
  wait for its model to start counts against the same timeout: one deadline.
- A route that names no model is served by the first (a server of one model).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import Request
from starlette.responses import Response

from sluice.apis import openai_request
from sluice.config import ServerConfig
from sluice.engine.client_base import EngineClient, QueueTimeout, ReplicaState
from sluice.engine.supervisor import EngineSupervisor
from sluice.errors import EngineDeadError, InvalidRequestError, ModelUnavailableError
from sluice.frontend.request import GenerationRequest
from sluice.frontend.serving import Frontend, ResponseChunks
from sluice.server.body.body import BodyReader
from sluice.server.http.event_stream import (
    EVENT_STREAM_MEDIA_TYPE,
)
from sluice.server.http.generation_reply import GenerationRun
from sluice.server.in_flight import admission
from sluice.server.in_flight.admission import AdmissionGate
from sluice.server.in_flight.request_context import context_of
from sluice.server.observability.metrics import ServerMetrics
from sluice.server.served_models.model_catalog import pool_limits
from sluice.server.served_models.model_entry import ModelSpec
from sluice.server.served_models.model_parts import (
    ModelOptions,
    ModelParts,
    model_options,
    model_parts,
)
from sluice.server.served_models.model_pool import ModelPool
from sluice.server.served_models.served_model import ServedModel, ServedTokenizer

# An API route's handler (the route's path parameters as keyword arguments).
Handler = Callable[..., Awaitable[Response]]


class Routes:
    """What the route handlers of one app share; each request takes the
    parts of the model it names (`model_for`)."""

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
        context = context_of(request.scope)
        on_wait = functools.partial(setattr, context.log, "model_wait_s")
        async with self.models.use(resolved, wait_s, keep_alive_s, on_wait) as lease:
            context.model_wait_s = lease.waited_s  # off its queue timeout (admit)
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
    def options(self) -> openai_request.RequestOptions:
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
        return loaded[0][1].gate.engine.replicas() if len(loaded) == 1 else []

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
        if not model.gate.engine.is_alive:
            raise EngineDeadError(f"the engine of `{model.name}` is not running; retry later")
        model.gate.check_open(n)
        lease = context_of(request.scope).key_lease
        if lease is not None:  # a choice is a request to the key's limits
            lease.seat_choices(n)
        return None if timeout_s is None else QueueTimeout(timeout_s)

    def _queue_timeout_left(self, request: Request) -> float | None:
        """What is left of the request's queue timeout after its wait for its
        model to start: one deadline bounds both waits (None: no timeout)."""
        timeout_s = admission.queue_timeout_s(
            request.headers.get(admission.QUEUE_TIMEOUT_HEADER), self.queue_timeout_s
        )
        waited_s = context_of(request.scope).model_wait_s
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
        chunks: ResponseChunks,
        media_type: str = EVENT_STREAM_MEDIA_TYPE,
        *,
        model: ModelParts | None = None,
    ) -> Response:
        """Run `generation` on `model` (None: the first model's, running) and
        answer with its stream or body; `chunks`: its API's projection, built
        by the route; `media_type`: the stream's (Ollama's
        NDJSON lines)."""
        run = GenerationRun(request, model or self.default_parts(), generation, queue_timeout,
                            chunks, media_type)  # fmt: skip
        return await run.reply(self.send_timeout_s)
