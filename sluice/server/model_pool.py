"""The models one server serves, by name: which run, which start, which stop.

    name ─▶ ModelEntry ── spec      how to describe and start it, its estimated bytes
                       ├── served   its ServedModel (tokenizer, context), kept once read
                       └── active   its engine behind an AdmissionGate, its supervisor
                                    and what the app built for it; None while unloaded

A request names a model; `ModelPool.use` resolves the name (an unknown one is
a 404 naming the served ones), starts the model's engine if it is not
running, and holds the model (a lease) while the route works. One server of
one model is the same pool with one entry, started at startup.

Invariants:
- A model's engine starts at most once at a time: every request waiting for
  it shares that start (it is not cancelled when they leave) and hears its
  failure as a ModelUnavailableError naming the model and the cause; the
  other models are untouched. A request waits at most its queue timeout.
- Starts and stops happen one at a time (`_swap_lock`, first come first
  served). Before a start, the least recently used models are stopped until
  the new one fits `max_loaded` and `memory_budget_bytes` (estimated bytes).
- A model with a lease or an engine request in flight is never stopped: a
  start that needs its room marks it evicting and waits for it to go idle;
  meanwhile new requests for it wait behind that start (no starvation), so
  every stream that began ends as it would have.
- keep_alive: a model idle for the keep_alive its latest request asked
  (default `default_keep_alive_s`; None: forever) is stopped; 0 stops it as
  soon as that request is done.
- Everything here runs on the event loop. Weights load in the engine process;
  the handshake is awaited, and a description (tokenizer) is read in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from sluice.engine.client_base import EngineClient
from sluice.engine.supervisor import EngineSupervisor
from sluice.errors import ModelNotFoundError, ModelUnavailableError, SluiceError
from sluice.server.admission import AdmissionGate, ServiceUnavailableError, ShuttingDownError
from sluice.server.model_entry import (
    ActiveModel,
    ModelEntry,
    ModelLease,
    ModelSpec,
    ModelStatus,
    PoolLimits,
)
from sluice.server.served_model import ServedModel

logger = logging.getLogger("sluice.server")

P = TypeVar("P")
# Names listed in a 404, at most (a models folder can hold hundreds).
MAX_NAMES_LISTED = 20


class ModelPool(Generic[P]):
    """Named models, each started on first use (or at startup) and stopped least recently used."""

    def __init__(
        self,
        specs: list[ModelSpec],
        limits: PoolLimits,
        prepare: Callable[[str, ServedModel, AdmissionGate], P],
        supervise: Callable[[EngineClient], EngineSupervisor | None] = lambda engine: None,
    ):
        assert specs, "a pool serves at least one model"
        self._entries: dict[str, ModelEntry[P]] = {}
        for spec in specs:
            assert spec.name not in self._entries, f"two models named {spec.name!r}"
            self._entries[spec.name] = ModelEntry(spec)
        self.limits = limits
        self.prepare = prepare
        self.supervise = supervise
        self.default_name = specs[0].name
        self.is_draining = False
        self._swap_lock = asyncio.Lock()
        self._num_uses = 0

    # -- names ----------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def resolve(self, name: str | None, *, is_any_name_served: bool = False) -> str:
        """The served name `name` means (None: the first model's); an unknown
        one is a 404 naming the served ones, unless `is_any_name_served` (the
        agent APIs: the first model serves any name)."""
        if name is None or name in self._entries:
            return self.default_name if name is None else name
        if is_any_name_served:
            return self.default_name
        listed = ", ".join(f"`{n}`" for n in self.names[:MAX_NAMES_LISTED])
        more = len(self._entries) - MAX_NAMES_LISTED
        raise ModelNotFoundError(
            f"The model `{name[:100]}` does not exist; this server serves {listed}"
            + (f" and {more} more (GET /v1/models)" if more > 0 else ""),
            param="model",
            code="model_not_found",
        )

    def statuses(self) -> list[ModelStatus]:
        return [entry.status() for entry in self._entries.values()]

    def loaded(self) -> list[tuple[str, ActiveModel[P]]]:
        return [(n, e.active) for n, e in self._entries.items() if e.active is not None]

    def active(self, name: str) -> ActiveModel[P] | None:
        return self._entries[name].active

    def is_running(self, name: str) -> bool:
        """Whether a request for `name` is served without waiting for a start."""
        return self._entries[name].is_running

    async def describe(self, name: str) -> ServedModel:
        """`name`'s ServedModel (read in a thread once; no engine started)."""
        try:
            return await self._describe(self._entries[name])
        except ServiceUnavailableError:
            raise
        except SluiceError as error:
            raise ModelUnavailableError(f"the model `{name}` cannot be read: {error}") from None

    async def _describe(self, entry: ModelEntry[P]) -> ServedModel:
        if entry.served is None:
            served = await asyncio.to_thread(entry.spec.describe)
            entry.served = entry.served or served
        return entry.served

    # -- leases -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def use(
        self,
        name: str,
        wait_s: float | None,
        keep_alive_s: float | None = None,
        on_wait: Callable[[float], object] | None = None,
    ) -> AsyncIterator[ModelLease[P]]:
        """Hold model `name` (a resolved name), started first if need be, waiting
        at most `wait_s` for that (None: as long as it takes). `keep_alive_s`:
        how long it stays loaded once idle (None: the pool's default; inf: ever);
        `on_wait(seconds)`: told how long the request waited for a start, if it
        did (also when the start failed)."""
        entry = self._entries[name]
        if entry.active is not None and entry.is_running:
            active, waited_s = entry.active, None
            self._lease(entry)
        else:
            started_s = asyncio.get_running_loop().time()
            try:
                active = await self._wait_for_start(entry, wait_s)
            finally:
                waited_s = asyncio.get_running_loop().time() - started_s
                if on_wait is not None:
                    on_wait(waited_s)
        try:
            yield ModelLease(active, waited_s)
        finally:
            self._release(entry, keep_alive_s)

    def _lease(self, entry: ModelEntry[P]) -> None:
        self._num_uses += 1
        entry.lease(self._num_uses)

    def _release(self, entry: ModelEntry[P], keep_alive_s: float | None) -> None:
        entry.release()
        self._schedule_expiry(entry, keep_alive_s)

    async def _wait_for_start(self, entry: ModelEntry[P], wait_s: float | None) -> ActiveModel[P]:
        """Wait for `entry`'s next start, which hands this request its lease
        (so no other start can stop the model before the request holds it)."""
        if self.is_draining:
            raise ShuttingDownError("the server is shutting down; retry on another instance")
        handed: asyncio.Future[ActiveModel[P]] = asyncio.get_running_loop().create_future()
        entry.waiters.append(handed)
        if entry.loading is None:
            entry.loading = asyncio.ensure_future(self._start(entry))
        try:
            return await asyncio.wait_for(handed, wait_s)
        except TimeoutError:
            raise ModelUnavailableError(
                f"the model `{entry.spec.name}` is still loading after {wait_s:g} s "
                "(queue timeout); retry later"
            ) from None
        except BaseException:
            if handed.done() and not handed.cancelled() and handed.exception() is None:
                self._release(entry, None)  # handed over, but its request has gone
            raise
        finally:
            if handed in entry.waiters:
                entry.waiters.remove(handed)

    # -- starting and stopping ----------------------------------------------------

    async def start(self) -> None:
        """Start the preloaded models (startup), as many as the limits hold
        (the first in order; the rest start on their first request); a
        failure is raised as is."""
        for entry in self._entries.values():
            if not (entry.spec.is_preloaded or entry.spec.is_pinned):
                continue
            if entry.spec.is_pinned or not self.loaded() or self._fits(entry):
                await self._start(entry, is_startup=True)
            else:
                logger.info("model %s not preloaded: the model limits are full", entry.spec.name)

    async def _start(self, entry: ModelEntry[P], is_startup: bool = False) -> None:
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
            served = await self._describe(entry)
            await self._make_room(entry)
            entry.active = await self._start_engine(entry, served)
        except SluiceError as error:
            entry.last_error = str(error)
            if is_startup:
                raise
            logger.error("model %s failed to load: %s", name, error)
            if isinstance(error, ServiceUnavailableError):
                raise
            raise ModelUnavailableError(f"the model `{name}` failed to load: {error}") from None
        entry.last_error = None
        logger.info("model %s loaded (%d loaded)", name, len(self.loaded()))

    async def _start_engine(self, entry: ModelEntry[P], served: ServedModel) -> ActiveModel[P]:
        engine = entry.spec.make_engine()
        try:
            await engine.start()
            served.check_served_by(engine.info)
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

    async def _make_room(self, entry: ModelEntry[P]) -> None:
        """Stop least recently used models until `entry` fits the limits."""
        while not self._fits(entry):
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
            await self._stop(victim)

    def _fits(self, entry: ModelEntry[P]) -> bool:
        running = [e for e in self._entries.values() if e.active is not None]
        limits = self.limits
        if limits.max_loaded is not None and len(running) + 1 > limits.max_loaded:
            return False
        if limits.memory_budget_bytes is None:
            return True
        total = sum(e.spec.estimated_bytes for e in running) + entry.spec.estimated_bytes
        return total <= limits.memory_budget_bytes

    def _victim(self, entry: ModelEntry[P]) -> ModelEntry[P] | None:
        """The running model to stop: idle ones first, least recently used first."""
        running = [e for e in self._entries.values()
                   if e.active is not None and e is not entry and not e.spec.is_pinned]  # fmt: skip
        if not running:
            return None
        return min(running, key=lambda e: (not e.is_idle, e.last_used))

    async def _stop(self, entry: ModelEntry[P]) -> None:
        active, entry.active = entry.active, None
        entry.is_evicting = False
        if active is None:
            return
        if active.supervisor is not None:
            entry.num_restarts_before += active.supervisor.num_restarts
            await active.supervisor.stop()
        await active.gate.shutdown()
        logger.info("model %s unloaded", entry.spec.name)

    def _schedule_expiry(self, entry: ModelEntry[P], keep_alive_s: float | None) -> None:
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
                await self._stop(entry)

    # -- the server's whole life: restarts, drain, shutdown ---------------------------

    @property
    def num_restarts(self) -> int:
        return sum(e.num_restarts_before + (e.active.supervisor.num_restarts
                   if e.active is not None and e.active.supervisor is not None else 0)
                   for e in self._entries.values())  # fmt: skip

    @property
    def num_in_flight(self) -> int:
        return sum(active.gate.num_in_flight for _, active in self.loaded())

    @property
    def num_refused(self) -> dict[str, int]:
        total = {"queue_full": 0, "queue_timeout": 0, "shutting_down": 0}
        for _, active in self.loaded():
            for reason, count in active.gate.num_refused.items():
                total[reason] = total.get(reason, 0) + count
        return total

    def start_draining(self) -> None:
        self.is_draining = True
        for entry in self._entries.values():
            entry.cancel_expiry()
            if entry.active is not None:
                entry.active.gate.start_draining()

    async def stop_supervising(self) -> None:
        for _, active in self.loaded():
            if active.supervisor is not None:
                await active.supervisor.stop()

    async def wait_idle(self, timeout_s: float) -> bool:
        async def all_idle() -> None:
            for entry in self._entries.values():
                await entry.until_idle()

        try:
            await asyncio.wait_for(all_idle(), timeout_s)
        except TimeoutError:
            return False
        return True

    def fail_all(self, error: ServiceUnavailableError) -> int:
        return sum(active.gate.fail_all(error) for _, active in self.loaded())

    def kill(self) -> None:
        for _, active in self.loaded():
            active.gate.kill()

    async def shutdown(self) -> None:
        """Stop every engine (the app's lifespan ends)."""
        for entry in self._entries.values():
            if entry.loading is not None:
                entry.loading.cancel()
            entry.cancel_expiry()
        async with self._swap_lock:
            for entry in self._entries.values():
                await self._stop(entry)
