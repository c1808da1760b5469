"""Preflight probes against scripted servers: an extension counts as supported
when it takes effect; each missing one is one note and no scenario sends it."""

from __future__ import annotations

import asyncio
import time

from sluice.audit.options import QUICK, AuditOptions
from sluice.audit.probes import EXTENSIONS, NO_EXTENSIONS, ServerTraits, probe_server
from sluice.audit.records import AuditResult, Target
from sluice.audit.runner import run_audit
from sluice.audit.transport import Client
from tests.broken_servers import MODEL, Defect, ScriptServer, serving

LLAMA_LIKE = frozenset(
    {"continuous_usage_stats", "include_stop_str_in_output", "min_tokens", "stop_reason",
     "prompt_logprobs"}
)  # fmt: skip


def probed(mode: str, **server: object) -> tuple[ServerTraits, list[str]]:
    async def run() -> tuple[ServerTraits, list[str]]:
        script = ScriptServer(**server)
        url = await script.start()
        try:
            target = Target("server", url, MODEL)
            async with Client(target, timeout_s=10, origin_s=time.perf_counter()) as client:
                traits, notes = await probe_server(client, mode)
        finally:
            await script.stop()
        return traits, [f"{note.check_id}: {note.message}" for note in notes]

    return asyncio.run(run())


def test_a_server_with_every_extension_probes_as_supporting_all_of_them():
    assert probed("auto") == (ServerTraits(), [])


def test_each_missing_extension_is_one_note_and_a_trait_turned_off():
    traits, notes = probed("auto", ignores=LLAMA_LIKE)
    assert traits == ServerTraits(ignore_eos=True, **dict.fromkeys(LLAMA_LIKE, False))
    assert notes == [
        f"extension_unsupported: {name}: not supported (preflight probe); no scenario sends it"
        for name in EXTENSIONS
        if name in LLAMA_LIKE
    ]


def test_a_server_answering_any_model_name_is_noted_whatever_the_mode():
    traits, notes = probed("off", answers_any_model=True)
    assert traits == ServerTraits(
        answers_any_model=True, **{name: getattr(NO_EXTENSIONS, name) for name in EXTENSIONS}
    )
    assert notes == ["model_name_ignored: model 'sluice-audit-no-such-model' was answered 200"]


def run(mode: str, scenarios: tuple[str, ...], **server: object) -> AuditResult:
    options = AuditOptions(scenarios=scenarios, sizes=QUICK, vllm_extensions=mode)
    with serving(Defect.NONE, **server) as url:
        return asyncio.run(run_audit([Target("server", url, MODEL)], options))


def test_scenarios_stop_sending_what_preflight_found_missing_and_nothing_breaks():
    result = run(
        "auto", ("stops", "usage", "bad_inputs"), ignores=LLAMA_LIKE, answers_any_model=True
    )
    assert {f.check_id for f in result.findings} == {"extension_unsupported", "model_name_ignored"}
    assert not result.has_broken_invariant
    bodies = [e.body for r in result.results for e in r.exchanges if e.body]
    assert not any("include_stop_str_in_output" in body for body in bodies)
    assert not any(
        (body.get("stream_options") or {}).get("continuous_usage_stats") for body in bodies
    )
    assert not any(body.get("model") == "sluice-audit-no-such-model" for body in bodies)


def test_extensions_forced_on_against_a_server_without_them_are_caught_by_their_checks():
    result = run("on", ("stops", "usage"), ignores=LLAMA_LIKE)
    failing = {f.check_id for f in result.findings if f.is_failure}
    assert failing == {"stop_str_not_included", "usage_continuous_missing"}
    assert {f.severity for f in result.findings if f.is_failure} == {"extension"}


def test_agent_routes_are_probed_for_their_scenarios_only_and_a_404_is_one_note():
    async def run(scenarios: tuple[str, ...], **server: object) -> tuple[ServerTraits, list[str]]:
        script = ScriptServer(**server)
        url = await script.start()
        try:
            target = Target("server", url, MODEL)
            async with Client(target, timeout_s=10, origin_s=time.perf_counter()) as client:
                traits, notes = await probe_server(client, "off", scenarios)
        finally:
            await script.stop()
        return traits, [f"{note.check_id}: {note.message}" for note in notes]

    served = asyncio.run(run(("responses", "messages")))
    assert served[0].serves_responses and served[0].serves_messages and served[1] == []
    traits, notes = asyncio.run(run(("messages", "usage"), serves_agent_apis=False))
    assert traits.serves_responses and not traits.serves_messages
    assert notes == [
        "api_not_served: POST /v1/messages answered 404: API not served; messages skipped"
    ]
