"""The pooling engine core: embedding and score requests, batched per step,
beside the generation core (`core.EngineCore`) and driven the same way.

Both cores offer what a driver (the engine process's loop, the in-process
client's thread) calls: `handle` one client input, `step`, `take_errors`,
`has_unfinished_requests`, `stats`, `info`; `engine_core_for` builds the one
the model needs. A pooling request (an `EngineRequest` with a `Pooling`
payload) is one API request: all its inputs, answered together in one
finishing delta whose `pooled` holds a vector per input, in order. A
generation request sent here (or a pooling one to the generation core) is
refused with an EngineError.

A step takes waiting inputs first come, first served, up to the scheduler's
token budget (`max_num_batched_tokens`) and `max_num_seqs` sequences, and
always at least one (an input longer than the budget runs alone: an encoder
sees a whole sequence at once). A request's inputs may span several steps;
it finishes in the step that pools its last one. Nothing outlives a step:
no KV cache, no preemption. Aborted requests leave the queue at once.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import torch

from sluice.config import EngineConfig
from sluice.engine.core import EngineCore
from sluice.engine.engine_request import EngineRequest, Pooling
from sluice.engine.messages import (
    AbortRequests,
    AddRequest,
    EngineInput,
    EngineReady,
    EngineStatsSnapshot,
    ResetPrefixCache,
    Shutdown,
)
from sluice.engine.outputs import EngineError, PooledOutput, RequestDelta
from sluice.engine.pooling_params import PoolingInput, PoolingParams, PoolingSpec
from sluice.engine.pooling_runner import PoolingRunner
from sluice.loader.pooling_model import LoadedPoolingModel, load_pooling_model, pooling_spec_of
from sluice.models.pooling import finish

logger = logging.getLogger("sluice.engine")


class Core(Protocol):
    """What a driver calls on an engine core (either kind)."""

    info: EngineReady

    def handle(
        self, message: EngineInput, deltas: list[RequestDelta], errors: list[EngineError]
    ) -> bool: ...

    def has_unfinished_requests(self) -> bool: ...

    def step(self) -> list[RequestDelta]: ...

    def take_errors(self) -> list[EngineError]: ...

    def stats(self) -> EngineStatsSnapshot: ...


def engine_core_for(config: EngineConfig) -> EngineCore | PoolingCore:
    """The core `config`'s model needs: pooling for an embedder or a reranker."""
    spec = pooling_spec_of(config.model)
    if spec is None:
        return EngineCore(config)
    return PoolingCore(config, load_pooling_model(config.model, spec))


def fresh_core(core: EngineCore | PoolingCore) -> EngineCore | PoolingCore:
    """A new core of the same kind on the same loaded weights (a restart)."""
    if isinstance(core, PoolingCore):
        return PoolingCore(core.config, core.loaded)
    return EngineCore(core.config, core.loaded)


@dataclass(slots=True, eq=False)
class PoolingRequest:
    request_id: str
    inputs: list[PoolingInput]
    params: PoolingParams
    # Inputs taken into a step so far (they are pooled in that step).
    num_scheduled: int = 0
    # [1, num_dimensions] float32 per input pooled so far, in input order.
    vectors: list[torch.Tensor] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(one.token_ids) for one in self.inputs)


