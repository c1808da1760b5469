"""Sending a recording to one server: phases, requests, and the prefill-alone probes.

A server is measured in three phases of the same recording, one request at
a time in recorded order: `cold` (just started, nothing cached), `warm` (the
same session again at once) and `restart` (the server stopped, SIGTERM then
SIGKILL to its process group, and started again with the same command). Then
one `prefill` probe per cold and warm request: a completions request whose
prompt is that request's new tokens alone (prompt less cached, at least 1)
as random token ids nobody sent before, so nothing of it is cached: its TTFT
is what computing those tokens costs on a bare context.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import httpx
from _agent_convert import chat_body, replay_body
from _agent_session import Recorded
from _agent_sse import StreamFacts, StreamWatch

PHASES = ("cold", "warm", "restart")
REQUEST_TIMEOUT_S = 1800.0
# Token ids drawn for the probes: clear of the special tokens at the start of
# the embedded model's vocabulary (49,152), which every peer shares.
PROBE_TOKEN_IDS = range(1000, 49000)


@dataclass(slots=True, frozen=True)
class ServerSpec:
    """A server command to measure and what it speaks."""

    name: str  # "sluice", "sluice --kv-cache-dir", "llama-server --cache-ram 8192"
    command: str  # shell-like, "{port}" filled in at start
    dialects: frozenset[str]  # the dialects it takes natively; others go as chat


@dataclass(slots=True)
class Measured:
    """One replayed request in one phase."""

    phase: str  # PHASES, or "prefill"
    turn: int
    index: int  # its place among its turn's generation requests, 1-based
    dialect: str  # as sent
    facts: StreamFacts = field(default_factory=StreamFacts)
    wall_s: float = 0.0  # the whole request

    @property
    def num_new_tokens(self) -> int | None:
        if self.facts.num_prompt_tokens is None:
            return None
        return max(1, self.facts.num_prompt_tokens - (self.facts.num_cached_tokens or 0))


def request_for(spec: ServerSpec, recorded: Recorded, model: str, max_tokens: int,
                drop_tools: bool) -> tuple[str, str, dict]:  # fmt: skip
    """(dialect, path with query, body) to send `recorded` to `spec`'s server."""
    dialect = recorded.dialect
    assert dialect is not None, "only generation requests are replayed"
    if dialect in spec.dialects:
        path = recorded.path + (f"?{recorded.query}" if recorded.query else "")
        return dialect, path, replay_body(dialect, recorded.body, max_tokens, drop_tools)
    body = chat_body(dialect, recorded.body, model, max_tokens, drop_tools)
    return "chat", "/v1/chat/completions", body


def stream_one(client: httpx.Client, url: str, dialect: str, body: dict,
               headers: dict[str, str]) -> tuple[StreamFacts, float]:  # fmt: skip
    """Send one streaming request; what its stream said and its whole time."""
    watch = StreamWatch(dialect)
    started = time.perf_counter()
    with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            watch.facts.error = f"HTTP {response.status_code}: {response.read()[:300]!r}"
            return watch.facts, time.perf_counter() - started
        for line in response.iter_lines():
            watch.feed_line(line, time.perf_counter() - started)
    return watch.facts, time.perf_counter() - started


def headers_for(recorded: Recorded) -> dict[str, str]:
    auth = {"authorization": "Bearer replay", "x-api-key": "replay"}
    return auth | recorded.headers | {"content-type": "application/json"}


def replay_phase(base_url: str, spec: ServerSpec, phase: str, turns: dict[int, list[Recorded]],
                 model: str, max_tokens: int, drop_tools: bool) -> list[Measured]:  # fmt: skip
    results = []
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        for turn, requests in turns.items():
            for index, recorded in enumerate(requests, start=1):
                dialect, path, body = request_for(spec, recorded, model, max_tokens, drop_tools)
                facts, wall_s = stream_one(
                    client, base_url + path, dialect, body, headers_for(recorded)
                )
                results.append(Measured(phase, turn, index, dialect, facts, wall_s))
                print(f"  {spec.name} {phase} turn {turn}.{index}: ttft "
                      f"{_seconds(facts.first_content_s)}, prompt {facts.num_prompt_tokens}, "
                      f"cached {facts.num_cached_tokens}{' ' + facts.error if facts.error else ''}",
                      flush=True)  # fmt: skip
    return results


def probe_token_ids(num_tokens: int, seed: str) -> list[int]:
    draw = random.Random(seed)
    return [draw.choice(PROBE_TOKEN_IDS) for _ in range(num_tokens)]


def prefill_probes(base_url: str, spec: ServerSpec, measured: list[Measured], model: str,
                   run_id: str) -> list[Measured]:  # fmt: skip
    """One probe per measured request that reported its tokens (see the module doc)."""
    probes = []
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        for item in measured:
            if item.num_new_tokens is None:
                continue
            seed = f"{run_id}/{spec.name}/{item.phase}/{item.turn}/{item.index}"
            body = {"model": model, "prompt": probe_token_ids(item.num_new_tokens, seed),
                    "max_tokens": 1, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            facts, wall_s = stream_one(client, base_url + "/v1/completions", "completions",
                                       body, {"authorization": "Bearer replay"})  # fmt: skip
            probe = Measured(f"prefill:{item.phase}", item.turn, item.index, "completions")
            probe.facts, probe.wall_s = facts, wall_s
            probes.append(probe)
    return probes


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"
