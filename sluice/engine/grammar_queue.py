"""Requests waiting for their grammar: the engine loop's side of compiling off it.

A structured request whose grammar is still compiling (on the grammar worker
thread, `sluice.structured.grammar_cache`) waits here, outside the scheduler:
it has no arrival index yet, holds no blocks and is in no step, while every
other request keeps stepping. `take_done` hands back, in the order they came,
those whose grammar is done (compiled or refused); the engine core gives each
its matcher and queues it in the scheduler, or reports its error.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING

from sluice.engine.request import Request

if TYPE_CHECKING:
    from sluice.structured.matcher import CompiledGrammar


class GrammarQueue:
    def __init__(self) -> None:
        # By request id, in the order they came.
        self._waiting: dict[str, tuple[Request, Future[CompiledGrammar]]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._waiting

    def add(self, request: Request, grammar: Future[CompiledGrammar]) -> None:
        assert request.request_id not in self._waiting, f"{request.request_id} already waits"
        self._waiting[request.request_id] = (request, grammar)

    def take_done(self, timeout_s: float) -> list[tuple[Request, Future[CompiledGrammar]]]:
        """The requests whose grammar is done, in the order they came; when none
        is, first wait up to `timeout_s` for one."""
        futures = {future for _, future in self._waiting.values()}
        if timeout_s > 0 and futures and not any(future.done() for future in futures):
            wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)
        done = [(request, future) for request, future in self._waiting.values() if future.done()]
        for request, _ in done:
            del self._waiting[request.request_id]
        return done

    def remove(self, request_ids: Iterable[str]) -> list[Request]:
        """Take these requests out (unknown ids are ignored); their compile
        goes on, for whoever asks for the same spec next."""
        return [
            self._waiting.pop(request_id)[0]
            for request_id in request_ids
            if request_id in self._waiting
        ]
