"""Structured outputs in the engine core, on the tiny random model with a real
byte-level tokenizer: masks reach the right rows of a mixed batch, outputs
match their grammar and end with "stop", preemption keeps the grammar state,
aborts free it, logprobs stay raw, and a grammar the tokenizer cannot serve is
an engine error for that request alone."""

from __future__ import annotations

import gc
import json
import re
import weakref
from dataclasses import replace

import pytest

from sluice.engine.messages import AddRequest, input_decoder, input_encoder
from sluice.engine.sampling_params import SamplingParams
from sluice.structured import StructuredOutputSpec
from sluice.testing.byte_tokenizer import byte_level_tokenizer
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
        core.add_request(request_id, prompt, params)
    results = {request_id: ([], None, []) for request_id in requests}
    while core.has_unfinished_requests():
        for delta in core.step():
            tokens, _, logprobs = results[delta.request_id]
            tokens.extend(delta.new_token_ids)
            if delta.logprobs is not None:
                logprobs.append(delta.logprobs)
            results[delta.request_id] = (tokens, delta.finish_reason, logprobs)
    return results


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
    core.add_request("r", PROMPTS[0], greedy(StructuredOutputSpec.regex("a+")))
    core.step()
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
    core.handle(AddRequest("bad", PROMPTS[0], bad), deltas, errors)
    core.handle(AddRequest("good", PROMPTS[1], greedy(None, max_tokens=2)), deltas, errors)
    ((request_id, message),) = [(e.request_id, e.message) for e in errors]
    assert request_id == "bad" and "no_such_token" in message
    assert core.scheduler.get_request("good") is not None


def test_a_model_without_a_tokenizer_refuses_structured_requests(tiny_loaded):
    core = make_core(tiny_loaded)
    with pytest.raises(ValueError, match="tokenizer"):
        core.add_request("r", PROMPTS[0], greedy(StructuredOutputSpec.json_object()))


def test_the_spec_crosses_the_process_boundary_as_a_value(loaded):
    """What the engine process decodes from the wire builds the same matcher."""
    sent = AddRequest("r", PROMPTS[0], greedy(StructuredOutputSpec.json_schema(SCHEMA)))
    received = input_decoder.decode(input_encoder.encode(sent))
    assert received == sent
    core = make_core(loaded)
    core.handle(received, [], [])
    assert core.scheduler.get_request("r").grammar is not None
