"""Priority scheduling (`--scheduling-policy priority`): the order in which
the scheduler serves requests, and the aging that bounds how long one waits.

Each request carries `SamplingParams.priority` (vLLM's field and meaning:
lower runs sooner, default 0). Under this policy a request's rank is

    (priority - num_steps_waited // aging_steps, arrival index)

smaller first: a request gains one level for every `aging_steps` engine steps
it spends waiting (before its admission or after a preemption; never while
it runs), and equal levels go in arrival order. Each step the scheduler
serves running requests and admits waiting ones in rank order, and a waiting
request that outranks the worst running one takes that one's seat (and, for
the head of the queue, its KV blocks) by preemption: recomputed later, its
stream is exactly what it would have been (sluice/engine/scheduler.py).

The bound against starvation: once a request of priority p has waited
`aging_steps * (p - p_min)` steps, p_min being the lowest priority any
request uses, no request arriving while it still waits is admitted before
it: such a request starts at level p_min or above and waits fewer steps, so
it never ranks higher (ties go to the earlier arrival). Its wait is then
bounded by the requests already there. (A running request does not age and
may still be preempted by one that outranks it.) With the fcfs policy (the
default) nothing here runs: arrival order, the newest preempted first.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.engine.request import Request


class PriorityOrder:
    """Ranks requests by aged priority; ages the waiting ones once per step."""

    __slots__ = ("aging_steps",)

    def __init__(self, aging_steps: int):
        assert aging_steps >= 1, f"aging_steps must be at least 1, got {aging_steps}"
        self.aging_steps = aging_steps

    def rank(self, request: Request) -> tuple[int, int]:
        """Smaller is served sooner."""
        level = request.params.priority - request.num_steps_waited // self.aging_steps
        return level, request.arrival_index

    def outranks(self, request: Request, other: Request) -> bool:
        return self.rank(request) < self.rank(other)

    def age(self, waiting: Iterable[Request]) -> None:
        """One more step waited by each of `waiting`."""
        for request in waiting:
            request.num_steps_waited += 1

    def sorted(self, requests: Iterable[Request]) -> list[Request]:
        return sorted(requests, key=self.rank)
