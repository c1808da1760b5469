"""Speculative decoding through the engine core on the tiny random model
(float32): greedy tokens and logprobs equal those without speculation for
random self-repeating prompts, proposal lengths and batches, through
preemption and a prefix-cache hit; seeded sampling draws the same tokens;
stop tokens, EOS, max_tokens, min_tokens and grammars hold; the counters
count what was drafted and accepted."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import msgspec
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.config import SchedulerConfig
from sluice.engine.kv_cache import KVCacheManager
from sluice.engine.request import Request
from sluice.engine.sampled import SampledToken
from sluice.engine.sampling_params import SamplingParams
from sluice.engine.scheduler import Scheduler, SchedulerPlan
from sluice.engine.speculation import Speculator, accepted_tokens
from sluice.structured import StructuredOutputSpec
from sluice.testing.byte_tokenizer import byte_level_tokenizer
from sluice.tokenizer import Tokenizer
from tests.speculation_runs import GREEDY, make_core, ngram, repeating_prompt, run


@pytest.fixture(scope="module")
def tiny_loaded(tiny_loaded, tiny_llama):
    """The engine's tiny model in batch-invariant mode: the engine speculates
    only where a row's bits ignore its step's row count (engine/startup.py
    `speculation_blocker`), which float32's dense kernels do not."""
    from sluice.models.llama import LlamaForCausalLM

    config = tiny_loaded.model_config
    model = LlamaForCausalLM(config, torch.float32, torch.device("cpu"), True)
    model.load_weights(tiny_llama.weights())
    return replace(tiny_loaded, model=model)


def greedy(**fields) -> SamplingParams:
    return msgspec.structs.replace(GREEDY, **fields)


def tokens_of(results) -> dict[int, tuple[list[int], str | None]]:
    return {i: (tokens, finish) for i, (tokens, finish, _, _) in results.items()}


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32),
    num_prompts=st.integers(1, 5),
    k=st.integers(1, 8),
    min_n=st.integers(1, 3),
    extra_n=st.integers(0, 2),
    budget=st.sampled_from([8, 16, 64]),
    block_size=st.sampled_from([2, 4, 16]),
)
def test_greedy_output_with_speculation_equals_output_without(
    tiny_loaded, seed, num_prompts, k, min_n, extra_n, budget, block_size
):
    rng = random.Random(seed)
    prompts = [repeating_prompt(rng, rng.randrange(6, 80)) for _ in range(num_prompts)]
    sizes = {"budget": budget, "block_size": block_size}
    plain = run(make_core(tiny_loaded, None, **sizes), prompts)
    core = make_core(tiny_loaded, ngram(k, min_n, min_n + extra_n), **sizes)
    speculated = run(core, prompts)
    assert tokens_of(speculated) == tokens_of(plain)
    counters = core.speculator.counters
    assert counters.num_accepted_tokens <= counters.num_draft_tokens <= k * counters.num_drafts


def test_the_tiny_model_accepts_drafts_and_steps_carry_several_tokens(tiny_loaded):
    rng = random.Random(7)
    prompts = [repeating_prompt(rng, 60) for _ in range(4)]
    params = greedy(max_tokens=64)
    plain = run(make_core(tiny_loaded, None), prompts, params)
    core = make_core(tiny_loaded, ngram(k=6))
    speculated = run(core, prompts, params)
    assert tokens_of(speculated) == tokens_of(plain)
    counters = core.speculator.counters
    assert 0 < counters.num_accepted_tokens < counters.num_draft_tokens
    # Several tokens per delta: fewer deltas than tokens.
    assert sum(r[3] for r in speculated.values()) < sum(len(r[0]) for r in speculated.values())
    per_position = counters.num_accepted_per_position
    assert sum(per_position) == counters.num_accepted_tokens
    assert per_position == sorted(per_position, reverse=True)  # j accepted needs j - 1 first
    print(
        f"acceptance {counters.num_accepted_tokens}/{counters.num_draft_tokens} "
        f"in {counters.num_drafts} drafts, per position {per_position}"
    )


def test_logprobs_of_accepted_tokens_equal_those_without_speculation(tiny_loaded):
    rng = random.Random(3)
    prompts = [repeating_prompt(rng, 50) for _ in range(3)]
    params = greedy(logprobs=3)
    plain = run(make_core(tiny_loaded, None), prompts, params)
    speculated = run(make_core(tiny_loaded, ngram(k=5)), prompts, params)
    for i in plain:
        assert speculated[i][0] == plain[i][0]
        assert len(speculated[i][2]) == len(speculated[i][0])
        assert speculated[i][2] == pytest.approx(plain[i][2], abs=1e-4)


