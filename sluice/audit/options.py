"""The audit's configuration: a frozen tree built once by the CLI.

Each scenario has a size dataclass; its fields become the CLI flags
`--<scenario>-<field>` (underscores as dashes), and the two profiles are two
instances of each. `quick` is sized for CI against a small CPU model (about
a minute); `full` is for a real server.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any


def _size(default: Any, help_text: str) -> Any:
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True, slots=True)
class LagSize:
    streams: int = _size(8, "concurrent streams")
    slow_share: float = _size(0.25, "share of the streams read slowly")
    max_tokens: int = _size(32, "max_tokens of each stream")
    long_prompts: int = _size(2, "huge prompts sent while the streams run")
    long_prompt_words: int = _size(800, "words in each huge prompt")
    slow_read_bytes: int = _size(256, "bytes a slow reader takes per read")
    slow_read_interval_s: float = _size(0.05, "pause of a slow reader between reads")
    health_stall_s: float = _size(3.0, "flag a /health answer slower than this during the lag")


@dataclass(frozen=True, slots=True)
class BackpressureSize:
    streams: int = _size(1, "paused streams per API, each beside the same request read at once")
    max_tokens: int = _size(512, "max_tokens of each stream (ignore_eos where supported)")
    top: int = _size(20, "top_logprobs asked for (bytes per token: buffers fill sooner)")
    n: int = _size(2, "choices per chat and completions stream (bytes per step)")
    pause_s: float = _size(
        25.0, "longest a paused reader reads nothing (it resumes when its control ends)"
    )


@dataclass(frozen=True, slots=True)
class LogprobsSize:
    requests: int = _size(1, "requests per API (completions and chat)")
    top: int = _size(3, "top alternatives asked for")
    max_tokens: int = _size(24, "max_tokens of each request")


@dataclass(frozen=True, slots=True)
class DeterminismSize:
    probes: int = _size(1, "probes per API, each sent alone, then inside the crowd")
    crowd: int = _size(6, "different requests running beside each probe")
    top: int = _size(2, "top alternatives asked for")
    max_tokens: int = _size(16, "max_tokens of a probe (crowd requests ask for twice as many)")


@dataclass(frozen=True, slots=True)
class ChoicesSize:
    n: int = _size(2, "choices per prompt")
    prompts: int = _size(2, "prompts in the completions list prompt")
    max_tokens: int = _size(16, "max_tokens of each choice")


@dataclass(frozen=True, slots=True)
class StopsSize:
    max_tokens: int = _size(32, "max_tokens of the stop-free base request")
    cases: int = _size(
        5, "stop-string cases per API (spanning, first chunk, overlapping, several, late)"
    )


@dataclass(frozen=True, slots=True)
class Utf8Size:
    requests: int = _size(2, "requests per API")
    max_tokens: int = _size(32, "max_tokens of each request")


@dataclass(frozen=True, slots=True)
class UsageSize:
    max_tokens: int = _size(8, "max_tokens of each request")


@dataclass(frozen=True, slots=True)
class BadInputsSize:
    repeat: int = _size(1, "times each invalid request is sent")


@dataclass(frozen=True, slots=True)
class DisconnectSize:
    streams: int = _size(4, "long streams abandoned mid-generation")
    max_tokens: int = _size(512, "max_tokens of each abandoned stream")
    read_events: int = _size(4, "events read before abandoning")
    probe_tokens: int = _size(8, "max_tokens of the latency probe")
    probes: int = _size(3, "probe requests before and after (median taken)")
    settle_s: float = _size(0.5, "pause between abandoning and probing")
    slowdown: float = _size(2.0, "flag when the probe after is this many times slower")


@dataclass(frozen=True, slots=True)
class SoakSize:
    rate: float = _size(2.0, "requests per second")
    duration_s: float = _size(30.0, "seconds of load")
    max_tokens: int = _size(32, "max_tokens of each request")


@dataclass(frozen=True, slots=True)
class StructuredSize:
    requests: int = _size(2, "prompts, each sent non-streamed, streamed slowly, non-streamed")
    max_tokens: int = _size(160, "max_tokens of each request")
    slow_read_bytes: int = _size(64, "bytes the slow reader takes per read")
    slow_read_interval_s: float = _size(0.05, "pause of the slow reader between reads")


@dataclass(frozen=True, slots=True)
class ToolsSize:
    requests: int = _size(
        2, "tool-call cases, each sent non-streamed, streamed slowly, non-streamed"
    )
    max_tokens: int = _size(160, "max_tokens of each request")
    slow_read_bytes: int = _size(64, "bytes the slow reader takes per read")
    slow_read_interval_s: float = _size(0.05, "pause of the slow reader between reads")


@dataclass(frozen=True, slots=True)
class AgentApiSize:
    """The responses and messages scenarios (one size class, two profiles each)."""

    cases: int = _size(6, "cases, in order: plain, truncated, named tool, zero-argument tool, "
                       "logprobs (Responses only), any tool")  # fmt: skip
    rounds: int = _size(1, "times the cases run, each round with other prompts")
    max_tokens: int = _size(24, "max output tokens of a text case")
    truncated_tokens: int = _size(4, "max output tokens of the truncated case")
    tool_max_tokens: int = _size(64, "max output tokens of a tool case")
    top: int = _size(2, "top_logprobs of the logprobs case")
    slow_read_bytes: int = _size(64, "bytes the slow reader takes per read")
    slow_read_interval_s: float = _size(0.02, "pause of the slow reader between reads")


@dataclass(frozen=True, slots=True)
class Sizes:
    lag: LagSize = LagSize()
    backpressure: BackpressureSize = BackpressureSize()
    logprobs: LogprobsSize = LogprobsSize()
    determinism: DeterminismSize = DeterminismSize()
    choices: ChoicesSize = ChoicesSize()
    stops: StopsSize = StopsSize()
    utf8: Utf8Size = Utf8Size()
    structured: StructuredSize = StructuredSize()
    tools: ToolsSize = ToolsSize()
    usage: UsageSize = UsageSize()
    bad_inputs: BadInputsSize = BadInputsSize()
    disconnect: DisconnectSize = DisconnectSize()
    soak: SoakSize = SoakSize()
    responses: AgentApiSize = AgentApiSize()
    messages: AgentApiSize = AgentApiSize()
    ollama: AgentApiSize = AgentApiSize()


SCENARIO_NAMES = tuple(f.name for f in fields(Sizes))

QUICK = Sizes()
FULL = Sizes(
    lag=LagSize(streams=48, max_tokens=128, long_prompts=8, long_prompt_words=3000),
    backpressure=BackpressureSize(streams=2, max_tokens=1024, n=4),
    logprobs=LogprobsSize(requests=4, top=5, max_tokens=64),
    determinism=DeterminismSize(probes=2, crowd=16, top=5, max_tokens=64),
    choices=ChoicesSize(n=3, prompts=3, max_tokens=48),
    stops=StopsSize(max_tokens=96),
    utf8=Utf8Size(requests=6, max_tokens=96),
    structured=StructuredSize(requests=3, max_tokens=256),
    tools=ToolsSize(requests=4, max_tokens=256),
    usage=UsageSize(max_tokens=16),
    bad_inputs=BadInputsSize(repeat=2),
    disconnect=DisconnectSize(streams=8, max_tokens=2048),
    soak=SoakSize(rate=4.0, duration_s=60.0, max_tokens=64),
    responses=AgentApiSize(rounds=3, max_tokens=96, truncated_tokens=8, tool_max_tokens=128, top=5),
    messages=AgentApiSize(rounds=3, max_tokens=96, truncated_tokens=8, tool_max_tokens=128),
    ollama=AgentApiSize(rounds=3, max_tokens=96, truncated_tokens=8),
)
PROFILES = {"quick": QUICK, "full": FULL}
# The scenarios each profile runs when --scenarios is not given. `structured`
# and `tools` need a server that enforces response_format and tool_choice
# "required", `ollama` one that speaks Ollama's API: asked for by name, or in full.
PROFILE_SCENARIOS = {
    "quick": tuple(
        name for name in SCENARIO_NAMES if name not in ("soak", "structured", "tools", "ollama")
    ),
    "full": SCENARIO_NAMES,
}


# How the audit decides which vLLM extensions to send: "auto" probes each one
# in preflight and sends those that work; "on" sends all, "off" none.
EXTENSION_MODES = ("auto", "on", "off")


@dataclass(frozen=True, slots=True)
class AuditOptions:
    profile: str = "quick"
    scenarios: tuple[str, ...] = PROFILE_SCENARIOS["quick"]
    sizes: Sizes = QUICK
    vllm_extensions: str = "auto"
    # Report (and fail on) sluice's own strict rules: empty chunks, SSE
    # comment lines, error objects without `param`.
    strict: bool = False
    # Seconds without a byte before a request counts as timed out.
    request_timeout_s: float = 120.0


def with_overrides(sizes: Sizes, overrides: dict[str, dict[str, Any]]) -> Sizes:
    """Sizes with some fields replaced: {"lag": {"streams": 4}}."""
    changed = {
        scenario: replace(getattr(sizes, scenario), **values)
        for scenario, values in overrides.items()
        if values
    }
    return replace(sizes, **changed)
