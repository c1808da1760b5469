"""The model pool alone (sluice/server/served_models/model_pool.py), over fake engines: names,
starts shared by waiters, LRU stops under the limits, keep_alive, failures."""

from __future__ import annotations

import asyncio

import pytest

from sluice.errors import (
    ModelLoadError,
    ModelNotFoundError,
    ModelUnavailableError,
    ServiceUnavailableError,
)
from sluice.server.served_models.model_entry import ModelSpec, PoolLimits
from sluice.server.served_models.model_pool import ModelPool
from sluice.server.served_models.served_model import ServedModel
from sluice.testing.event_loops import run, run_in_virtual_time
from sluice.testing.fake_engine import FakeEngine
from sluice.testing.fake_tokenizer import FakeTokenizer


class GatedStartEngine(FakeEngine):
    """A fake engine whose start waits until the test opens `may_start`."""

    def __init__(self, may_start: asyncio.Event):
        super().__init__()
        self.may_start = may_start

    async def start(self) -> None:
        await self.may_start.wait()
        await super().start()


class BrokenEngine(FakeEngine):
    """A fake engine whose model does not load."""

    async def start(self) -> None:
        raise ModelLoadError("tensor model.layers.0.mlp.up_proj.weight is truncated")


class Models:
    """Specs of fake models, recording every engine each one started."""

    def __init__(self) -> None:
        self.engines: dict[str, list[FakeEngine]] = {}

    def spec(self, name: str, make=FakeEngine, **fields) -> ModelSpec:
        def make_engine() -> FakeEngine:
            engine = make()
            self.engines.setdefault(name, []).append(engine)
            return engine

        served = ServedModel(name, FakeTokenizer(), 64)
        return ModelSpec(name, lambda: served, make_engine, **fields)

    def num_starts(self, name: str) -> int:
        return len(self.engines.get(name, []))


