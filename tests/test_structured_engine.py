"""Structured outputs in the engine core, on the tiny random model with a real
byte-level tokenizer: masks reach the right rows of a mixed batch, outputs
match their grammar and end with "stop", preemption keeps the grammar state,
aborts free it, logprobs stay raw, and a grammar the tokenizer cannot serve is
an engine error for that request alone. Grammars compile off the engine loop:
with the compile held at a test-owned gate, other requests keep stepping, the
choices of one request share one compile, and a request aborted meanwhile
never runs."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import threading
import weakref
from dataclasses import replace

import pytest

from sluice.engine.engine_request import generation_request
from sluice.engine.inproc_client import InProcessEngineClient
from sluice.engine.messages import AddRequest, input_decoder, input_encoder
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import InvalidRequestError
from sluice.structured import StructuredOutputSpec
from sluice.structured import grammar as grammar_module
from sluice.structured.grammar import MAX_GRAMMAR_SOURCE_CHARS, GrammarLimitError
from sluice.structured.grammar_cache import GrammarCache
from sluice.testing.byte_tokenizer import byte_level_tokenizer
from sluice.testing.recording_sink import RecordingSink
from sluice.tokenizer import Tokenizer
from tests.model_factory import make_core

# Compact JSON (llguidance's x-guidance options): a random model left free to
# add whitespace between tokens may do nothing else until max_tokens.
COMPACT = {"whitespace_flexible": False}
SCHEMA = {
    "x-guidance": COMPACT,
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "colour": {"enum": ["red", "green"]}},
    "required": ["ok", "colour"],
    "additionalProperties": False,
}
PATTERN = "[ab]{3}-[0-9]{1,4}"
PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]


@pytest.fixture(scope="module")
def loaded(tiny_loaded):
    """The tiny model with a byte-level tokenizer (EOS 2, as the model's)."""
    tokenizer = Tokenizer(
        byte_level_tokenizer(),
        special_tokens={"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
        chat_template=None,
    )
    return replace(tiny_loaded, tokenizer=tokenizer)


def greedy(spec: StructuredOutputSpec | None, **fields) -> SamplingParams:
    fields = {"temperature": 0.0, "max_tokens": 64, **fields}
    return SamplingParams(structured_output=spec, **fields)


def run(core, requests: dict[str, tuple[list[int], SamplingParams]]):
    """Run to completion; request id -> (token ids, finish reason, logprob deltas)."""
    for request_id, (prompt, params) in requests.items():
        core.add_request(generation_request(request_id, prompt, params))
    results = {request_id: ([], None, []) for request_id in requests}
    while core.has_unfinished_requests():
        for delta in core.step():
            tokens, _, logprobs = results[delta.request_id]
            tokens.extend(delta.new_token_ids)
            if delta.logprobs is not None:
                logprobs.append(delta.logprobs)
            results[delta.request_id] = (tokens, delta.finish_reason, logprobs)
    return results


def step_until_admitted(core, request_id: str) -> list:
    """Step until the request's grammar compiled and it joined the scheduler."""
    deltas = []
    while core.scheduler.get_request(request_id) is None:
        assert core.has_unfinished_requests() and not core.take_errors()
        deltas.extend(core.step())
    return deltas


def text(loaded, token_ids: list[int]) -> str:
    return loaded.tokenizer.decode(token_ids)


def test_two_constrained_rows_and_a_free_one_share_a_batch(loaded):
    requests = {
        "schema": (PROMPTS[0], greedy(StructuredOutputSpec.json_schema(SCHEMA))),
        "free": (PROMPTS[1], greedy(None, ignore_eos=True, max_tokens=24)),
        "regex": (PROMPTS[2], greedy(StructuredOutputSpec.regex(PATTERN))),
    }
    batched = run(make_core(loaded), requests)
    schema_tokens, schema_finish, _ = batched["schema"]
    value = json.loads(text(loaded, schema_tokens))
    assert set(value) == {"ok", "colour"} and value["colour"] in ("red", "green")
    assert isinstance(value["ok"], bool) and schema_finish == "stop"
    regex_tokens, regex_finish, _ = batched["regex"]
    assert re.fullmatch(PATTERN, text(loaded, regex_tokens)) and regex_finish == "stop"
    # The free row is untouched by its neighbours' masks: the same tokens alone.
    alone = run(make_core(loaded), {"free": requests["free"]})
    assert batched["free"][:2] == alone["free"][:2]


def test_constrained_output_differs_from_free_output_so_the_mask_acts(loaded):
    spec = StructuredOutputSpec.choice(["yes", "no"])
    results = run(
        make_core(loaded), {"c": (PROMPTS[0], greedy(spec)), "f": (PROMPTS[0], greedy(None))}
    )
    assert text(loaded, results["c"][0]) in ("yes", "no") and results["c"][1] == "stop"
    assert results["f"][0] != results["c"][0]


def test_every_kind_compiles_and_is_honoured(loaded):
    specs = {
        "object": StructuredOutputSpec.json_object(),
        "enum": StructuredOutputSpec.json_schema({"enum": ["red", "green"]}),
        "grammar": StructuredOutputSpec.grammar('start: "x" ("y" | "z")+ "."'),
    }
    results = run(
        make_core(loaded), {k: (PROMPTS[0], greedy(s, max_tokens=200)) for k, s in specs.items()}
    )
    assert json.loads(text(loaded, results["enum"][0])) in ("red", "green")
    assert re.fullmatch(r"x[yz]+\.", text(loaded, results["grammar"][0]))
    # A random model may pad a free-form object with whitespace up to max_tokens;
    # whatever it wrote is a prefix the grammar allowed, so it starts an object.
    assert text(loaded, results["object"][0]).lstrip().startswith("{")


def test_preempted_constrained_requests_resume_with_the_same_tokens(loaded):
    specs = [StructuredOutputSpec.json_schema(SCHEMA), StructuredOutputSpec.regex("[ab]{30}")]
    requests = {
        f"r{i}": ([3 + (7 * i + j) % 500 for j in range(30)], greedy(specs[i % 2]))
        for i in range(12)
    }
    roomy = run(make_core(loaded, num_blocks=512), requests)
    # 160 token slots for 12 requests of ~60 tokens: forces preemption.
    core = make_core(replace(loaded, max_model_len=128), num_blocks=40)
    preempted = record_preemptions(core)
    assert run(core, requests) == roomy
    assert preempted
    assert all(finish == "stop" for _, finish, _ in roomy.values())


def record_preemptions(core) -> list[str]:
    """The ids the scheduler preempts from now on, in order."""
    preempted: list[str] = []
    schedule = core.scheduler.schedule

    def recording_schedule():
        plan = schedule()
        preempted.extend(plan.preempted_ids)
        return plan

    core.scheduler.schedule = recording_schedule
    return preempted


def test_an_aborted_request_drops_its_matcher(loaded):
    core = make_core(loaded)
    core.add_request(generation_request("r", PROMPTS[0], greedy(StructuredOutputSpec.regex("a+"))))
    step_until_admitted(core, "r")
    matcher = weakref.ref(core.scheduler.get_request("r").grammar)
    (delta,) = core.abort_requests(["r"])
    gc.collect()
    assert delta.finish_reason == "abort" and matcher() is None


def test_logprobs_are_the_raw_model_values(loaded):
    """The first token's alternatives come before any mask: equal with and
    without a grammar, though the sampled tokens differ."""
    spec = StructuredOutputSpec.choice(["yes", "no"])
    results = run(
        make_core(loaded),
        {
            "c": (PROMPTS[0], greedy(spec, logprobs=5)),
            "f": (PROMPTS[0], greedy(None, logprobs=5, max_tokens=2)),
        },
    )
    constrained, free = results["c"][2][0], results["f"][2][0]
    assert constrained.top_token_ids[0] == free.top_token_ids[0]
    assert constrained.top_logprobs[0] == pytest.approx(free.top_logprobs[0])
    assert results["c"][0][0] != results["f"][0][0]
    # The sampled token's logprob is its raw one, below the (forbidden) top token's.
    assert constrained.logprobs[0] < constrained.top_logprobs[0][0]


def test_a_grammar_the_tokenizer_cannot_serve_is_an_error_for_that_request(loaded):
    core = make_core(loaded)
    deltas, errors = [], []
    bad = greedy(StructuredOutputSpec.grammar('start: "a" <|no_such_token|>'))
    core.handle(AddRequest(generation_request("bad", PROMPTS[0], bad)), deltas, errors)
    core.handle(
        AddRequest(generation_request("good", PROMPTS[1], greedy(None, max_tokens=2))),
        deltas,
        errors,
    )
    while core.has_unfinished_requests():
        deltas.extend(core.step())
        errors.extend(core.take_errors())
    ((request_id, message),) = [(e.request_id, e.message) for e in errors]
    assert request_id == "bad" and "no_such_token" in message
    assert [d.finish_reason for d in deltas if d.request_id == "good"][-1] == "length"
    # The refusal is remembered: the same grammar again is refused at once.
    core.handle(AddRequest(generation_request("again", PROMPTS[0], bad)), deltas, errors)
    assert errors[-1].request_id == "again" and "no_such_token" in errors[-1].message


def test_a_model_without_a_tokenizer_refuses_structured_requests(tiny_loaded):
    core = make_core(tiny_loaded)
    with pytest.raises(ValueError, match="tokenizer"):
        core.add_request(
            generation_request("r", PROMPTS[0], greedy(StructuredOutputSpec.json_object()))
        )


def test_the_spec_crosses_the_process_boundary_as_a_value(loaded):
    """What the engine process decodes from the wire builds the same matcher."""
    sent = AddRequest(
        generation_request("r", PROMPTS[0], greedy(StructuredOutputSpec.json_schema(SCHEMA)))
    )
    received = input_decoder.decode(input_encoder.encode(sent))
    assert received == sent
    core = make_core(loaded)
    core.handle(received, [], [])
    step_until_admitted(core, "r")
    assert core.scheduler.get_request("r").grammar is not None


# -- compiled off the engine loop ----------------------------------------------------


class GatedCompiler:
    """The engine's compiler behind a gate the test opens; it records each spec
    it was asked to compile."""

    def __init__(self, compiler) -> None:
        self.compiler = compiler
        self.gate = threading.Event()
        self.specs: list[StructuredOutputSpec] = []

    def check(self, spec: StructuredOutputSpec) -> None:
        self.compiler.check(spec)

    def compile(self, spec: StructuredOutputSpec):
        self.specs.append(spec)
        self.gate.wait()
        return self.compiler.compile(spec)


@pytest.fixture
def gated(loaded):
    """An engine core whose grammars compile only once the test opens the gate."""
    core = make_core(loaded)
    compiler = GatedCompiler(core.grammars.compiler)
    core.grammars = GrammarCache(compiler)
    try:
        yield core, compiler
    finally:
        compiler.gate.set()  # never leave the worker thread blocked


def run_to_completion(core, deltas=()) -> dict[str, tuple[list[int], str | None]]:
    """Request id -> (token ids, finish reason), from `deltas` already taken on."""
    results: dict[str, tuple[list[int], str | None]] = {}
    deltas = list(deltas)
    while deltas or core.has_unfinished_requests():
        for delta in deltas:
            tokens, _ = results.get(delta.request_id, ([], None))
            results[delta.request_id] = ([*tokens, *delta.new_token_ids], delta.finish_reason)
        deltas = core.step() if core.has_unfinished_requests() else []
        assert not core.take_errors()
    return results


def test_other_requests_keep_stepping_while_a_grammar_compiles(loaded, gated):
    core, compiler = gated
    core.add_request(
        generation_request("free", PROMPTS[1], greedy(None, ignore_eos=True, max_tokens=6))
    )
    core.add_request(
        generation_request("slow", PROMPTS[0], greedy(StructuredOutputSpec.regex(PATTERN)))
    )
    free_tokens = []
    for _ in range(6):
        for delta in core.step():
            assert delta.request_id == "free"
            free_tokens.extend(delta.new_token_ids)
    # "free" ran to its end while "slow" waited, outside the batch, for its grammar.
    assert len(free_tokens) == 6 and core.scheduler.get_request("free") is None
    assert core.has_unfinished_requests() and core.scheduler.get_request("slow") is None
    assert core.stats().num_waiting == 1
    compiler.gate.set()
    tokens, finish = run_to_completion(core)["slow"]
    assert re.fullmatch(PATTERN, text(loaded, tokens)) and finish == "stop"


def test_the_choices_of_one_request_share_one_compile(loaded, gated):
    core, compiler = gated
    spec = StructuredOutputSpec.json_schema(SCHEMA)
    for i in range(3):
        core.add_request(generation_request(f"c{i}", PROMPTS[0], greedy(spec)))
    compiler.gate.set()
    deltas = step_until_admitted(core, "c2")
    matchers = {id(core.scheduler.get_request(f"c{i}").grammar.matcher) for i in range(3)}
    assert len(matchers) == 3, "each choice advances a matcher of its own"
    results = run_to_completion(core, deltas)
    assert compiler.specs == [spec]
    outputs = {text(loaded, results[f"c{i}"][0]) for i in range(3)}
    (output,) = outputs  # greedy: the same valid object three times
    assert set(json.loads(output)) == {"ok", "colour"}
    # A later request of the same spec starts at once, from the cache.
    core.add_request(generation_request("later", PROMPTS[1], greedy(spec)))
    assert core.scheduler.get_request("later") is not None and compiler.specs == [spec]


def test_a_request_aborted_while_its_grammar_compiles_ends_with_abort_and_never_runs(loaded, gated):
    core, compiler = gated
    spec = StructuredOutputSpec.regex(PATTERN)
    core.add_request(generation_request("slow", PROMPTS[0], greedy(spec)))
    (delta,) = core.abort_requests(["slow", "unknown"])
    assert delta.request_id == "slow" and delta.finish_reason == "abort"
    assert delta.new_token_ids == () and not core.has_unfinished_requests()
    assert core.stats().num_waiting == 0
    # Its compile goes on for the next request of the same spec.
    core.add_request(generation_request("slow", PROMPTS[0], greedy(spec)))
    compiler.gate.set()
    assert run_to_completion(core)["slow"][1] == "stop" and compiler.specs == [spec]


def test_a_request_id_waiting_for_its_grammar_is_live(gated):
    core, _ = gated
    core.add_request(generation_request("r", PROMPTS[0], greedy(StructuredOutputSpec.regex("a+"))))
    with pytest.raises(ValueError, match="already live"):
        core.add_request(generation_request("r", PROMPTS[1], greedy(None)))


def test_a_spec_over_the_size_limit_is_refused_at_once_without_a_compile(gated):
    core, compiler = gated
    choices = [f"{i:09d}" for i in range(MAX_GRAMMAR_SOURCE_CHARS // 12 + 1)]  # 12 chars each
    with pytest.raises(GrammarLimitError, match="over the limit"):
        core.add_request(
            generation_request("big", PROMPTS[0], greedy(StructuredOutputSpec.choice(choices)))
        )
    assert compiler.specs == [] and not core.has_unfinished_requests()


def test_a_grammar_over_the_compile_time_limit_is_an_error_for_that_request(loaded, monkeypatch):
    # Every compile takes some CPU: none is within a limit of zero.
    monkeypatch.setattr(grammar_module, "MAX_GRAMMAR_COMPILE_CPU_S", 0.0)
    core = make_core(loaded)
    deltas, errors = [], []
    request = AddRequest(
        generation_request("r", PROMPTS[0], greedy(StructuredOutputSpec.regex("b+")))
    )
    core.handle(request, deltas, errors)  # refused here if the compile is done already
    while core.has_unfinished_requests():
        deltas.extend(core.step())
        errors.extend(core.take_errors())
    ((request_id, message),) = [(e.request_id, e.message) for e in errors]
    assert request_id == "r" and "s of CPU, over the limit of 0.0 s" in message
    assert deltas == []


def test_a_grammar_refused_while_compiling_reaches_the_client_as_that_requests_error(gated):
    core, compiler = gated
    bad = greedy(StructuredOutputSpec.grammar('start: "a" <|not_in_the_vocabulary|>'))

    async def serve() -> tuple[RecordingSink, RecordingSink]:
        client = InProcessEngineClient(core)
        await client.start()
        try:
            refused, served = RecordingSink(), RecordingSink()
            client.add_request(generation_request("bad", PROMPTS[0], bad), refused)
            client.add_request(
                generation_request("good", PROMPTS[1], greedy(None, max_tokens=3)), served
            )
            await served.done.wait()  # "good" ran while "bad" compiled
            assert not refused.done.is_set()
            compiler.gate.set()
            await refused.done.wait()
            return refused, served
        finally:
            await client.shutdown()

    refused, served = asyncio.run(asyncio.wait_for(serve(), 120))
    ((error,),) = [refused.errors]
    assert isinstance(error, InvalidRequestError) and "not_in_the_vocabulary" in str(error)
    assert refused.deltas == [] and served.deltas[-1].finish_reason == "length"
