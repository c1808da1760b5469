"""Speculative decoding without a draft model: propose, verify, accept.

A decoding request's step normally computes one token (the one sampled last)
and samples the next. With speculation, the scheduler asks the request's
n-gram index (`ngram_proposer.py`) for up to k tokens, and the step computes
the 1 + k tokens `[last, d_0 .. d_k-1]` in one forward pass. The runner
samples at each of the 1 + k positions from a sampling row that sees the
output as if the draft's first j tokens had been generated (runner.py): the same penalties, min_tokens, logit_bias, grammar
mask and per-step seed as a step without speculation at that point.
`accepted_tokens` keeps the drafted tokens as long as each equals the token
sampled before it, then the first sampled token that differs (or the bonus
token after a fully accepted draft).

Why the output is exact: each kept token is exactly the token the request
would have sampled at that position without speculation, from the same
logits and the same randomness. The same logits: the engine speculates only
where a row's bits ignore how many rows share its step (the row-invariant
scheme, --batch-invariant; engine/startup.py `speculation_blocker`), and a
verified token attends as a decode row (models/attention.py); elsewhere a
verification's 1 + k rows would take other kernels than a decode's one. Greedy: the longest prefix where the argmax equals
the draft, plus one. Sampled: with the draft as a point mass q = delta(t),
standard rejection sampling accepts t with probability min(1, p(t)/q(t)) =
p(t), else draws from the residual norm(max(p - q, 0)) = p without t. Drawing
x ~ p and keeping t when x == t does exactly that (x == t with probability
p(t); otherwise x is p conditioned on x != t), and a seeded request draws the
same x as without speculation, so seeded runs reproduce token for token.

The scheduler rolls `num_computed_tokens` back to the kept positions and
frees the blocks that held only rejected ones (`KVCacheManager.free_tail`);
a block is named for the prefix cache only once computed positions fill it,
so a rejected token never names one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.config import SpeculativeConfig
from sluice.engine.indent_tokens import IndentTokens
from sluice.engine.ngram_proposer import NgramIndex
from sluice.engine.sampled import SampledToken

if TYPE_CHECKING:
    from sluice.engine.request import Request
    from sluice.structured.matcher import GrammarMatcher


@dataclass(slots=True)
class SpeculationCounters:
    """Since the engine started (vLLM's vllm:spec_decode_* counters)."""

    # Steps in which a request verified a non-empty draft.
    num_drafts: int = 0
    num_draft_tokens: int = 0
    # Drafted tokens equal to the token sampled at their position.
    num_accepted_tokens: int = 0
    # [i]: drafts whose token i was accepted.
    num_accepted_per_position: list[int] = field(default_factory=list)

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        per_position = self.num_accepted_per_position
        per_position.extend([0] * (num_draft_tokens - len(per_position)))
        for position in range(num_accepted):
            per_position[position] += 1


# A request's first draft is at most this long; each fully accepted draft
# doubles the next (up to num_speculative_tokens), a rejected token halves
# it (`next_draft_length`).
FIRST_DRAFT_LENGTH = 4
# Speculation pays in a step of B running requests when verifying k drafted
# tokens each costs at most what 40% of them accepted would save: the
# measured int8 matmul time at B * (1 + k) rows at most 1 + k * this times
# its time at B rows (`pays_off`). Served on the AMX machine (short chat
# streams, about 40% of drafts accepted): +10% at 4 streams, even at 8,
# -8 to -12% at 16; 0.5 had let 16 speculate.
BREAK_EVEN_ACCEPTANCE = 0.4
# A request drafts only while the running share of its drafted tokens that
# were accepted (`Request.draft_acceptance`, each draft weighing
# ACCEPTANCE_WEIGHT) pays for the rows they add: in a step of B requests an
# accepted token saves a B-th of the step, a drafted row costs what the
# engine measured rows to cost in such steps (`StepCosts`). A request whose
# drafts keep missing (1-gram matches in free text) stops adding rows, most
# of all to large steps, where a token saves least. While it does not draft,
# its share creeps back up by RECOVERY a step, so it tries again later.
ACCEPTANCE_WEIGHT = 0.25
RECOVERY = 0.02
# Weight of each new measurement in StepCosts' running averages.
COST_WEIGHT = 0.1
# Below this variance of drafted rows per step the line is not fitted.
MIN_DRAFT_VARIANCE = 0.5
# A drafted row must pay for itself this many times over: the averages are
# noisy, and a closed loop of streams also waits on the server's other work.
COST_MARGIN = 1.5


class StepCosts:
    """What the engine's own decode steps took (seconds, from its clock): per
    number of requests B, a line through (drafted rows, seconds) of its recent
    steps, fitted by least squares with older steps weighing less: its
    intercept is a step of B decodes, its slope what each drafted row adds
    (in a busy engine nearly every step has some draft, so the two are never
    seen apart). One per engine, on its loop; fed by `observe`."""

    def __init__(self) -> None:
        # B -> running means of (drafted, seconds, drafted^2, drafted * seconds).
        self._moments: dict[int, list[float]] = {}

    def observe(self, num_requests: int, num_drafted: int, seconds: float) -> None:
        """A step of `num_requests` decodes (one token each, plus their drafts:
        `SchedulerPlan.decode_rows`) that drafted `num_drafted` rows in all."""
        sample = (num_drafted, seconds, num_drafted * num_drafted, num_drafted * seconds)
        moments = self._moments.get(num_requests)
        if moments is None:
            self._moments[num_requests] = list(sample)
            return
        for i, value in enumerate(sample):
            moments[i] += COST_WEIGHT * (value - moments[i])

    def line(self, num_requests: int) -> tuple[float, float] | None:
        """(seconds of a step of B decodes, seconds each drafted row adds), or
        None while the recent steps' drafts did not vary enough to tell."""
        moments = self._moments.get(num_requests)
        if moments is None:
            return None
        drafted, seconds, drafted_sq, product = moments
        variance = drafted_sq - drafted * drafted
        if variance < MIN_DRAFT_VARIANCE:
            return None
        per_row = max((product - drafted * seconds) / variance, 0.0)
        return seconds - per_row * drafted, per_row

    def required_acceptance(self, num_requests: int) -> float:
        """The share of drafted tokens that must be accepted for drafting to pay
        in a step of `num_requests` decodes: a drafted row's cost over the time
        one token takes (times COST_MARGIN); 0 until measured (drafting is how
        a row's cost gets measured)."""
        line = self.line(num_requests)
        if line is None or line[0] <= 0:
            return 0.0
        base, per_row = line
        return min(1.0, COST_MARGIN * per_row * num_requests / base)


class Speculator:
    """The engine's proposer (one per engine, on the engine loop) and its counters.

    Which steps speculate: with `disable_by_batch_size` set, those with at
    most that many running requests (vLLM's rule); otherwise those where
    the step times measured at load (`step_seconds`, the kernel plan's
    (rows, seconds) of one int8 matmul) say verification pays (`pays_off`);
    every step where nothing was measured. Which requests draft in such a
    step: those whose drafts are accepted often enough to pay for their rows
    at the price the engine's own steps measured (`StepCosts`). `indents`:
    the vocabulary's indentation tokens, which the lookups match whatever
    their width (`ngram_proposer.py`); None: tokens are matched as they are."""

    def __init__(
        self,
        config: SpeculativeConfig,
        step_seconds: tuple[tuple[int, float], ...] = (),
        indents: IndentTokens | None = None,
    ) -> None:
        self.config = config
        self.indents = indents
        self.counters = SpeculationCounters()
        self._step_seconds = step_seconds
        self._pays_off: dict[int, bool] = {}
        self.costs = StepCosts()

    def is_on_for(self, num_running: int) -> bool:
        limit = self.config.disable_by_batch_size
        if limit is not None:
            return num_running <= limit
        if not self._step_seconds:
            return True
        pays = self._pays_off.get(num_running)
        if pays is None:
            k = self.config.num_speculative_tokens
            pays = self._pays_off[num_running] = pays_off(self._step_seconds, num_running, k)
        return pays

    def propose(self, request: Request, max_num_tokens: int, num_running: int = 1) -> list[int]:
        """Up to `max_num_tokens` (and the request's draft length) tokens to verify,
        cut before the first one its grammar refuses; [] if none, or while the
        request's drafts are accepted too rarely to pay in a step of
        `num_running` requests."""
        if request.draft_acceptance < self.costs.required_acceptance(num_running):
            request.draft_acceptance = min(1.0, request.draft_acceptance + RECOVERY)
            return []
        index = request.ngram_index
        if index is None:
            config = self.config
            index = NgramIndex(config.prompt_lookup_min, config.prompt_lookup_max, self.indents)
            request.ngram_index = index
        longest = self.config.num_speculative_tokens
        length = request.draft_length or min(FIRST_DRAFT_LENGTH, longest)
        draft = index.propose(request.all_token_ids, min(length, longest, max_num_tokens))
        if draft and request.grammar is not None:
            draft = _allowed_prefix(request.grammar, draft)
        return draft

    def record(self, request: Request, num_draft_tokens: int, num_accepted: int) -> None:
        self.counters.record(num_draft_tokens, num_accepted)
        share = num_accepted / num_draft_tokens
        request.draft_acceptance += ACCEPTANCE_WEIGHT * (share - request.draft_acceptance)
        request.draft_length = next_draft_length(
            num_draft_tokens, num_accepted, self.config.num_speculative_tokens
        )


def next_draft_length(num_drafted: int, num_accepted: int, longest: int) -> int:
    """The next draft's length: twice this one after a full acceptance (the
    text is being copied: verify more at once), else half of it, or one more
    than was accepted if that is longer (a copy resumes after an edit; a text
    that stopped copying soon drafts little); within 1 .. longest."""
    if num_accepted >= num_drafted:
        return min(2 * num_drafted, longest)
    return max(1, min(max(num_accepted + 1, num_drafted // 2), longest))


def pays_off(step_seconds: tuple[tuple[int, float], ...], batch: int, k: int) -> bool:
    """Whether a step of `batch` decodes verifying k tokens each costs at most
    1 + k * BREAK_EVEN_ACCEPTANCE times the step without drafts."""
    cost = seconds_at(step_seconds, batch * (1 + k)) / seconds_at(step_seconds, batch)
    return cost <= 1 + k * BREAK_EVEN_ACCEPTANCE


def seconds_at(points: tuple[tuple[int, float], ...], rows: int) -> float:
    """The measured time at `rows`: linear between measured row counts, the
    first below them, proportional to rows beyond the last (compute-bound)."""
    first_rows, first_seconds = points[0]
    if rows <= first_rows:
        return first_seconds
    for (n0, t0), (n1, t1) in itertools.pairwise(points):
        if rows <= n1:
            return t0 + (t1 - t0) * (rows - n0) / (n1 - n0)
    last_rows, last_seconds = points[-1]
    return last_seconds * rows / last_rows


def speculation_stats(speculator: Speculator | None) -> dict[str, object]:
    """The EngineStatsSnapshot fields of speculation ({} when it is off)."""
    if speculator is None:
        return {}
    counters = speculator.counters
    return {
        "spec_decode_num_drafts": counters.num_drafts,
        "spec_decode_num_draft_tokens": counters.num_draft_tokens,
        "spec_decode_num_accepted_tokens": counters.num_accepted_tokens,
        "spec_decode_num_accepted_tokens_per_pos": tuple(counters.num_accepted_per_position),
    }


def _allowed_prefix(grammar: GrammarMatcher, draft: list[int]) -> list[int]:
    """The draft's longest prefix the grammar takes (none after it terminates)."""
    if grammar.is_terminated:
        return []
    return draft[: grammar.matcher.validate_tokens(draft)]


def accepted_tokens(draft: list[int], sampled: list[SampledToken]) -> list[SampledToken]:
    """sampled[j]: the token sampled after the draft's first j tokens (1 + k
    of them). The kept tokens: the draft while it matches, then one more."""
    assert len(sampled) == len(draft) + 1, f"{len(sampled)} samples for {len(draft)} drafted"
    for position, token_id in enumerate(draft):
        if sampled[position].token_id != token_id:
            return sampled[: position + 1]
    return sampled
