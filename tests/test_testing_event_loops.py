"""The test loops: a bounded real one, and one whose clock moves only while it waits."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice.testing.event_loops import run, run_in_virtual_time


def test_sleeps_last_exactly_their_time_in_virtual_time():
    async def body() -> list[float]:
        loop = asyncio.get_running_loop()
        seen = [loop.time()]
        await asyncio.sleep(0.02)
        seen.append(loop.time())
        time.sleep(0.01)  # real work takes no virtual time
        seen.append(loop.time())
        await asyncio.gather(asyncio.sleep(0.05), asyncio.sleep(0.03))
        seen.append(loop.time())
        return seen

    assert run_in_virtual_time(body()) == pytest.approx([0.0, 0.02, 0.02, 0.07])


def test_timers_fire_in_order_at_their_virtual_time():
    async def body() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[str, float]] = []
        done = asyncio.Event()
        loop.call_later(0.08, lambda: fired.append(("deadline", loop.time())))
        for index in range(3):
            loop.call_later(
                0.05 * (index + 1), lambda i=index: fired.append((f"step{i}", loop.time()))
            )
        loop.call_later(0.2, done.set)
        await done.wait()
        return fired

    fired = run_in_virtual_time(body())
    assert [name for name, _ in fired] == ["step0", "deadline", "step1", "step2"]
    assert [at for _, at in fired] == pytest.approx([0.05, 0.08, 0.10, 0.15])


def test_a_timeout_in_virtual_time_is_exact():
    async def body() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 0.5)
        return loop.time()

    assert run_in_virtual_time(body()) == pytest.approx(0.5)


def test_a_thread_still_wakes_a_virtual_time_loop_with_no_timer():
    async def body() -> int:
        return await asyncio.to_thread(lambda: 7)

    assert run_in_virtual_time(body()) == 7


def test_run_bounds_a_body_that_hangs():
    with pytest.raises(TimeoutError):
        run(asyncio.Event().wait(), timeout_s=0.01)