class Clock:
    """Seconds the test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def pool_of(*specs: ModelSpec, clock: Clock | None = None, **limits) -> ModelPool[str]:
    limits = PoolLimits(gate_capacity=8, **limits)
    return ModelPool(list(specs), limits, lambda n, s, g: n, clock=clock)


def states(pool: ModelPool) -> dict[str, str]:
    return {status.name: status.state for status in pool.statuses()}


def test_an_unknown_model_is_a_404_naming_every_served_one():
    models = Models()
    pool = pool_of(models.spec("alpha"), models.spec("beta"))
    with pytest.raises(ModelNotFoundError) as refused:
        pool.resolve("gamma")
    assert "`gamma`" in refused.value.message
    assert "`alpha`, `beta`" in refused.value.message
    assert refused.value.param == "model"
    assert pool.resolve(None) == "alpha"  # no name: the first model
    assert pool.resolve("gamma", is_any_name_served=True) == "alpha"


def test_a_model_starts_on_its_first_request_once_for_every_request_waiting():
    models = Models()
    pool = pool_of(models.spec("alpha"), models.spec("beta"))

    async def body() -> None:
        await pool.start()  # nothing preloaded
        assert states(pool) == {"alpha": "unloaded", "beta": "unloaded"}

        async def one_request() -> float | None:
            async with pool.use("beta", None) as lease:
                assert lease.model.parts == "beta"
                return lease.waited_s

        waits = await asyncio.gather(*(one_request() for _ in range(5)))
        assert models.num_starts("beta") == 1
        assert all(wait is not None for wait in waits)
        assert states(pool) == {"alpha": "unloaded", "beta": "loaded"}
        # Running now: no wait at all.
        assert await one_request() is None

    run(body())


def test_preloaded_models_start_with_the_pool_and_their_failure_stops_the_startup():
    models = Models()
    pool = pool_of(models.spec("alpha", is_preloaded=True), models.spec("beta"))
    run(pool.start())
    assert states(pool) == {"alpha": "loaded", "beta": "unloaded"}
    broken = pool_of(models.spec("gamma", BrokenEngine, is_preloaded=True))
    with pytest.raises(ModelLoadError, match="truncated"):
        run(broken.start())


def test_preloading_starts_as_many_models_as_the_limits_hold_in_order():
    models = Models()
    specs = [models.spec(name, is_preloaded=True) for name in ("alpha", "beta", "gamma")]
    pool = pool_of(*specs, max_loaded=2)
    run(pool.start())
    assert states(pool) == {"alpha": "loaded", "beta": "loaded", "gamma": "unloaded"}
    assert models.num_starts("gamma") == 0  # not started to be stopped at once


def test_under_one_loaded_model_the_least_recently_used_is_stopped_for_the_next():
    models = Models()
    pool = pool_of(models.spec("alpha"), models.spec("beta"), models.spec("gamma"), max_loaded=2)

    async def body() -> None:
        for name in ("alpha", "beta", "alpha", "gamma"):
            async with pool.use(name, None):
                pass
        # beta was used least recently when gamma needed room.
        assert states(pool) == {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded"}
        assert not models.engines["beta"][0].is_alive  # its engine was shut down
        async with pool.use("beta", None):
            pass
        assert models.num_starts("beta") == 2
        assert states(pool)["alpha"] == "unloaded"

    run(body())


def test_the_memory_budget_bounds_the_estimated_bytes_of_the_running_models():
    models = Models()
    pool = pool_of(
        models.spec("small", estimated_bytes=300),
        models.spec("large", estimated_bytes=600),
        models.spec("tiny", estimated_bytes=100),
        memory_budget_bytes=1000,
    )

    async def body() -> None:
        for name in ("small", "large", "tiny"):  # 1000 bytes: all fit
            async with pool.use(name, None):
                pass
        assert set(states(pool).values()) == {"loaded"}
        async with pool.use("small", None):
            pass
        models_more = pool_of(
            models.spec("a", estimated_bytes=600), models.spec("b", estimated_bytes=600),
            memory_budget_bytes=1000,
        )  # fmt: skip
        async with models_more.use("a", None):
            pass
        async with models_more.use("b", None):
            pass
        assert states(models_more) == {"a": "unloaded", "b": "loaded"}

    run(body())


def test_a_model_with_a_request_in_flight_is_stopped_only_once_it_is_done():
    models = Models()
    pool = pool_of(models.spec("alpha"), models.spec("beta"), max_loaded=1)

    async def body() -> None:
        release_alpha = asyncio.Event()
        alpha_held = asyncio.Event()

        async def long_alpha_request() -> None:
            async with pool.use("alpha", None):
                alpha_held.set()
                await release_alpha.wait()

        holder = asyncio.create_task(long_alpha_request())
        await alpha_held.wait()
        beta = asyncio.create_task(_enter_and_leave(pool, "beta"))
        while states(pool)["alpha"] != "unloading":  # beta's start chose alpha to go
            await asyncio.sleep(0)
        # A later request for alpha waits behind beta's start (no starvation).
        late_alpha = asyncio.create_task(_enter_and_leave(pool, "alpha"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not beta.done() and not late_alpha.done()
        assert models.engines["alpha"][0].is_alive
        release_alpha.set()
        await holder
        await beta
        await late_alpha
        assert models.num_starts("alpha") == 2  # stopped for beta, started again
        assert states(pool) == {"alpha": "loaded", "beta": "unloaded"}

    run(body())


async def _enter_and_leave(pool: ModelPool, name: str, wait_s: float | None = None) -> None:
    async with pool.use(name, wait_s):
        pass


def test_a_failed_start_names_the_model_and_its_cause_and_the_others_keep_serving():
    models = Models()
    clock = Clock()
    pool = pool_of(models.spec("good"), models.spec("broken", BrokenEngine), clock=clock)

    async def body() -> None:
        async with pool.use("good", None):
            pass
        with pytest.raises(ModelUnavailableError) as refused:
            await _enter_and_leave(pool, "broken")
        assert "`broken` failed to load" in refused.value.message
        assert "truncated" in refused.value.message
        status = {s.name: s for s in pool.statuses()}
        assert status["broken"].state == "unloaded"
        assert "truncated" in (status["broken"].last_error or "")
        async with pool.use("good", None):
            pass
        assert states(pool)["good"] == "loaded"
        assert models.num_starts("broken") == 1

    run(body())


def test_a_failed_start_is_remembered_for_a_while_so_its_requests_do_not_retry_it():
    models = Models()
    clock = Clock()
    pool = pool_of(models.spec("broken", BrokenEngine), clock=clock, failure_memory_s=30.0)

    async def body() -> None:
        with pytest.raises(ModelUnavailableError):
            await _enter_and_leave(pool, "broken")
        clock.now_s += 10.0
        for _ in range(5):
            with pytest.raises(ModelUnavailableError) as refused:
                await _enter_and_leave(pool, "broken")
            assert "truncated" in refused.value.message
            assert "not tried again for 20 s" in refused.value.message
            assert refused.value.retry_after_s == 20
        assert models.num_starts("broken") == 1
        clock.now_s += 20.0  # forgotten: the next request tries again
        with pytest.raises(ModelUnavailableError, match="truncated"):
            await _enter_and_leave(pool, "broken")
        assert models.num_starts("broken") == 2

    run(body())


def test_a_model_whose_files_fail_their_check_never_stops_a_loaded_one():
    models = Models()

    def check() -> None:
        raise ModelLoadError("model.safetensors: incomplete metadata, file not fully covered")

    pool = pool_of(models.spec("good"), models.spec("broken", check=check), max_loaded=1)

    async def body() -> None:
        async with pool.use("good", None):
            pass
        for _ in range(3):
            with pytest.raises(ModelUnavailableError, match="not fully covered"):
                await _enter_and_leave(pool, "broken")
        assert states(pool) == {"good": "loaded", "broken": "unloaded"}
        assert models.num_starts("broken") == 0  # no engine started for it
        assert pool.num_loads("good") == 1 and models.engines["good"][0].is_alive

    run(body())


def test_a_model_whose_engine_fails_stops_a_loaded_one_at_most_once_while_remembered():
    models = Models()
    clock = Clock()
    specs = models.spec("good"), models.spec("broken", BrokenEngine)
    pool = pool_of(*specs, clock=clock, max_loaded=1)

    async def body() -> None:
        for _ in range(4):  # the requests alternate between the two
            async with pool.use("good", None):
                pass
            with pytest.raises(ModelUnavailableError, match="truncated"):
                await _enter_and_leave(pool, "broken")
        assert models.num_starts("broken") == 1
        # Stopped for the first try only (unknowable before its engine ran).
        assert pool.num_loads("good") == 2
        assert states(pool) == {"good": "loaded", "broken": "unloaded"}

    run(body())


def test_switching_between_two_loaded_models_starts_neither_again():
    models = Models()
    pool = pool_of(models.spec("alpha"), models.spec("beta"), max_loaded=2)

    async def body() -> None:
        for name in ["alpha", "beta"] * 10:
            async with pool.use(name, None) as lease:
                assert lease.model.parts == name
        assert (pool.num_loads("alpha"), pool.num_loads("beta")) == (1, 1)
        assert {s.name: s.num_loads for s in pool.statuses()} == {"alpha": 1, "beta": 1}

    run(body())


def test_the_lease_says_how_long_its_request_waited_for_the_start_on_the_pools_clock():
    clock = Clock()

    class SlowStartEngine(FakeEngine):
        async def start(self) -> None:
            clock.now_s += 3.25  # the weights took 3.25 s to load
            await super().start()

    models = Models()
    pool = pool_of(models.spec("slow", SlowStartEngine), clock=clock)

    async def body() -> None:
        async with pool.use("slow", 60.0) as lease:
            assert lease.waited_s == pytest.approx(3.25)
        async with pool.use("slow", 60.0) as lease:
            assert lease.waited_s is None  # running: no wait

    run(body())


def test_a_request_waits_for_a_loading_model_at_most_its_queue_timeout():
    may_start = asyncio.Event()
    models = Models()
    pool = pool_of(models.spec("slow", lambda: GatedStartEngine(may_start)))

    async def body() -> None:
        loop = asyncio.get_running_loop()
        await pool.describe("slow")  # in a thread: before any timer (virtual time)
        started_s = loop.time()
        with pytest.raises(ModelUnavailableError, match="still loading after 5 s"):
            await _enter_and_leave(pool, "slow", wait_s=5.0)
        assert loop.time() - started_s == pytest.approx(5.0)
        assert states(pool)["slow"] == "loading"  # the start goes on without it
        may_start.set()
        async with pool.use("slow", 5.0) as lease:
            assert lease.waited_s is not None
        assert models.num_starts("slow") == 1

    run_in_virtual_time(body())


def test_keep_alive_stops_an_idle_model_when_it_runs_out_and_zero_right_after_the_request():
    models = Models()
    pool = pool_of(models.spec("alpha"), models.spec("beta"))

    async def body() -> None:
        loop = asyncio.get_running_loop()
        for name in ("alpha", "beta"):  # in a thread: before any timer (virtual time)
            await pool.describe(name)
        async with pool.use("alpha", None, keep_alive_s=60.0):
            pass
        async with pool.use("beta", None, keep_alive_s=0.0):
            pass
        await asyncio.sleep(0.001)
        assert states(pool) == {"alpha": "loaded", "beta": "unloaded"}
        expires_at = {s.name: s.expires_at for s in pool.statuses()}["alpha"]
        assert expires_at == pytest.approx(loop.time() + 60.0, abs=0.01)
        await asyncio.sleep(30)
        async with pool.use("alpha", None, keep_alive_s=60.0):  # used again: 60 s more
            pass
        await asyncio.sleep(59)
        assert states(pool)["alpha"] == "loaded"
        await asyncio.sleep(2)
        assert states(pool)["alpha"] == "unloaded"

    run_in_virtual_time(body())


def test_draining_refuses_new_starts_and_shutdown_stops_every_engine():
    models = Models()
    pool = pool_of(models.spec("alpha", is_preloaded=True), models.spec("beta"))

    async def body() -> None:
        await pool.start()
        pool.start_draining()
        with pytest.raises(ServiceUnavailableError, match="shutting down"):
            await _enter_and_leave(pool, "beta")
        assert await pool.wait_idle(1.0)
        await pool.shutdown()
        assert not models.engines["alpha"][0].is_alive
        assert states(pool) == {"alpha": "unloaded", "beta": "unloaded"}

    run(body())


def test_refusals_stay_counted_after_their_model_is_stopped():
    models = Models()
    pool = pool_of(models.spec("alpha"), models.spec("beta"), max_loaded=1)

    async def body() -> None:
        async with pool.use("alpha", None) as lease:
            lease.model.gate.num_refused["queue_full"] += 2  # as its gate counts them
        async with pool.use("beta", None):
            pass
        assert states(pool)["alpha"] == "unloaded"
        assert pool.num_refused["queue_full"] == 2  # a counter never goes back

    run(body())
