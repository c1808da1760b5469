"""The thinking budget: the end of a request's reasoning forced at a token count.

A request with `SamplingParams.thinking_budget` reasons for at most
`max_tokens` tokens: when that many tokens followed the reasoning's opening
marker (or the output's start, when the prompt opened the reasoning) and its
end marker (`</think>`) has not appeared among them, the next tokens are the
end marker's, one per step, whatever the logits say (llama.cpp's
`--reasoning-budget`, SGLang's thinking budget). The frontend's reasoning
split then reads the forced marker as any other end of reasoning.

Invariants: the forced token is a function of the row's own output tokens
only (`forced_token`), so it does not depend on the batch, survives
preemption (recomputed from the same tokens), and a speculative verification
row, which sees the output as if the draft's first j tokens were sampled,
forces exactly what a step without speculation would: a draft that runs past
the budget is rejected at the first position whose forced token differs.
The scan for a natural end runs only during the few steps that may force
(`len(end_token_ids)` of them), never on every step.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.engine.sampling_params import ThinkingBudget


def forced_token(budget: ThinkingBudget, output_token_ids: Sequence[int]) -> int | None:
    """The token the row must take next, or None when it samples freely."""
    num_start = len(budget.start_token_ids)
    if num_start and tuple(output_token_ids[:num_start]) != budget.start_token_ids:
        return None  # not (yet) opened by the marker: no reasoning to cut
    limit = num_start + budget.max_tokens
    end = budget.end_token_ids
    num_forced = len(output_token_ids) - limit
    if not 0 <= num_forced < len(end):
        return None  # within the budget, or past the end marker already
    if end[0] in output_token_ids[num_start:limit]:
        return None  # the reasoning ended by itself within the budget
    return end[num_forced]


def forced_tokens(
    budgets: Sequence[ThinkingBudget | None], outputs: Sequence[Sequence[int]]
) -> list[int | None] | None:
    """Each row's forced token; None when no row is forced (the common step)."""
    forced = [
        None if budget is None else forced_token(budget, output)
        for budget, output in zip(budgets, outputs, strict=True)
    ]
    return forced if any(token is not None for token in forced) else None
