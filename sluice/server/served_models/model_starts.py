"""Starting and stopping the engines of a `ModelPool` (model_pool.py), one at a time.

Invariants:
- Starts and stops happen one at a time (`_swap_lock`, first come first
  served). Before a start, the least recently used models are stopped until
  the new one fits `max_loaded` and `memory_budget_bytes` (estimated bytes).
- A start reads the model's description and checks its files (`ModelSpec.check`)
  before it stops anything: a model whose files are broken never stops a
  loaded one.
- A failed start is remembered for `failure_memory_s`: meanwhile its requests
  hear that failure at once (a 503 with Retry-After) and nothing is stopped
  for it again, so repeated requests to a broken model do not thrash the
  loaded ones.
- A start hands a lease to each request waiting for it, or its failure; the
  other models are untouched by it.
- A model with a lease or an engine request in flight is never stopped: a
  start that needs its room marks it evicting and waits for it to go idle.
- keep_alive: a model idle for the keep_alive its latest request asked
  (default `default_keep_alive_s`; None: forever) is stopped; 0 stops it as
  soon as that request is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import Generic, TypeVar

from sluice.engine.client_base import EngineClient
from sluice.engine.supervisor import EngineSupervisor
from sluice.errors import ModelUnavailableError, SluiceError
from sluice.server.in_flight.admission import AdmissionGate, ServiceUnavailableError
from sluice.server.served_models.model_entry import ActiveModel, ModelEntry, PoolLimits
from sluice.server.served_models.served_model import ServedModel

logger = logging.getLogger("sluice.server")

P = TypeVar("P")


class ModelStarts(Generic[P]):
    """The starts and stops of one pool's models (its entries, on the event loop)."""

    def __init__(
        self,
        entries: dict[str, ModelEntry[P]],
        limits: PoolLimits,
        prepare: Callable[[str, ServedModel, AdmissionGate], P],
        supervise: Callable[[EngineClient], EngineSupervisor | None],
        lease: Callable[[ModelEntry[P]], None],
        clock: Callable[[], float],
    ):
        """`lease(entry)`: a request holds `entry` (the pool counts its uses);
        `clock`: seconds, for the failure memory."""
        self._entries = entries
        self.limits = limits
        self.prepare = prepare
        self.supervise = supervise
        self._lease = lease
        self._clock = clock
        self.is_draining = False
        self._swap_lock = asyncio.Lock()

    def loaded(self) -> list[ModelEntry[P]]:
        return [entry for entry in self._entries.values() if entry.active is not None]

    async def describe(self, entry: ModelEntry[P]) -> ServedModel:
        if entry.served is None:
            served = await asyncio.to_thread(entry.spec.describe)
            entry.served = entry.served or served
        return entry.served

    def check_not_failed(self, entry: ModelEntry[P]) -> None:
        """A ModelUnavailableError while `entry`'s latest failed start is remembered."""
        if entry.failed_at is None:
            return
        left_s = entry.failed_at + self.limits.failure_memory_s - self._clock()
        if left_s <= 0:
            return
        error = ModelUnavailableError(
            f"the model `{entry.spec.name}` failed to load: {entry.last_error} "
            f"(not tried again for {math.ceil(left_s)} s)"
        )
        error.retry_after_s = math.ceil(left_s)
        raise error

    # -- starting ---------------------------------------------------------------

    async def start(self, entry: ModelEntry[P], is_startup: bool = False) -> None:
        """Start `entry`'s engine unless it runs, then hand a lease to each
        request waiting for it, or the failure."""
        try:
            async with self._swap_lock:
                if entry.active is None:  # an evicted model is None by now
                    await self._start_locked(entry, is_startup)
                self._hand_over(entry, None)
        except SluiceError as error:
            self._hand_over(entry, error)  # the waiting requests answer it
            if is_startup:
                raise
        except BaseException as error:
            self._hand_over(entry, error)
            raise
        finally:
            entry.loading = None

    def _hand_over(self, entry: ModelEntry[P], error: BaseException | None) -> None:
        waiters, entry.waiters = entry.waiters, []
        active = entry.active
        if error is None and active is None:  # stopped before it was handed (never expected)
            error = ModelUnavailableError(f"the model `{entry.spec.name}` stopped; retry")
        for handed in waiters:
            if handed.done():
                continue
            if active is None or error is not None:
                handed.set_exception(error or ModelUnavailableError(entry.spec.name))
            else:
                self._lease(entry)
                handed.set_result(active)

    async def _start_locked(self, entry: ModelEntry[P], is_startup: bool) -> None:
        name = entry.spec.name
        try:
            if not is_startup:
                self.check_not_failed(entry)  # it failed while this start waited its turn
            served = await self.describe(entry)
            if entry.spec.check is not None:
                await asyncio.to_thread(entry.spec.check)
            await self._make_room(entry)
            entry.active = await self._start_engine(entry, served)
        except ModelUnavailableError:
            raise
        except SluiceError as error:
            entry.last_error = str(error)
            if is_startup:
                raise
            logger.error("model %s failed to load: %s", name, error)
            if isinstance(error, ServiceUnavailableError):
                raise
            entry.failed_at = self._clock()
            raise ModelUnavailableError(f"the model `{name}` failed to load: {error}") from None
        entry.last_error = entry.failed_at = None
        entry.num_loads += 1
        logger.info("model %s loaded (%d loaded)", name, len(self.loaded()))

    async def _start_engine(self, entry: ModelEntry[P], served: ServedModel) -> ActiveModel[P]:
        engine = entry.spec.make_engine()
        try:
            await engine.start()
            served = served.served_by(engine.info)
        except BaseException:
            with contextlib.suppress(Exception):
                await engine.shutdown()
            raise
        gate = AdmissionGate(engine, self.limits.gate_capacity)
        if self.is_draining:
            gate.start_draining()
        supervisor = self.supervise(engine) if engine.can_restart else None
        if supervisor is not None:
            supervisor.start()
        return ActiveModel(served, gate, supervisor, self.prepare(entry.spec.name, served, gate))

    # -- making room --------------------------------------------------------------

    async def _make_room(self, entry: ModelEntry[P]) -> None:
        """Stop least recently used models until `entry` fits the limits."""
        while not self.fits(entry):
            victim = self._victim(entry)
            if victim is None:
                logger.warning(
                    "model %s exceeds the model limits alone; loading it", entry.spec.name
                )
                return
            victim.is_evicting = True
            logger.info(
                "unloading model %s (least recently used) for %s", victim.spec.name, entry.spec.name
            )
            await victim.until_idle()
            await self.stop(victim)

    def fits(self, entry: ModelEntry[P]) -> bool:
        """Whether `entry` would run beside the running models within the limits."""
        running = self.loaded()
        limits = self.limits
        if limits.max_loaded is not None and len(running) + 1 > limits.max_loaded:
            return False
        if limits.memory_budget_bytes is None:
            return True
        total = sum(e.spec.estimated_bytes for e in running) + entry.spec.estimated_bytes
        return total <= limits.memory_budget_bytes

    def _victim(self, entry: ModelEntry[P]) -> ModelEntry[P] | None:
        """The running model to stop: idle ones first, least recently used first."""
        running = [e for e in self.loaded() if e is not entry and not e.spec.is_pinned]
        if not running:
            return None
        return min(running, key=lambda e: (not e.is_idle, e.last_used))

    # -- stopping -------------------------------------------------------------------

    async def stop(self, entry: ModelEntry[P]) -> None:
        active, entry.active = entry.active, None
        entry.is_evicting = False
        if active is None:
            return
        if active.supervisor is not None:
            entry.num_restarts_before += active.supervisor.num_restarts
            await active.supervisor.stop()
        await active.gate.engine.shutdown()
        for reason, count in active.gate.num_refused.items():
            entry.num_refused_before[reason] = entry.num_refused_before.get(reason, 0) + count
        logger.info("model %s unloaded", entry.spec.name)

    async def stop_all(self) -> None:
        """Stop every engine, a start in progress first (the app's lifespan ends)."""
        for entry in self._entries.values():
            if entry.loading is not None:
                entry.loading.cancel()
            entry.cancel_expiry()
        async with self._swap_lock:
            for entry in self._entries.values():
                await self.stop(entry)

    def schedule_expiry(self, entry: ModelEntry[P], keep_alive_s: float | None) -> None:
        """Stop `entry` once it has been idle `keep_alive_s` (None: the default)."""
        if keep_alive_s is None:
            keep_alive_s = self.limits.default_keep_alive_s
        if keep_alive_s is None or math.isinf(keep_alive_s) or entry.spec.is_pinned:
            return
        entry.cancel_expiry()
        stamp = entry.last_used
        loop = asyncio.get_running_loop()
        keep_alive_s = max(0.0, keep_alive_s)
        entry.expiry = loop.call_later(
            keep_alive_s, lambda: loop.create_task(self._expire(entry, stamp))
        )
        entry.expires_at = loop.time() + keep_alive_s

    async def _expire(self, entry: ModelEntry[P], stamp: int) -> None:
        await entry.until_idle()
        async with self._swap_lock:
            if entry.last_used == stamp and entry.is_idle and not self.is_draining:
                logger.info("model %s: keep_alive ran out", entry.spec.name)
                entry.cancel_expiry()
                await self.stop(entry)
