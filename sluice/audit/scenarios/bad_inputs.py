"""Bad inputs (STREAMING_CONTRACT.md, "The wire" 3).

Malformed JSON, wrong types, an unknown model, out-of-range numbers, empty or
missing prompts: each must be a 4xx (never 422, never 5xx) with the OpenAI
error object, and leave the server answering: /health and a tiny valid
request are tried afterwards. A server that answers any model name (preflight
found it, and noted it) is not sent the unknown-model case.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from sluice.audit.checks.evidence import finding, scenario_finding
from sluice.audit.probes import UNKNOWN_MODEL
from sluice.audit.records import CHAT, COMPLETIONS, ScenarioResult
from sluice.audit.scenarios.base import ScenarioContext, health_probe

NAME = "bad_inputs"
# Every accepted invalid request is one cause; each case keeps its message.
LAX_VALIDATION = "invalid requests answered 2xx (lax validation)"


@dataclass(frozen=True, slots=True)
class BadCase:
    name: str
    endpoint: str
    # Fields replaced in a valid body (None removes the field)...
    changes: dict[str, Any] | None = None
    # ...or raw bytes sent as the body instead.
    raw: bytes | None = None


BAD_CASES = (
    BadCase("malformed JSON", COMPLETIONS, raw=b'{"model": "m", "prompt": "hi",'),
    BadCase("malformed JSON (chat)", CHAT, raw=b'{"messages": [}'),
    BadCase("body is not an object", CHAT, raw=b"[1, 2, 3]"),
    BadCase("max_tokens is a string", COMPLETIONS, {"max_tokens": "ten"}),
    BadCase("messages is a string", CHAT, {"messages": "hello"}),
    BadCase("temperature is a string", CHAT, {"temperature": "hot"}),
    BadCase("stream is a list", COMPLETIONS, {"stream": [1]}),
    BadCase("prompt is an object", COMPLETIONS, {"prompt": {"text": "hi"}}),
    BadCase("stop is a number", COMPLETIONS, {"stop": 5}),
    BadCase("unknown model", CHAT, {"model": UNKNOWN_MODEL}),
    BadCase("negative max_tokens", COMPLETIONS, {"max_tokens": -5}),
    BadCase("n = 0", CHAT, {"n": 0}),
    BadCase("temperature -1", COMPLETIONS, {"temperature": -1}),
    BadCase("top_p 2", CHAT, {"top_p": 2.0}),
    BadCase("logprobs too high", COMPLETIONS, {"logprobs": 1000}),
    BadCase("top_logprobs too high", CHAT, {"logprobs": True, "top_logprobs": 1000}),
    BadCase("empty messages", CHAT, {"messages": []}),
    BadCase("unknown role", CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}),
    BadCase("missing prompt", COMPLETIONS, {"prompt": None}),
)


def _body(ctx: ScenarioContext, case: BadCase) -> dict[str, Any]:
    body = ctx.body(case.endpoint, "Say hello.", 4)
    for key, value in copy.deepcopy(case.changes or {}).items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


async def run_bad_inputs(ctx: ScenarioContext) -> ScenarioResult:
    result = ctx.begin(NAME)
    cases = [case for case in BAD_CASES if not _is_moot(ctx, case)]
    for _ in range(ctx.sizes.bad_inputs.repeat):
        for case in cases:
            body = None if case.raw is not None else _body(ctx, case)
            exchange = ctx.exchange(NAME, case.endpoint, body, f"bad_inputs/{case.name}")
            exchange.raw_request = case.raw
            exchange.expects_error = True
            await ctx.client.send(exchange)
            result.exchanges.append(exchange)
            if exchange.is_ok:
                message = f"{case.name}: answered {exchange.status}"
                accepted = finding("bad_input_accepted", exchange, message, cause=LAX_VALIDATION)
                result.findings.append(accepted)
    await _check_still_healthy(ctx, result)
    return ctx.finish(result)


def _is_moot(ctx: ScenarioContext, case: BadCase) -> bool:
    return ctx.traits.answers_any_model and (case.changes or {}).get("model") == UNKNOWN_MODEL


async def _check_still_healthy(ctx: ScenarioContext, result: ScenarioResult) -> None:
    probe = await health_probe(ctx.client)
    valid = await ctx.send(
        NAME, COMPLETIONS, ctx.body(COMPLETIONS, "Say hello.", 2), "bad_inputs/valid after"
    )
    result.exchanges.append(valid)
    result.figures["health_after_s"] = probe.latency_s
    if not probe.is_ok or not valid.is_ok:
        message = (
            f"after the invalid requests: health {probe.status or probe.error}, "
            f"valid request {valid.status or valid.transport_error}"
        )
        target = ctx.client.target.label
        result.findings.append(scenario_finding("unhealthy_after_bad_input", NAME, target, message))