class PoolingCore:
    def __init__(self, config: EngineConfig, loaded: LoadedPoolingModel):
        self.config = config
        self.loaded = loaded
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.spec: PoolingSpec = loaded.spec
        self.runner = PoolingRunner(loaded)
        self.max_num_batched_tokens = config.scheduler.max_num_batched_tokens
        self.max_num_seqs = config.scheduler.max_num_seqs
        self.waiting: deque[PoolingRequest] = deque()
        self._errors: list[EngineError] = []
        self.info = EngineReady(
            model_name=loaded.name,
            max_model_len=loaded.max_model_len,
            num_kv_blocks=0,
            block_size_tokens=config.cache.block_size_tokens,
            vocab_size=loaded.vocab_size,
            pooling=self.spec,
        )
        logger.info(
            "pooling engine ready: %s (%s, %s pooling%s), up to %d tokens a step",
            loaded.name, self.spec.task, self.spec.pooling,
            ", normalized" if self.spec.normalize else "", self.max_num_batched_tokens,
        )  # fmt: skip

    def add_request(self, request: EngineRequest) -> None:
        """Queue a pooling request; ValueError for one the engine can never run."""
        request_id, payload = request.request_id, request.payload
        if not isinstance(payload, Pooling):
            raise ValueError(f"{self.loaded.name} is a pooling model")
        if not payload.inputs:
            raise ValueError("a pooling request needs at least one input")
        for one in payload.inputs:
            if not 0 < len(one.token_ids) <= self.loaded.max_model_len:
                raise ValueError(
                    f"an input of {len(one.token_ids)} tokens; this model takes 1 to "
                    f"{self.loaded.max_model_len}"
                )
        if any(waiting.request_id == request_id for waiting in self.waiting):
            raise ValueError(f"request id {request_id!r} is already live")
        self.waiting.append(PoolingRequest(request_id, list(payload.inputs), payload.params))

    def abort_requests(self, request_ids: list[str]) -> list[RequestDelta]:
        gone = set(request_ids)
        aborted = [request for request in self.waiting if request.request_id in gone]
        self.waiting = deque(request for request in self.waiting if request.request_id not in gone)
        return [_delta(request, "abort", None) for request in aborted]

    def handle(
        self, message: EngineInput, deltas: list[RequestDelta], errors: list[EngineError]
    ) -> bool:
        """Apply one client input (as `EngineCore.handle`); False on Shutdown."""
        match message:
            case AddRequest(request):
                try:
                    self.add_request(request)
                except ValueError as error:
                    errors.append(EngineError(request.request_id, str(error)))
            case AbortRequests(request_ids):
                deltas.extend(self.abort_requests(request_ids))
            case ResetPrefixCache():
                pass  # nothing is cached
            case Shutdown():
                return False
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting)

    def take_errors(self) -> list[EngineError]:
        errors, self._errors = self._errors, []
        return errors

    def step(self) -> list[RequestDelta]:
        # 1. Choose the inputs: first come, first served, within the token budget.
        batch = self._schedule()
        if not batch:
            return []
        # 2. Run the model once over all of them.
        vectors = self.runner.execute([request.inputs[i] for request, i in batch])  # [B, D]
        # 3. Hand each input its vector; finish the requests whose last input ran.
        deltas = []
        for row, (request, _) in enumerate(batch):
            request.vectors.append(vectors[row : row + 1])
            if len(request.vectors) == len(request.inputs):
                deltas.append(self._finished(request))
        return deltas

    def _schedule(self) -> list[tuple[PoolingRequest, int]]:
        batch: list[tuple[PoolingRequest, int]] = []
        num_tokens = 0
        for request in self.waiting:
            while request.num_scheduled < len(request.inputs):
                n = len(request.inputs[request.num_scheduled].token_ids)
                full = num_tokens + n > self.max_num_batched_tokens
                if batch and (full or len(batch) == self.max_num_seqs):
                    return batch
                batch.append((request, request.num_scheduled))
                request.num_scheduled += 1
                num_tokens += n
        return batch

    def _finished(self, request: PoolingRequest) -> RequestDelta:
        self.waiting.remove(request)
        vectors = finish(torch.cat(request.vectors), self.spec.normalize, request.params.dimensions)
        data = vectors.to(torch.float32).contiguous().numpy().tobytes()
        return _delta(request, "stop", PooledOutput(data, len(request.inputs)))

    def stats(self) -> EngineStatsSnapshot:
        running = sum(1 for request in self.waiting if request.num_scheduled)
        return EngineStatsSnapshot(num_running=running, num_waiting=len(self.waiting) - running)


def _delta(request: PoolingRequest, finish_reason, pooled: PooledOutput | None) -> RequestDelta:
    return RequestDelta(
        request.request_id, (), None, finish_reason, None, request.num_tokens, pooled=pooled
    )
