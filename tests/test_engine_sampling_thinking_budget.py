"""The thinking budget: the forced end of reasoning from a row's own tokens
(unit), through the sampler (greedy fast path, sampled rows, logprobs), and
through the engine core on the tiny model: the reasoning holds exactly
`max_tokens` tokens, then the end marker, then the answer, with and without
speculation, preemption and a prefix hit giving the same tokens."""

from __future__ import annotations

import random
from dataclasses import replace

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.engine.sampler import Sampler, SamplingRow
from sluice.engine.sampling.thinking_budget import forced_token, forced_tokens
from sluice.engine.sampling_params import SamplingParams, ThinkingBudget
from tests.speculation_runs import GREEDY, make_core, ngram, repeating_prompt, run

THINK, END = 7, 9


def budget(max_tokens: int, start=(), end=(END,)) -> ThinkingBudget:
    return ThinkingBudget(max_tokens, tuple(start), tuple(end))


# --- which token is forced ----------------------------------------------------


def test_the_end_marker_is_forced_once_the_budget_is_spent():
    assert forced_token(budget(3), [1, 2]) is None
    assert forced_token(budget(3), [1, 2, 3]) == END
    assert forced_token(budget(3), [1, 2, 3, END]) is None


def test_a_reasoning_that_ended_by_itself_is_not_cut():
    assert forced_token(budget(3), [1, END, 3]) is None
    assert forced_token(budget(3), [END, 2, 3, 4, 5]) is None


def test_a_budget_of_zero_forces_the_end_at_once():
    assert forced_token(budget(0), []) == END
    assert forced_token(budget(0, start=[THINK]), [THINK]) == END


def test_the_budget_counts_after_the_opening_marker():
    assert forced_token(budget(2, start=[THINK]), [THINK, 1]) is None
    assert forced_token(budget(2, start=[THINK]), [THINK, 1, 2]) == END


def test_an_output_that_does_not_open_the_reasoning_is_never_cut():
    assert forced_token(budget(2, start=[THINK]), []) is None
    assert forced_token(budget(2, start=[THINK]), [1, 2]) is None
    assert forced_token(budget(2, start=[THINK]), [1, 2, 3, 4]) is None


def test_a_marker_of_several_tokens_is_forced_token_by_token():
    two = budget(2, end=[8, END])
    assert [forced_token(two, [1, 2, *forced]) for forced in ([], [8], [8, END])] == [
        8, END, None,
    ]  # fmt: skip
    # Its first token ends the reasoning (harmony's `<|end|>`); its others alone do not.
    assert forced_token(two, [8, 2]) is None
    assert forced_token(two, [END, 2]) == 8


@settings(max_examples=300, deadline=None)
@given(
    max_tokens=st.integers(0, 6),
    opens=st.booleans(),
    end=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    drawn=st.lists(st.integers(1, 4), max_size=14),
)
def test_a_budgeted_run_is_the_free_one_cut_at_the_budget(max_tokens, opens, end, drawn):
    """A request that would sample `drawn` (when free): its reasoning ends by
    itself within the budget (the marker's first token), or holds exactly
    `max_tokens` tokens, then the marker, then what it samples freely again."""
    start = [THINK] if opens else []
    rule = budget(max_tokens, start, end)
    output = list(start)
    for token in drawn:
        forced = forced_token(rule, output)
        output.append(token if forced is None else forced)
    ends_by_itself = end[0] in drawn[:max_tokens]
    cut = drawn[:max_tokens] + end + drawn[max_tokens + len(end) :]
    expected = drawn if ends_by_itself else cut[: len(drawn)]
    assert output == start + expected


def test_rows_without_a_budget_cost_one_check():
    assert forced_tokens([None, None], [[1], [2]]) is None
    assert forced_tokens([None, budget(1)], [[1], [2]]) == [None, END]


# --- the sampler ----------------------------------------------------------------


