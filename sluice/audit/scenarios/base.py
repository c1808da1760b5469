"""What every scenario shares: the client of the target, the options, request
bodies in both APIs, and the non-streamed twin of a streamed request.

Every request is greedy (`temperature: 0`) so the twin is the reference the
stream must match (I1), and a scenario's requests are the same on every run.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sluice.audit.checks.exchange import ensure_view
from sluice.audit.options import AuditOptions, Sizes
from sluice.audit.probes import ServerTraits
from sluice.audit.records import CHAT, COMPLETIONS, Exchange, Reader, ScenarioResult
from sluice.audit.transport import Client, Probe

ENDPOINTS = (COMPLETIONS, CHAT)
# Twins run after their streams, this many at once: enough to keep a batching
# server busy, few enough not to turn the reference run into a load test.
MAX_CONCURRENT_TWINS = 4


@dataclass(slots=True)
class ScenarioContext:
    client: Client
    options: AuditOptions
    # What preflight found the server supports: scenarios send an extension
    # only when it is True here.
    traits: ServerTraits = ServerTraits()

    @property
    def sizes(self) -> Sizes:
        return self.options.sizes

    def begin(self, scenario: str) -> ScenarioResult:
        now_s = self.client.now_s()
        return ScenarioResult(scenario, self.client.target.label, started_s=now_s, finished_s=now_s)

    def finish(self, result: ScenarioResult) -> ScenarioResult:
        result.finished_s = self.client.now_s()
        return result

    def body(
        self, endpoint: str, prompt: str | list[str], max_tokens: int, **extra: Any
    ) -> dict[str, Any]:
        """A greedy request body for either API; `extra` fields are merged in."""
        body: dict[str, Any] = {
            "model": self.client.target.model,
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        if endpoint == CHAT:
            assert isinstance(prompt, str), "chat takes one prompt"
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        body.update(extra)
        return body

    def stream_options(self, *, continuous: bool) -> dict[str, Any]:
        options: dict[str, Any] = {"include_usage": True}
        if continuous and self.traits.continuous_usage_stats:
            options["continuous_usage_stats"] = True
        return options

    def logprobs_fields(self, endpoint: str, top: int) -> dict[str, Any]:
        if endpoint == CHAT:
            return {"logprobs": True, "top_logprobs": top}
        return {"logprobs": top}

    def exchange(
        self, scenario: str, endpoint: str, body: dict[str, Any] | None, case: str
    ) -> Exchange:
        return Exchange(scenario, self.client.target.label, endpoint, body, case=case)

    async def send(
        self,
        scenario: str,
        endpoint: str,
        body: dict[str, Any],
        case: str,
        *,
        reader: Reader | None = None,
        with_twin: bool = False,
    ) -> Exchange:
        exchange = await self.client.send(self.exchange(scenario, endpoint, body, case), reader)
        if with_twin:
            await self.add_twin(exchange)
        return exchange

    async def add_twin(self, exchange: Exchange) -> None:
        """Send the same request with `stream: false` and attach it as reference."""
        assert exchange.body is not None, "twins are for JSON requests"
        body = copy.deepcopy(exchange.body)
        body["stream"] = False
        body.pop("stream_options", None)
        twin = self.exchange(
            exchange.scenario, exchange.endpoint, body, exchange.case + " (non-streamed)"
        )
        exchange.twin = await self.client.send(twin)

    async def add_twins(self, exchanges: Iterable[Exchange]) -> None:
        """Twins for many streams, one per distinct body, a few at a time, after the streams."""
        by_body: dict[str, list[Exchange]] = {}
        for exchange in exchanges:
            by_body.setdefault(repr(exchange.body), []).append(exchange)
        limit = asyncio.Semaphore(MAX_CONCURRENT_TWINS)

        async def twin_for(group: list[Exchange]) -> None:
            async with limit:
                await self.add_twin(group[0])
            for other in group[1:]:
                other.twin = group[0].twin

        await asyncio.gather(*(twin_for(group) for group in by_body.values()))


async def gather_exchanges(*coroutines: Any) -> list[Exchange]:
    return list(await asyncio.gather(*coroutines))


def choice_texts(exchange: Exchange) -> dict[int, str]:
    """Texts per index of a non-streamed response (empty when it failed)."""
    if not exchange.is_ok:
        return {}
    return ensure_view(exchange).texts()


async def health_probe(client: Client) -> Probe:
    """GET /health, or /v1/models on servers without one."""
    probe = await client.get("/health")
    if probe.status in (404, 405):
        probe = await client.get("/v1/models")
    return probe
