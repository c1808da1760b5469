"""The fake engine keeps the engine contract: one callback per step, aborts, death."""

from __future__ import annotations

import asyncio

import pytest

from sluice.engine.engine_request import generation_request
from sluice.engine.outputs import RequestDelta
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import EngineDeadError
from sluice.testing import FakeEngine


class Sink:
    def __init__(self, log: list | None = None) -> None:
        self.deltas: list[RequestDelta] = []
        self.errors: list[BaseException] = []
        self._log = log

    def on_delta(self, delta: RequestDelta) -> None:
        self.deltas.append(delta)
        if self._log is not None:
            self._log.append(delta.request_id)

    def on_error(self, error: BaseException) -> None:
        self.errors.append(error)

    @property
    def token_ids(self) -> list[int]:
        return [t for d in self.deltas for t in d.new_token_ids]


def count_up(request_id, prompt, params):
    return iter(range(100, 200))


async def run_until_idle(engine: FakeEngine) -> None:
    while engine.num_running:
        await asyncio.sleep(0)


def test_requests_stop_at_max_tokens_with_length_and_the_prompt_size():
    async def scenario() -> Sink:
        engine, sink = FakeEngine(count_up, tokens_per_step=3), Sink()
        engine.add_request(
            generation_request("r", [1, 2], SamplingParams(max_tokens=7, logprobs=2)), sink
        )
        await run_until_idle(engine)
        return sink

    sink = asyncio.run(scenario())
    assert [len(d.new_token_ids) for d in sink.deltas] == [3, 3, 1]
    assert sink.token_ids == list(range(100, 107))
    assert [d.finish_reason for d in sink.deltas] == [None, None, "length"]
    assert all(d.num_prompt_tokens == 2 for d in sink.deltas)
    assert all(len(d.logprobs.top_token_ids[0]) == 2 for d in sink.deltas)


def test_one_step_delivers_every_running_requests_delta_together():
    async def scenario() -> list[str]:
        log: list[str] = []
        engine = FakeEngine(count_up)
        for name in "abc":
            engine.add_request(
                generation_request(name, [1], SamplingParams(max_tokens=2)), Sink(log)
            )
        await run_until_idle(engine)
        assert engine.num_steps == 2
        return log

    assert asyncio.run(scenario()) == ["a", "b", "c"] * 2


def test_eos_and_stop_token_ids_finish_with_stop_and_name_the_token():
    def script(request_id, prompt, params):
        return [5, 6, 0, 7] if request_id == "eos" else [5, 9, 7]

    async def scenario() -> tuple[Sink, Sink]:
        engine = FakeEngine(script, eos_token_id=0)
        eos, stop = Sink(), Sink()
        engine.add_request(generation_request("eos", [1], SamplingParams()), eos)
        engine.add_request(
            generation_request("stop", [1], SamplingParams(stop_token_ids=(9,))), stop
        )
        await run_until_idle(engine)
        return eos, stop

    eos, stop = asyncio.run(scenario())
    assert (eos.token_ids, eos.deltas[-1].stop_token_id) == ([5, 6, 0], 0)
    assert (stop.token_ids, stop.deltas[-1].finish_reason) == ([5, 9], "stop")


def test_after_abort_the_sink_hears_nothing_and_the_engine_ends_the_request_at_its_next_step():
    async def scenario() -> tuple[FakeEngine, Sink, int]:
        engine, sink = FakeEngine(count_up, step_interval_s=0.001), Sink()
        engine.add_request(generation_request("r", [1], SamplingParams(max_tokens=1000)), sink)
        await asyncio.sleep(0.01)
        num_heard = len(sink.deltas)
        engine.abort(["r", "unknown"])
        engine.abort(["r"])
        await run_until_idle(engine)
        return engine, sink, num_heard

    engine, sink, num_heard = asyncio.run(scenario())
    # As the real clients: the consumer is gone, so its sink hears nothing more,
    # not even the "abort" delta; the engine got one abort, of the open request.
    assert len(sink.deltas) == num_heard > 0 and not sink.errors
    assert engine.aborted_request_ids == ["r"]
    assert engine.num_running == 0 and len(engine.outputs["r"]) == num_heard


def test_a_request_whose_sink_raised_is_aborted_in_the_engine():
    class BrokenSink(Sink):
        def on_delta(self, delta: RequestDelta) -> None:
            raise RuntimeError("the sink broke")

    async def scenario() -> tuple[FakeEngine, BrokenSink]:
        engine, sink = FakeEngine(count_up), BrokenSink()
        engine.add_request(generation_request("r", [1], SamplingParams(max_tokens=1000)), sink)
        await run_until_idle(engine)
        return engine, sink

    engine, sink = asyncio.run(scenario())
    assert [str(e) for e in sink.errors] == ["the sink broke"]
    assert engine.aborted_request_ids == ["r"] and len(engine.outputs["r"]) == 1


def test_prefill_steps_produce_no_deltas():
    async def scenario() -> tuple[FakeEngine, Sink]:
        engine, sink = FakeEngine(count_up, prefill_steps=3), Sink()
        engine.add_request(generation_request("r", [1], SamplingParams(max_tokens=1)), sink)
        await run_until_idle(engine)
        return engine, sink

    engine, sink = asyncio.run(scenario())
    assert engine.num_steps == 4
    assert len(sink.deltas) == 1


def test_a_dead_engine_fails_every_open_sink_once_and_refuses_new_requests():
    async def scenario() -> tuple[FakeEngine, list[Sink]]:
        engine = FakeEngine(count_up, step_interval_s=0.001)
        sinks = [Sink(), Sink()]
        for number, sink in enumerate(sinks):
            engine.add_request(
                generation_request(str(number), [1], SamplingParams(max_tokens=1000)), sink
            )
        await asyncio.sleep(0.005)
        engine.die()
        await asyncio.sleep(0.005)
        with pytest.raises(EngineDeadError):
            engine.add_request(generation_request("late", [1], SamplingParams()), Sink())
        return engine, sinks

    engine, sinks = asyncio.run(scenario())
    assert not engine.is_alive
    for sink in sinks:
        assert len(sink.errors) == 1 and isinstance(sink.errors[0], EngineDeadError)
        assert all(d.finish_reason is None for d in sink.deltas)


def test_the_same_seed_and_request_id_give_the_same_tokens_whatever_the_step_size():
    async def generate(tokens_per_step) -> list[int]:
        engine = FakeEngine(
            count_up,
            tokens_per_step=tokens_per_step,
            finish_probability=0.1,
            eos_token_id=0,
            seed=7,
        )
        sink = Sink()
        engine.add_request(generation_request("same", [1], SamplingParams(max_tokens=60)), sink)
        await run_until_idle(engine)
        return sink.token_ids

    one = asyncio.run(generate(1))
    assert one == asyncio.run(generate((1, 5)))
    assert one[-1] == 0 and len(one) < 60


def test_the_default_script_repeats_the_prompt():
    async def scenario() -> Sink:
        engine, sink = FakeEngine(), Sink()
        engine.add_request(generation_request("r", [4, 5], SamplingParams(max_tokens=5)), sink)
        await run_until_idle(engine)
        return sink

    assert asyncio.run(scenario()).token_ids == [4, 5, 4, 5, 4]