def test_preempted_requests_with_speculation_give_the_unpreempted_tokens(tiny_loaded):
    rng = random.Random(11)
    prompts = [repeating_prompt(rng, rng.randrange(10, 40)) for _ in range(10)]
    roomy = run(make_core(tiny_loaded, None), prompts)
    short = replace(tiny_loaded, max_model_len=128)
    core = make_core(short, ngram(k=6), num_blocks=36)  # 144 slots for 10 requests
    tight = run(core, prompts)
    assert core.scheduler.num_preemptions > 0
    assert tokens_of(tight) == tokens_of(roomy)
    assert core.speculator.counters.num_accepted_tokens > 0
    assert core.kv.num_free_blocks == 36


def test_a_prefix_cache_hit_with_speculation_gives_the_same_tokens(tiny_loaded):
    rng = random.Random(5)
    prompt = repeating_prompt(rng, 45)
    core = make_core(tiny_loaded, ngram(k=5), block_size=4)
    first = run(core, [prompt])
    # The second request reads back blocks the first named, its output's too.
    second_prompt = prompt + first[0][0][:20]
    hit = run(core, [second_prompt])
    assert core.kv.num_hit_tokens >= 60
    plain = run(make_core(tiny_loaded, None, prefix_caching=False), [second_prompt])
    assert tokens_of(hit) == tokens_of(plain)
    assert core.speculator.counters.num_accepted_tokens > 0


def test_named_blocks_hold_only_accepted_tokens(tiny_loaded):
    """Every named block's name is the hash of the request's real tokens:
    a request started from the cache sees the text it would compute."""
    rng = random.Random(9)
    prompts = [repeating_prompt(rng, 40) for _ in range(3)]
    core = make_core(tiny_loaded, ngram(k=8), block_size=2)
    results = run(core, prompts)
    for i, prompt in enumerate(prompts):
        full = prompt + results[i][0]
        # All but the last token again: every full block it covers is a hit.
        again = run(core, [full[:-1]], greedy(max_tokens=1))
        assert again[0][0] == [full[-1]]
    assert core.kv.num_hit_tokens > 0
    core.kv.check_consistency()


def test_seeded_sampling_with_speculation_draws_the_tokens_it_draws_without(tiny_loaded):
    rng = random.Random(2)
    prompts = [repeating_prompt(rng, 40) for _ in range(4)]
    seeded = [
        SamplingParams(temperature=0.7, top_k=20, seed=100 + i, max_tokens=40, ignore_eos=True)
        for i in range(4)
    ]
    plain = run(make_core(tiny_loaded, None), prompts, seeded)
    core = make_core(tiny_loaded, ngram(k=5))
    first = run(core, prompts, seeded)
    again = run(make_core(tiny_loaded, ngram(k=3)), prompts, seeded)
    assert tokens_of(first) == tokens_of(plain) == tokens_of(again)
    assert core.speculator.counters.num_drafts > 0


def test_max_tokens_is_never_overshot_and_drafts_fit_what_is_left(tiny_loaded):
    rng = random.Random(4)
    prompts = [repeating_prompt(rng, 30) for _ in range(4)]
    for max_tokens in (1, 2, 3, 7):
        params = greedy(max_tokens=max_tokens)
        plain = run(make_core(tiny_loaded, None), prompts, params)
        speculated = run(make_core(tiny_loaded, ngram(k=8)), prompts, params)
        assert tokens_of(speculated) == tokens_of(plain)
        assert all(len(r[0]) == max_tokens and r[1] == "length" for r in speculated.values())


def test_stop_tokens_eos_and_min_tokens_end_the_output_where_they_do_without(tiny_loaded):
    rng = random.Random(6)
    prompts = [repeating_prompt(rng, 40) for _ in range(3)]
    free = run(make_core(tiny_loaded, None), prompts, greedy(max_tokens=48))
    # Stop on a token each output repeats, with and without min_tokens past it.
    params = []
    for i in range(3):
        tokens = free[i][0]
        stop = next(t for t in tokens[8:] if tokens.count(t) > 1)
        params.append(greedy(max_tokens=48, stop_token_ids=(stop,), min_tokens=4 * i))
    plain = run(make_core(tiny_loaded, None), prompts, params)
    speculated = run(make_core(tiny_loaded, ngram(k=6)), prompts, params)
    assert tokens_of(speculated) == tokens_of(plain)
    assert [r[1] for r in speculated.values()].count("stop") >= 2
    # EOS (2 is the tiny model's) when it is not ignored, with a bias towards it.
    eos = [greedy(ignore_eos=False, logit_bias={2: 4.0}, max_tokens=48)] * 3
    assert tokens_of(run(make_core(tiny_loaded, ngram(k=6)), prompts, eos)) == tokens_of(
        run(make_core(tiny_loaded, None), prompts, eos)
    )