def row(output, **params) -> SamplingRow:
    return SamplingRow("r", SamplingParams(**params), [1], list(output))


@pytest.mark.parametrize(
    "params",
    [{"temperature": 0.0}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.0, "logprobs": 2}],
    ids=["greedy fast path", "sampled", "logprobs"],
)
def test_the_sampler_puts_the_forced_token_in_its_row(params):
    logits = torch.zeros(3, 16)
    logits[:, 3] = 50.0  # every row's own choice: token 3
    rows = [
        row([1, 2], thinking_budget=budget(2), **params),
        row([1], thinking_budget=budget(2), **params),
        row([1, 2], **params),
    ]
    sampled = Sampler(16, frozenset(), "cpu")(logits, rows)
    assert [token.token_id for token in sampled] == [END, 3, 3]
    if "logprobs" in params:
        assert sampled[0].logprob == pytest.approx(-50.0, abs=1e-3)  # the forced token's own


# --- the engine -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_loaded(tiny_loaded, tiny_llama):
    """Batch-invariant, so the engine may speculate (as test_engine_speculation)."""
    from sluice.models.llama import LlamaForCausalLM

    config = tiny_loaded.model_config
    model = LlamaForCausalLM(config, torch.float32, torch.device("cpu"), True)
    model.load_weights(tiny_llama.weights())
    return replace(tiny_loaded, model=model)


def budgeted(rule: ThinkingBudget) -> SamplingParams:
    return msgspec.structs.replace(GREEDY, max_tokens=24, thinking_budget=rule)


def unused_tokens(outputs: list[list[int]], count: int) -> list[int]:
    seen = {token for output in outputs for token in output}
    return [token for token in range(3, 512) if token not in seen][:count]


@pytest.mark.parametrize("speculative", [None, ngram(k=6)], ids=["plain", "speculated"])
def test_the_engine_cuts_reasoning_at_the_budget_then_answers(tiny_loaded, speculative):
    rng = random.Random(2)
    prompts = [repeating_prompt(rng, 40) for _ in range(3)]
    free = run(
        make_core(tiny_loaded, None), prompts, msgspec.structs.replace(GREEDY, max_tokens=24)
    )
    end = tuple(unused_tokens([tokens for tokens, *_ in free.values()], 2))
    rules = [budget(5, end=end[:1]), budget(0, end=end), budget(11, end=end)]
    core = make_core(tiny_loaded, speculative)
    cut = run(core, prompts, [budgeted(rule) for rule in rules])
    for i, rule in enumerate(rules):
        tokens, free_tokens = cut[i][0], free[i][0]
        n = rule.max_tokens
        assert tokens[:n] == free_tokens[:n]  # the reasoning as the model wrote it
        assert tuple(tokens[n : n + len(rule.end_token_ids)]) == rule.end_token_ids
        assert len(tokens) == 24
    if speculative is not None:
        assert core.speculator.counters.num_accepted_tokens > 0
        plain = run(make_core(tiny_loaded, None), prompts, [budgeted(rule) for rule in rules])
        assert {i: r[0] for i, r in cut.items()} == {i: r[0] for i, r in plain.items()}


def test_a_budget_with_preemption_and_speculation_gives_the_unpreempted_tokens(tiny_loaded):
    rng = random.Random(11)
    prompts = [repeating_prompt(rng, rng.randrange(10, 40)) for _ in range(8)]
    params = [budgeted(budget(3 + i, end=(500 + i,))) for i in range(len(prompts))]
    roomy = run(make_core(tiny_loaded, None), prompts, params)
    short = replace(tiny_loaded, max_model_len=128)
    core = make_core(short, ngram(k=6), num_blocks=36)
    tight = run(core, prompts, params)
    assert core.scheduler.num_preemptions > 0
    assert {i: r[0] for i, r in tight.items()} == {i: r[0] for i, r in roomy.items()}
    assert all(roomy[i][0][3 + i] == 500 + i for i in range(len(prompts)))
