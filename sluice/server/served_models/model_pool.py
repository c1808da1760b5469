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
  other models are untouched (model_starts.py: how starts and stops go).
- A request waits at most its queue timeout for a start; the lease says how
  long it waited, on the pool's clock, so that its wait for the first token
  gets only what is left of that one deadline (`Routes.admit`).
- A model with a lease or an engine request in flight is never stopped: a
  start that needs its room marks it evicting and waits for it to go idle;
  meanwhile new requests for it wait behind that start (no starvation), so
  every stream that began ends as it would have.
- Everything here runs on the event loop. Weights load in the engine process;
  the handshake is awaited, and a description (tokenizer) is read in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from sluice.engine.client_base import EngineClient
from sluice.engine.supervisor import EngineSupervisor
from sluice.errors import ModelNotFoundError, ModelUnavailableError, SluiceError
from sluice.server.in_flight.admission import (
    AdmissionGate,
    ServiceUnavailableError,
    ShuttingDownError,
)
from sluice.server.served_models.model_entry import (
    ActiveModel,
    ModelEntry,
    ModelLease,
    ModelSpec,
    ModelStatus,
    PoolLimits,
)
from sluice.server.served_models.model_starts import ModelStarts
from sluice.server.served_models.served_model import ServedModel

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
        clock: Callable[[], float] | None = None,
    ):
        """`prepare(name, served, gate)`: what the app builds for a model whose
        engine started; `supervise(engine)`: its supervisor; `clock`: seconds,
        for the waits and the failure memory (default: the loop's time)."""
        assert specs, "a pool serves at least one model"
        self._entries: dict[str, ModelEntry[P]] = {}
        for spec in specs:
            assert spec.name not in self._entries, f"two models named {spec.name!r}"
            self._entries[spec.name] = ModelEntry(spec)
        self.limits = limits
        self.default_name = specs[0].name
        self._num_uses = 0
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self._starts = ModelStarts(
            self._entries, limits, prepare, supervise, self._lease, self._clock
        )

    @property
    def is_draining(self) -> bool:
        return self._starts.is_draining

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
            return await self._starts.describe(self._entries[name])
        except ServiceUnavailableError:
            raise
        except SluiceError as error:
            raise ModelUnavailableError(f"the model `{name}` cannot be read: {error}") from None

    def num_loads(self, name: str) -> int:
        """How many times model `name`'s engine has started (a switch to a
        running model adds none)."""
        return self._entries[name].num_loads

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
            started_s = self._clock()
            try:
                active = await self._wait_for_start(entry, wait_s)
            finally:
                waited_s = self._clock() - started_s
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
        self._starts.schedule_expiry(entry, keep_alive_s)

    async def _wait_for_start(self, entry: ModelEntry[P], wait_s: float | None) -> ActiveModel[P]:
        """Wait for `entry`'s next start, which hands this request its lease
        (so no other start can stop the model before the request holds it)."""
        if self.is_draining:
            raise ShuttingDownError("the server is shutting down; retry on another instance")
        if entry.loading is None:
            self._starts.check_not_failed(entry)
        handed: asyncio.Future[ActiveModel[P]] = asyncio.get_running_loop().create_future()
        entry.waiters.append(handed)
        if entry.loading is None:
            entry.loading = asyncio.ensure_future(self._starts.start(entry))
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
            if entry.spec.is_pinned or not self.loaded() or self._starts.fits(entry):
                await self._starts.start(entry, is_startup=True)
            else:
                logger.info("model %s not preloaded: the model limits are full", entry.spec.name)

    # -- the server's whole life: restarts, drain, shutdown ---------------------------

    @property
    def num_in_flight(self) -> int:
        return sum(active.gate.num_in_flight for _, active in self.loaded())

    @property
    def num_refused(self) -> dict[str, int]:
        """Requests the models' gates refused, by reason, stopped gates' too."""
        total: dict[str, int] = {}
        for entry in self._entries.values():
            for reason, count in entry.num_refused.items():
                total[reason] = total.get(reason, 0) + count
        return total

    def counts_by_model(self) -> dict[str, ModelEntry[P]]:
        """Each model's counts (in flight, refused, restarts: /metrics), by name."""
        return dict(self._entries)

    def start_draining(self) -> None:
        self._starts.is_draining = True
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
        await self._starts.stop_all()
