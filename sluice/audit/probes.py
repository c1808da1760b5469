"""Preflight probes: which vLLM extensions a server really supports, and
whether it tells model names apart, learned from a few tiny greedy requests
before any scenario runs.

An extension is supported when it takes effect, not when the field is
accepted (most servers ignore unknown fields): continuous usage puts usage
on content chunks; include_stop_str_in_output keeps a stop string cut from
the server's own greedy text; min_tokens defers that stop string;
stop_reason names it; prompt_logprobs come back; ignore_eos runs past an EOS
the same request otherwise stops at (unprovable without one: then assumed).
A missing extension is one "extension_unsupported" note, and no scenario
sends it (`ServerTraits`). With `--vllm-extensions on|off` nothing is probed
but the model name.

The agent APIs' scenarios (responses, messages, ollama) run only where their route
is served: a one-token POST that answers 404 or 405 is one "api_not_served"
note, and the scenario sends nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

from sluice.audit.checks.evidence import scenario_finding
from sluice.audit.records import COMPLETIONS, MESSAGES, OLLAMA_CHAT, RESPONSES, Exchange, Finding
from sluice.audit.stream_view import view_exchange
from sluice.audit.transport import Client

NAME = "preflight"
UNKNOWN_MODEL = "sluice-audit-no-such-model"
_PROMPT = "The solar system has eight planets. The first one, Mercury,"
_BASE_TOKENS = 12
# Stop strings need this many characters of greedy text to be cut from.
_MIN_BASE_CHARS = 12


@dataclass(frozen=True, slots=True)
class ServerTraits:
    """What the scenarios may send, and how the server treats model names."""

    continuous_usage_stats: bool = True
    include_stop_str_in_output: bool = True
    min_tokens: bool = True
    stop_reason: bool = True
    prompt_logprobs: bool = True
    ignore_eos: bool = True
    # Answers 2xx to a model it does not serve: the unknown-model case is moot.
    answers_any_model: bool = False
    # POST /v1/responses and /v1/messages are routed (not 404/405).
    serves_responses: bool = True
    serves_messages: bool = True
    # POST /api/chat (Ollama's API) is routed.
    serves_ollama: bool = True


_NOT_EXTENSIONS = frozenset(
    {"answers_any_model", "serves_responses", "serves_messages", "serves_ollama"}
)
EXTENSIONS = tuple(f.name for f in fields(ServerTraits) if f.name not in _NOT_EXTENSIONS)
# Scenario -> (trait, endpoint, a one-token request body without the model).
AGENT_ROUTES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "responses": ("serves_responses", RESPONSES, {"input": "Hi", "max_output_tokens": 1}),
    "messages": ("serves_messages", MESSAGES,
                 {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
    "ollama": ("serves_ollama", OLLAMA_CHAT,
               {"messages": [{"role": "user", "content": "Hi"}], "stream": False,
                "options": {"num_predict": 1}}),
}  # fmt: skip
NO_EXTENSIONS = ServerTraits(**dict.fromkeys(EXTENSIONS, False))


@dataclass(slots=True)
class _Prober:
    client: Client

    async def post(self, **fields_: Any) -> Exchange:
        body = {"model": self.client.target.model, "prompt": _PROMPT, "temperature": 0}
        body.update(fields_)
        exchange = Exchange(NAME, self.client.target.label, COMPLETIONS, body, case=NAME)
        return await self.client.send(exchange)

    async def choice(self, **fields_: Any) -> dict[str, Any]:
        """The first choice of a non-streamed answer ({} when refused or unreadable)."""
        exchange = await self.post(**fields_)
        if not exchange.is_ok:
            return {}
        try:
            choices = json.loads(exchange.raw).get("choices") or [{}]
        except (ValueError, AttributeError):
            return {}
        return choices[0] if isinstance(choices[0], dict) else {}


async def probe_server(
    client: Client, mode: str, scenarios: tuple[str, ...] = ()
) -> tuple[ServerTraits, list[Finding]]:
    """The traits of the client's target and the notes they earn; the routes
    of the agent APIs among `scenarios` are probed whatever the mode."""
    prober = _Prober(client)
    routes, route_notes = await _probe_routes(client, scenarios)
    any_model = await prober.post(model=UNKNOWN_MODEL, max_tokens=1)
    traits = ServerTraits(answers_any_model=any_model.is_ok)
    if mode == "off":
        traits = replace(NO_EXTENSIONS, answers_any_model=traits.answers_any_model)
    elif mode == "auto":
        traits = replace(traits, **await _probe_extensions(prober))
    notes = [_note(client, name) for name in EXTENSIONS if not getattr(traits, name)]
    if mode == "off":
        notes = []
    if traits.answers_any_model:
        message = f"model {UNKNOWN_MODEL!r} was answered {any_model.status}"
        notes.append(scenario_finding("model_name_ignored", NAME, client.target.label, message))
    return replace(traits, **routes), notes + route_notes


async def _probe_routes(
    client: Client, scenarios: tuple[str, ...]
) -> tuple[dict[str, bool], list[Finding]]:
    routes, notes = {}, []
    for scenario in dict.fromkeys(scenarios):
        if scenario not in AGENT_ROUTES:
            continue
        trait, endpoint, fields_ = AGENT_ROUTES[scenario]
        body = {"model": client.target.model, "temperature": 0, **fields_}
        answer = await client.send(Exchange(NAME, client.target.label, endpoint, body, case=NAME))
        routes[trait] = answer.status not in (404, 405)
        if not routes[trait]:
            message = (
                f"POST {endpoint} answered {answer.status}: API not served; {scenario} skipped"
            )
            notes.append(scenario_finding("api_not_served", NAME, client.target.label, message))
    return routes, notes


def _note(client: Client, name: str) -> Finding:
    message = f"{name}: not supported (preflight probe); no scenario sends it"
    return scenario_finding("extension_unsupported", NAME, client.target.label, message)


async def _probe_extensions(prober: _Prober) -> dict[str, bool]:
    found = {"continuous_usage_stats": await _has_continuous_usage(prober)}
    base = (await prober.choice(max_tokens=_BASE_TOKENS)).get("text")
    stop = _stop_from(base) if isinstance(base, str) else None
    if stop is None:  # nothing to cut a stop string from: untestable, so unsent
        found.update(include_stop_str_in_output=False, min_tokens=False, stop_reason=False)
    else:
        included = await prober.choice(
            max_tokens=_BASE_TOKENS, stop=[stop], include_stop_str_in_output=True
        )
        found["include_stop_str_in_output"] = str(included.get("text", "")).endswith(stop)
        found["stop_reason"] = included.get("stop_reason") == stop
        deferred = await prober.choice(
            max_tokens=_BASE_TOKENS, stop=[stop], min_tokens=_BASE_TOKENS
        )
        found["min_tokens"] = deferred.get("finish_reason") == "length"
    scored = await prober.choice(max_tokens=1, prompt_logprobs=1)
    found["prompt_logprobs"] = bool(scored.get("prompt_logprobs"))
    found["ignore_eos"] = await _has_ignore_eos(prober)
    return found


async def _has_continuous_usage(prober: _Prober) -> bool:
    options = {"include_usage": True, "continuous_usage_stats": True}
    # Enough tokens for several chunks: a server that sends a few tokens per
    # chunk (speculation, a fast engine step) still shows usage before its end.
    exchange = await prober.post(max_tokens=16, stream=True, stream_options=options)
    if not exchange.is_ok:
        return False
    chunks = view_exchange(exchange).choices.get(0, [])
    return any(chunk.usage is not None and chunk.finish_reason is None for chunk in chunks)


async def _has_ignore_eos(prober: _Prober) -> bool:
    """Runs past the EOS that ends the same request without it; assumed when no EOS came."""
    plain = await prober.choice(max_tokens=_BASE_TOKENS)
    if not plain:
        return False
    ignoring = await prober.choice(max_tokens=_BASE_TOKENS, ignore_eos=True)
    if not ignoring:
        return False  # refused the field
    return plain.get("finish_reason") != "stop" or ignoring.get("finish_reason") == "length"


def _stop_from(text: str) -> str | None:
    """A stop string from the middle of the greedy text: it will match there."""
    if len(text.strip()) < _MIN_BASE_CHARS:
        return None
    start = len(text) // 2
    while start < len(text) - 4 and not text[start : start + 4].strip():
        start += 1
    stop = text[start : start + 4]
    return stop if stop.strip() else None
