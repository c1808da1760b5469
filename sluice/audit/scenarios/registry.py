"""The audit's scenarios, by name."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from sluice.audit.records import ScenarioResult
from sluice.audit.scenarios.backpressure import run_backpressure
from sluice.audit.scenarios.bad_inputs import run_bad_inputs
from sluice.audit.scenarios.base import ScenarioContext
from sluice.audit.scenarios.choices import run_choices
from sluice.audit.scenarios.determinism import run_determinism
from sluice.audit.scenarios.disconnect import run_disconnect
from sluice.audit.scenarios.lag import run_lag
from sluice.audit.scenarios.logprobs import run_logprobs
from sluice.audit.scenarios.messages import run_messages
from sluice.audit.scenarios.ollama import run_ollama
from sluice.audit.scenarios.responses import run_responses
from sluice.audit.scenarios.soak import run_soak
from sluice.audit.scenarios.stops import run_stops
from sluice.audit.scenarios.structured import run_structured
from sluice.audit.scenarios.tools import run_tools
from sluice.audit.scenarios.usage import run_usage
from sluice.audit.scenarios.utf8 import run_utf8

Scenario = Callable[[ScenarioContext], Awaitable[ScenarioResult]]

SCENARIOS: dict[str, Scenario] = {
    "lag": run_lag,
    "backpressure": run_backpressure,
    "logprobs": run_logprobs,
    "determinism": run_determinism,
    "choices": run_choices,
    "stops": run_stops,
    "utf8": run_utf8,
    "structured": run_structured,
    "tools": run_tools,
    "usage": run_usage,
    "bad_inputs": run_bad_inputs,
    "disconnect": run_disconnect,
    "soak": run_soak,
    "responses": run_responses,
    "messages": run_messages,
    "ollama": run_ollama,
}
