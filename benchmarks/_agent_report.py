"""The replay's tables and plot, from what _agent_replay_run.py measured.

Per server, one row per replayed request (`turn.index`): its prompt tokens,
and for each phase its TTFT with the tokens the server reported cached;
beside the cold and warm TTFTs, the prefill probe of that phase's new tokens
and the ratio TTFT / probe (issue 44's goal: at most 1.2 on a warm turn), and
beside the restart TTFT its ratio to the warm one (goal: at most 1.5 on the
first turn). Cold turns after the first are warm in the agent's sense: the
turns before them are what is cached. Then one side-by-side table of every
server's TTFT per request and phase, with on how many requests sluice is
ahead of every peer (the issue's third goal), and an SVG of the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from _agent_replay_run import PHASES, Measured

from sluice.audit.svg import PALETTE, Series, line_chart

WARM_GOAL = 1.2
RESTART_GOAL = 1.5


@dataclass(slots=True)
class ServerResult:
    """One server's replay of one recording."""

    name: str
    measured: list[Measured]  # every phase and probe
    skipped: str | None = None  # why it was not measured
    note: str | None = None  # what the reader should know about a phase (server_table shows it)

    def phase(self, phase: str) -> dict[tuple[int, int], Measured]:
        return {(m.turn, m.index): m for m in self.measured if m.phase == phase}


def _ttft(item: Measured | None) -> float | None:
    return None if item is None else item.facts.first_content_s


def _ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or bottom is None or bottom <= 0:
        return None
    return top / bottom


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _timed(item: Measured | None) -> str:
    if item is None:
        return "-"
    if item.facts.error:
        return "error"
    cached = item.facts.num_cached_tokens
    return f"{_s(item.facts.first_content_s)} ({'-' if cached is None else cached})"


def request_keys(result: ServerResult) -> list[tuple[int, int]]:
    return sorted({(m.turn, m.index) for m in result.measured if m.phase in PHASES})


def server_table(result: ServerResult) -> str:
    """The markdown table of one server (see the module doc)."""
    if result.skipped:
        return f"**{result.name}**: not measured ({result.skipped})\n"
    cold, warm, restart = (result.phase(p) for p in PHASES)
    probe_cold, probe_warm = result.phase("prefill:cold"), result.phase("prefill:warm")
    lines = [
        f"**{result.name}** (TTFT in s, cached tokens in brackets)\n",
        "| turn | prompt tokens | cold | new-token prefill | cold / prefill | warm "
        "| new-token prefill | warm / prefill | restart | restart / warm |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in request_keys(result):
        prompt = next((p[key].facts.num_prompt_tokens for p in (cold, warm, restart)
                       if key in p and p[key].facts.num_prompt_tokens is not None), None)  # fmt: skip
        c, w, r = cold.get(key), warm.get(key), restart.get(key)
        pc, pw = _ttft(probe_cold.get(key)), _ttft(probe_warm.get(key))
        lines.append(
            f"| {key[0]}.{key[1]} | {'-' if prompt is None else prompt} | {_timed(c)} | {_s(pc)} "
            f"| {_x(_ratio(_ttft(c), pc))} | {_timed(w)} | {_s(pw)} | {_x(_ratio(_ttft(w), pw))} "
            f"| {_timed(r)} | {_x(_ratio(_ttft(r), _ttft(w)))} |"
        )
    lines += ["", goals_line(result)] + ([f"Note: {result.note}"] if result.note else [])
    return "\n".join(lines) + "\n"


def goals_line(result: ServerResult) -> str:
    """The issue's two checks over this server's rows."""
    cold, warm, restart = (result.phase(p) for p in PHASES)
    probe_cold, probe_warm = result.phase("prefill:cold"), result.phase("prefill:warm")
    in_session = [_ratio(_ttft(cold[k]), _ttft(probe_cold.get(k))) for k in cold if k[0] > 1]
    repeated = [_ratio(_ttft(warm[k]), _ttft(probe_warm.get(k))) for k in warm]
    first = min(restart, default=None)
    after_restart = _ratio(_ttft(restart.get(first)), _ttft(warm.get(first))) if first else None
    worst_session = max((r for r in in_session if r is not None), default=None)
    worst_repeat = max((r for r in repeated if r is not None), default=None)
    return (
        f"Goals: worst TTFT / new-token prefill on turns 2+ of the cold session {_x(worst_session)}"
        f", on the repeated (warm) session {_x(worst_repeat)} (goal <= {WARM_GOAL}x); "
        f"first request after the restart / warm {_x(after_restart)} (goal <= {RESTART_GOAL}x)."
    )


def side_by_side(results: list[ServerResult]) -> str:
    """Every measured server's TTFT (s) per request and phase, in one table."""
    shown = [r for r in results if not r.skipped]
    if not shown:
        return ""
    heads = [f"{r.name} {p}" for r in shown for p in PHASES]
    lines = ["| turn | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    keys = sorted({k for r in shown for k in request_keys(r)})
    for key in keys:
        cells = [_s(_ttft(r.phase(p).get(key))) for r in shown for p in PHASES]
        lines.append(f"| {key[0]}.{key[1]} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", ahead_line(results)]) + "\n"


def ahead_line(results: list[ServerResult]) -> str:
    """Issue 44's third goal: per phase, on how many requests the faster sluice
    variant's TTFT is below every measured peer's."""
    ours = [r for r in results if not r.skipped and r.name.startswith("sluice")]
    peers = [r for r in results if not r.skipped and not r.name.startswith("sluice")]
    if not ours or not peers:
        return "Ahead of the peers: no peer measured."
    counts = []
    for phase in PHASES:
        keys = sorted({k for r in ours + peers for k in r.phase(phase)})
        wins = 0
        for key in keys:
            best_ours = _fastest(r.phase(phase).get(key) for r in ours)
            best_peer = _fastest(r.phase(phase).get(key) for r in peers)
            wins += best_ours is not None and (best_peer is None or best_ours < best_peer)
        counts.append(f"{wins} of {len(keys)} {phase}")
    return "Ahead of every peer (goal: all): " + ", ".join(counts) + "."


def _fastest(items) -> float | None:
    times = [t for t in (_ttft(item) for item in items) if t is not None]
    return min(times, default=None)


def plot_svg(title: str, results: list[ServerResult]) -> str:
    """TTFT per replayed request (x: its order in the session), one line per server and phase."""
    series, colors = [], iter(PALETTE * 4)
    for result in results:
        if result.skipped:
            continue
        keys = request_keys(result)
        for phase in PHASES:
            points = [(n, _ttft(result.phase(phase).get(k))) for n, k in enumerate(keys, 1)]
            kept = [(x, y) for x, y in points if y is not None]
            series.append(Series(f"{result.name} {phase}", [float(x) for x, _ in kept],
                                 [y for _, y in kept], next(colors)))  # fmt: skip
    return line_chart(title, series, "request of the session (in order)", "TTFT (s)")
