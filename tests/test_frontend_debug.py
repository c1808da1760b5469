"""Debug hooks stall the loop and slow the reader only when asked."""

from __future__ import annotations

import asyncio
import time

from sluice.frontend import DebugHooks


def test_the_stall_task_blocks_the_event_loop_periodically_until_stopped():
    async def scenario() -> tuple[float, bool]:
        hooks = DebugHooks(loop_stall_every_s=0.002, loop_stall_for_s=0.02)
        hooks.ensure_running()
        hooks.ensure_running()  # idempotent: one task
        started = time.perf_counter()
        for _ in range(5):
            await asyncio.sleep(0.001)
        elapsed = time.perf_counter() - started
        await hooks.stop()
        return elapsed, hooks._stall_task is None

    elapsed, is_stopped = asyncio.run(scenario())
    assert elapsed >= 0.02, "the loop was blocked at least once"
    assert is_stopped


def test_hooks_without_settings_start_nothing_and_do_not_wait():
    async def scenario() -> float:
        hooks = DebugHooks()
        hooks.ensure_running()
        started = time.perf_counter()
        await hooks.before_read()
        assert hooks._stall_task is None
        return time.perf_counter() - started

    assert asyncio.run(scenario()) < 0.01


def test_the_reader_delay_waits_before_each_read():
    async def scenario() -> float:
        started = time.perf_counter()
        await DebugHooks(reader_delay_s=0.01).before_read()
        return time.perf_counter() - started

    assert asyncio.run(scenario()) >= 0.01
