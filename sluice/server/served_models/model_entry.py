"""One model of a server's `ModelPool` (sluice/server/served_models/model_pool.py): what
it is before it runs (`ModelSpec`), the pool's bounds (`PoolLimits`), a
running model (`ActiveModel`), a request's hold on it (`ModelLease`), what
the listings show (`ModelStatus`), and its state (`ModelEntry`), which only
its pool's code on the event loop changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sluice.engine.client_base import EngineClient
from sluice.engine.supervisor import EngineSupervisor
from sluice.server.in_flight.admission import AdmissionGate
from sluice.server.served_models.served_model import ServedModel

P = TypeVar("P")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model the server may serve, before anything of it is read."""

    # The name clients send as `model`.
    name: str
    # Reads its ServedModel (tokenizer, context length): small files; runs in a thread.
    describe: Callable[[], ServedModel]
    # A new engine client for it, not started (cheap; called on the loop).
    make_engine: Callable[[], EngineClient]
    # Memory its engine is expected to hold (weights' files + KV pool), for the budget.
    estimated_bytes: int = 0
    # Started with the server (the only model, or --preload); its failure stops the startup.
    is_preloaded: bool = False
    # Never stopped (an engine handed to `create_app` already built).
    is_pinned: bool = False
    # Checks its files cheaply (headers, sizes; in a thread) before its start
    # stops any other model: a ModelLoadError names what is wrong. None: no check.
    check: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class PoolLimits:
    """How many models may run at once, and how much memory they may take."""

    # Engine queue bound of each model's AdmissionGate.
    gate_capacity: int
    max_loaded: int | None = None
    memory_budget_bytes: int | None = None
    # keep_alive of a request that names none (None: loaded until evicted).
    default_keep_alive_s: float | None = None
    # How long a failed start is remembered: its requests get its error at
    # once (Retry-After: the rest of it) instead of each trying again, and
    # stopping the loaded models again, to fail the same way.
    failure_memory_s: float = 30.0


@dataclass(slots=True, eq=False)
class ActiveModel(Generic[P]):
    """A model whose engine runs."""

    served: ServedModel
    gate: AdmissionGate
    supervisor: EngineSupervisor | None
    # What the app built for it (frontend, request options: `ModelPool.prepare`).
    parts: P


@dataclass(slots=True, eq=False)
class ModelLease(Generic[P]):
    """A request's hold on a running model."""

    model: ActiveModel[P]
    # How long the request waited for the model to start (None: it was running).
    waited_s: float | None


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """One model as /v1/models, /api/tags and /api/ps show it."""

    name: str
    # "loaded", "loading", "unloading" (once its requests are done) or "unloaded".
    state: str
    served: ServedModel | None
    estimated_bytes: int
    # Why its latest start failed (None: it did not).
    last_error: str | None
    # When its keep_alive runs out, on the loop's clock (None: not scheduled).
    expires_at: float | None
    # Engine starts that succeeded (a switch to a running model adds none).
    num_loads: int = 0


class ModelEntry(Generic[P]):
    """One model's state, owned by the event loop (its pool's)."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.served: ServedModel | None = None
        self.active: ActiveModel[P] | None = None
        self.loading: asyncio.Future[None] | None = None
        # Requests waiting for its next start, each handed its lease by it.
        self.waiters: list[asyncio.Future[ActiveModel[P]]] = []
        self.num_leases = 0
        self.last_used = 0  # the pool's use counter at its latest lease
        self.is_evicting = False
        self.last_error: str | None = None
        # When its latest start failed, on the pool's clock (None: it did not).
        self.failed_at: float | None = None
        self.num_loads = 0  # engine starts that succeeded
        self.expiry: asyncio.TimerHandle | None = None
        # When `expiry` fires, on the loop's clock (uvloop's handles do not say).
        self.expires_at: float | None = None
        # Set while no request holds it.
        self.is_unleased = asyncio.Event()
        self.is_unleased.set()
        self.num_restarts_before = 0  # restarts of its engines already stopped
        # Refusals of its gates already stopped, by reason (/metrics' counters never go back).
        self.num_refused_before: dict[str, int] = {}

    @property
    def is_idle(self) -> bool:
        """No request holds it, and its engine has none in flight."""
        return self.num_leases == 0 and (self.active is None or self.active.gate.num_in_flight == 0)

    @property
    def num_restarts(self) -> int:
        """Dead engines of it brought back, stopped engines' too."""
        active = self.active
        running = (
            0 if active is None or active.supervisor is None else active.supervisor.num_restarts
        )
        return self.num_restarts_before + running

    @property
    def num_in_flight(self) -> int:
        """Engine requests its running gate admitted and not yet ended."""
        return 0 if self.active is None else self.active.gate.num_in_flight

    @property
    def num_refused(self) -> dict[str, int]:
        """Requests its gates refused, by reason, stopped gates' too."""
        total = {"queue_full": 0, "queue_timeout": 0, "shutting_down": 0}
        counts = [self.num_refused_before]
        if self.active is not None:
            counts.append(self.active.gate.num_refused)
        for reason, count in (item for c in counts for item in c.items()):
            total[reason] = total.get(reason, 0) + count
        return total

    @property
    def is_running(self) -> bool:
        """A request for it is served without waiting for a start."""
        return self.active is not None and not self.is_evicting

    def lease(self, use_number: int) -> None:
        """A request holds it from now on (its pool's `use_number`th use)."""
        self.num_leases += 1
        self.is_unleased.clear()
        self.last_used = use_number
        self.cancel_expiry()

    def cancel_expiry(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
        self.expiry = self.expires_at = None

    def release(self) -> None:
        self.num_leases -= 1
        if self.num_leases == 0:
            self.is_unleased.set()

    async def until_idle(self) -> None:
        while not self.is_idle:
            if self.num_leases > 0:
                await self.is_unleased.wait()
            elif self.active is not None:
                await self.active.gate.until_idle()

    def status(self) -> ModelStatus:
        state = "loaded" if self.active is not None else "unloaded"
        if self.is_evicting:
            state = "unloading"
        elif self.loading is not None and self.active is None:
            state = "loading"
        # A loaded model's context as its engine serves it (maybe fitted to memory).
        served = self.active.served if self.active is not None else self.served
        return ModelStatus(self.spec.name, state, served, self.spec.estimated_bytes,
                           self.last_error, self.expires_at, self.num_loads)  # fmt: skip
