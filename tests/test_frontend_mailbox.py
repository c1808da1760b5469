"""The single-slot mailbox: merges while the reader lags, never overwrites, errors last."""

from __future__ import annotations

import asyncio

import pytest

from sluice.errors import EngineDeadError
from sluice.frontend.deltas import ChoiceDelta, SampledLogprob
from sluice.frontend.mailbox import Mailbox


def step_delta(step: int, *, finish: bool = False) -> ChoiceDelta:
    """The delta one engine step would release: two tokens, text "s{step} "."""
    text = f"s{step} "
    return ChoiceDelta(
        text=text,
        token_ids=[10 * step, 10 * step + 1],
        token_texts=[text[:2], text[2:]],
        logprobs=[SampledLogprob(-step, (step,), (-step,)), SampledLogprob(-step - 0.5, (), ())],
        finish_reason="length" if finish else None,
        num_prompt_tokens=7,
    )


def test_a_reader_stalled_for_k_steps_gets_one_merged_delta_with_everything():
    async def scenario() -> dict[int, ChoiceDelta]:
        mailbox = Mailbox()
        for step in range(5):
            mailbox.put(0, step_delta(step, finish=step == 4))
        return await mailbox.get()

    taken = asyncio.run(scenario())
    assert list(taken) == [0]
    merged = taken[0]
    assert merged.text == "s0 s1 s2 s3 s4 "
    assert merged.token_ids == [0, 1, 10, 11, 20, 21, 30, 31, 40, 41]
    assert "".join(merged.token_texts) == merged.text
    assert merged.logprobs is not None
    assert [entry.logprob for entry in merged.logprobs] == [
        v for step in range(5) for v in (-step, -step - 0.5)
    ]
    assert merged.logprobs[2].top_token_ids == (1,)
    assert merged.finish_reason == "length"
    assert merged.num_prompt_tokens == 7


def test_choices_merge_separately_and_never_overwrite_each_other():
    async def scenario() -> dict[int, ChoiceDelta]:
        mailbox = Mailbox()
        for step in range(3):
            for index in range(3):
                mailbox.put(index, step_delta(10 * index + step))
        return await mailbox.get()

    taken = asyncio.run(scenario())
    assert sorted(taken) == [0, 1, 2]
    for index in range(3):
        assert taken[index].text == "".join(f"s{10 * index + step} " for step in range(3))
        assert len(taken[index].token_ids) == 6


def test_get_takes_the_whole_slot_and_empties_it():
    async def scenario() -> tuple[dict[int, ChoiceDelta], bool]:
        mailbox = Mailbox()
        mailbox.put(0, step_delta(1))
        first = await mailbox.get()
        return first, mailbox.is_empty

    first, is_empty = asyncio.run(scenario())
    assert first[0].text == "s1 "
    assert is_empty


def test_a_waiting_reader_wakes_on_put():
    async def scenario() -> dict[int, ChoiceDelta]:
        mailbox = Mailbox()
        reader = asyncio.ensure_future(mailbox.get())
        await asyncio.sleep(0)
        assert not reader.done()
        mailbox.put(1, step_delta(3))
        return await asyncio.wait_for(reader, 1.0)

    assert asyncio.run(scenario())[1].text == "s3 "


def test_an_error_is_raised_only_after_the_pending_deltas_were_delivered():
    async def scenario() -> tuple[dict[int, ChoiceDelta], BaseException]:
        mailbox = Mailbox()
        mailbox.put(0, step_delta(1))
        mailbox.put_error(EngineDeadError("gone"))
        mailbox.put_error(EngineDeadError("a second error is ignored"))
        delivered = await mailbox.get()
        with pytest.raises(EngineDeadError) as raised:
            await mailbox.get()
        return delivered, raised.value

    delivered, error = asyncio.run(scenario())
    assert delivered[0].text == "s1 "
    assert str(error) == "gone"


def test_an_error_wakes_a_waiting_reader():
    async def scenario() -> None:
        mailbox = Mailbox()
        reader = asyncio.ensure_future(mailbox.get())
        await asyncio.sleep(0)
        mailbox.put_error(EngineDeadError("gone"))
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(reader, 1.0)

    asyncio.run(scenario())


def test_merging_a_delta_into_a_finished_one_is_refused():
    finished = step_delta(1, finish=True)
    with pytest.raises(AssertionError):
        finished.merge(step_delta(2))


def test_take_returns_nothing_until_a_put_and_wait_is_done_by_then():
    async def scenario() -> None:
        mailbox = Mailbox()
        assert mailbox.take() is None
        waiter = mailbox.wait()
        assert not waiter.done()
        mailbox.put(0, step_delta(1))
        assert waiter.done()
        assert mailbox.take()[0].text == "s1 "
        assert mailbox.take() is None and mailbox.is_empty

    asyncio.run(scenario())


def test_wait_is_done_at_once_when_something_is_pending_or_failed():
    async def scenario() -> None:
        mailbox = Mailbox()
        mailbox.put(0, step_delta(1))
        assert mailbox.wait().done()
        mailbox.take()
        mailbox.put_error(EngineDeadError("gone"))
        assert mailbox.wait().done()
        with pytest.raises(EngineDeadError):
            mailbox.take()

    asyncio.run(scenario())


def test_a_cancelled_wait_does_not_break_the_next_put():
    async def scenario() -> str:
        mailbox = Mailbox()
        waiter = mailbox.wait()
        waiter.cancel()
        mailbox.put(0, step_delta(2))
        await mailbox.wait()
        return mailbox.take()[0].text

    assert asyncio.run(scenario()) == "s2 "