def test_penalties_and_logit_bias_give_the_same_tokens(tiny_loaded):
    rng = random.Random(8)
    prompts = [repeating_prompt(rng, 40) for _ in range(3)]
    params = [
        greedy(repetition_penalty=1.3),
        greedy(presence_penalty=0.5, frequency_penalty=0.3),
        greedy(logit_bias={prompts[2][5]: 3.0, prompts[2][6]: 3.0}),
    ]
    plain = run(make_core(tiny_loaded, None), prompts, params)
    speculated = run(make_core(tiny_loaded, ngram(k=6)), prompts, params)
    assert tokens_of(speculated) == tokens_of(plain)


@pytest.fixture(scope="module")
def with_tokenizer(tiny_loaded):
    tokenizer = Tokenizer(
        byte_level_tokenizer(),
        special_tokens={"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
        chat_template=None,
    )
    return replace(tiny_loaded, tokenizer=tokenizer)


def test_a_grammar_holds_and_drafts_only_carry_tokens_it_allows(with_tokenizer):
    loaded = with_tokenizer
    schema = {
        "x-guidance": {"whitespace_flexible": False},
        "type": "array",
        "items": {"enum": ["red", "green", "blue"]},
        "minItems": 6,
        "maxItems": 6,
    }
    prompt = loaded.tokenizer.encode('["red","green","red","green","blue","red"] again: ["')
    params = SamplingParams(
        temperature=0.0, max_tokens=80, structured_output=StructuredOutputSpec.json_schema(schema)
    )
    plain = run(make_core(loaded, None), [prompt], params)
    core = make_core(loaded, ngram(k=6))
    speculated = run(core, [prompt], params)
    assert tokens_of(speculated) == tokens_of(plain)
    value = json.loads(loaded.tokenizer.decode(speculated[0][0]))
    assert len(value) == 6 and set(value) <= {"red", "green", "blue"}
    assert speculated[0][1] == "stop"
    assert core.speculator.counters.num_drafts > 0


def test_stats_carry_the_counters_only_with_speculation_on(tiny_loaded):
    rng = random.Random(1)
    core = make_core(tiny_loaded, ngram(k=4))
    run(core, [repeating_prompt(rng, 40)])
    stats, counters = core.stats(), core.speculator.counters
    assert stats.spec_decode_num_drafts == counters.num_drafts > 0
    assert stats.spec_decode_num_draft_tokens == counters.num_draft_tokens
    assert stats.spec_decode_num_accepted_tokens == counters.num_accepted_tokens
    assert stats.spec_decode_num_accepted_tokens_per_pos == tuple(
        counters.num_accepted_per_position
    )
    off = make_core(tiny_loaded, None)
    assert off.speculator is None and off.stats().spec_decode_num_drafts == 0


# -- the scheduler alone, over a simulated paged KV cache (no model) ----------


class SlotModel:
    """A fake model over simulated KV slots: it writes each computed token into
    the slot its block table names and reads the sequence back before each
    sample, so a position kept from a rejected draft, a lost block or a named
    block written again shows as a wrong read-back. Its next token mostly
    repeats the text's period, so n-gram drafts are partly accepted."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.slots = [[None] * kv.block_size_tokens for _ in range(kv.num_blocks)]

    def execute(self, plan: SchedulerPlan) -> tuple[list[SampledToken], dict]:
        sampled, draft_samples = [], {}
        for scheduled in plan.scheduled:
            for offset, token_id in enumerate(scheduled.token_ids):
                self._write(scheduled.block_table, scheduled.context_len + offset, token_id)
            if not scheduled.samples:
                continue
            draft = scheduled.draft_token_ids
            known = scheduled.context_len + scheduled.num_new_tokens - len(draft)
            tokens = [self._sample(scheduled, known + j, draft[:j]) for j in range(len(draft) + 1)]
            sampled.append(tokens[0])
            if draft:
                draft_samples[scheduled.request_id] = tokens[1:]
        return sampled, draft_samples

    def _write(self, table: list[int], position: int, token_id: int) -> None:
        size = self.kv.block_size_tokens
        block_id = table[position // size]
        assert self.kv.num_holders(block_id) <= 1, f"block {block_id} written while shared"
        assert not self.kv.is_named(block_id), f"named block {block_id} written"
        self.slots[block_id][position % size] = token_id

    def _sample(self, scheduled, length: int, draft_prefix: list[int]) -> SampledToken:
        size, table = self.kv.block_size_tokens, scheduled.block_table
        sequence = [self.slots[table[p // size]][p % size] for p in range(length)]
        expected = [*scheduled.prompt_token_ids, *scheduled.output_token_ids, *draft_prefix]
        assert sequence == expected, f"{scheduled.request_id} reads back other tokens"
        mixed = hash(tuple(sequence)) % 97
        return SampledToken(sequence[-5] if mixed > 15 else 10 + mixed)


def run_scheduler(prompts, speculative, *, num_blocks, block_size, budget, max_tokens):
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=True)
    speculator = None if speculative is None else Speculator(speculative)
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8),
        kv, frozenset({2}), max_model_len=1024, speculator=speculator,
    )  # fmt: skip
    model = SlotModel(kv)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        scheduler.add_request(Request(f"r{i}", prompt, params))
    outputs = {f"r{i}": [] for i in range(len(prompts))}
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        sampled, draft_samples = model.execute(plan)
        for delta in scheduler.update(plan, sampled, None, draft_samples):
            outputs[delta.request_id].extend(delta.new_token_ids)
        scheduler.check_consistency()
        for request_id in outputs:  # no block holds only rejected positions
            request = scheduler.get_request(request_id)
            if request is not None:
                assert len(request.block_ids) <= kv.num_blocks_for(request.num_tokens)
    assert kv.num_free_blocks == num_blocks
    return outputs, scheduler


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    num_prompts=st.integers(1, 6),
    k=st.integers(1, 8),
    num_blocks=st.integers(24, 80),
    block_size=st.sampled_from([1, 2, 4, 8]),
    budget=st.sampled_from([4, 9, 32]),
)
def test_the_scheduler_keeps_only_accepted_positions_through_preemption_and_the_cache(
    seed, num_prompts, k, num_blocks, block_size, budget
):
    rng = random.Random(seed)
    shared = repeating_prompt(rng, 12)  # a common head: prefix-cache hits
    prompts = [shared + repeating_prompt(rng, rng.randrange(2, 20)) for _ in range(num_prompts)]
    sizes = {"num_blocks": num_blocks, "block_size": block_size, "budget": budget}
    max_tokens = min(30, num_blocks * block_size // 2 - 40)
    if max_tokens < 1:
        return
    plain, _ = run_scheduler(prompts, None, max_tokens=max_tokens, **sizes)
    speculated, scheduler = run_scheduler(prompts, ngram(k), max_tokens=max_tokens, **sizes)
    assert speculated == plain
    assert all(len(tokens) == max_tokens for tokens in speculated.values())


def test_drafts_fit_the_budget_and_what_max_tokens_leaves():
    prompt = [5, 6, 7, 8] * 6
    kv = KVCacheManager(64, 4)
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=8), kv, frozenset({2}),
        max_model_len=1024, speculator=Speculator(ngram(k=8)),
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    scheduler.add_request(Request("r", prompt, params))
    model = SlotModel(kv)
    drafts = []
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        assert plan.num_batched_tokens <= 4
        drafts += [len(s.draft_token_ids) for s in plan.scheduled if s.draft_token_ids]
        sampled, draft_samples = model.execute(plan)
        scheduler.update(plan, sampled, None, draft_samples)
    # The budget leaves 3 beside the decoded token; max_tokens 6 leaves 5, 4, ...
    assert drafts and max(drafts) <= 3
    assert sum(drafts) <= 6


def test_the_kept_tokens_are_the_matching_draft_and_one_more():
    sampled = [SampledToken(t) for t in (7, 8, 9, 4)]
    assert [t.token_id for t in accepted_tokens([7, 8, 5], sampled)] == [7, 8, 9]
    assert [t.token_id for t in accepted_tokens([1, 8, 9], sampled)] == [7]
    assert [t.token_id for t in accepted_tokens([7, 8, 9], sampled)] == [7, 8, 9, 4]


def test_a_tight_pool_preempts_hits_the_cache_and_accepts_drafts_with_plain_outputs():
    """The property above, on sizes where all three surely happen."""
    num_preemptions = num_accepted = num_hit_tokens = 0
    for seed in range(4):
        rng = random.Random(seed)
        shared = repeating_prompt(rng, 12)
        prompts = [shared + repeating_prompt(rng, rng.randrange(2, 20)) for _ in range(5)]
        sizes = {"num_blocks": 30, "block_size": 2, "budget": 9, "max_tokens": 10}
        plain, _ = run_scheduler(prompts, None, **sizes)
        speculated, scheduler = run_scheduler(prompts, ngram(6), **sizes)
        assert speculated == plain
        num_preemptions += scheduler.num_preemptions
        num_accepted += scheduler.speculator.counters.num_accepted_tokens
        num_hit_tokens += scheduler.kv.num_hit_tokens
    assert num_preemptions > 0 and num_accepted > 0 and num_hit_tokens > 0


def test_no_request_drafts_while_more_run_than_disable_by_batch_size():
    kv = KVCacheManager(64, 4)
    config = replace(ngram(k=4), disable_by_batch_size=1)
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8), kv, frozenset({2}),
        max_model_len=1024, speculator=Speculator(config),
    )  # fmt: skip
    for i, max_tokens in enumerate((6, 30)):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        scheduler.add_request(Request(f"r{i}", [5, 6, 7, 8] * 4, params))
    model, drafts_by_batch = SlotModel(kv), {1: 0, 2: 0}
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        drafts_by_batch[len(plan.scheduled)] += sum(bool(s.draft_token_ids) for s in plan.scheduled)
        sampled, draft_samples = model.execute(plan)
        scheduler.update(plan, sampled, None, draft_samples)
    assert drafts_by_batch[2] == 0 and drafts_by_batch[1] > 0


def test_in_batch_invariant_bfloat16_speculation_changes_no_bit(tiny_loaded, tiny_llama):
    """Where rounding depends on the step's shape (bfloat16), --batch-invariant
    keeps tokens and logprobs bitwise those without speculation."""
    from sluice.loader.choices import ModelChoices
    from sluice.models.llama import LlamaForCausalLM

    model = LlamaForCausalLM(tiny_loaded.model_config, torch.bfloat16, torch.device("cpu"), True)
    model.load_weights(tiny_llama.weights())
    loaded = replace(tiny_loaded, model=model, choices=ModelChoices("bfloat16", None, "as asked"))
    rng = random.Random(12)
    prompts = [repeating_prompt(rng, 40) for _ in range(3)]
    params = greedy(max_tokens=40, logprobs=2)
    plain = run(make_core(loaded, None, num_blocks=1024), prompts, params)
    core = make_core(loaded, ngram(k=5), num_blocks=1024)
    speculated = run(core, prompts, params)
    assert {i: r[:3] for i, r in speculated.items()} == {i: r[:3] for i, r in plain.items()}
    assert core.speculator.counters.num_accepted_tokens > 0


class IndentedVocabulary:
    """The tiny model's 512 ids as a tokenizer's bytes: 400 + w is a line
    break and w spaces (w < 13), the rest plain text."""

    vocab_size = 512

    @staticmethod
    def token_bytes(token_id: int) -> bytes:
        if 400 <= token_id < 413:
            return b"\n" + b" " * (token_id - 400)
        return b"t%d" % token_id


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32), k=st.integers(1, 8))
def test_reindented_drafts_keep_greedy_output_exact(tiny_loaded, seed, k):
    rng = random.Random(seed)
    loaded = replace(tiny_loaded, tokenizer=IndentedVocabulary())
    prompts = []
    for _ in range(3):
        rows = [[rng.randrange(3, 400) for _ in range(rng.randrange(1, 5))] for _ in range(8)]
        depth, copy_depth = rng.randrange(0, 13), rng.randrange(0, 13)
        document = [t for row in rows for t in [400 + depth, *row]]
        copy = [t for row in rows[: rng.randrange(1, 8)] for t in [400 + copy_depth, *row]]
        prompts.append(document + [rng.randrange(3, 400)] + copy)
    plain = run(make_core(loaded, None), prompts)
    core = make_core(loaded, ngram(k, 1, 8))
    speculated = run(core, prompts)
    assert tokens_of(speculated) == tokens_of(plain)
    assert core.speculator.indents is not None and len(core.speculator.indents) == 13
    assert core.speculator.counters.num_drafts > 0
