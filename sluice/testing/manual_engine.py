"""An `EngineClient` whose steps the test delivers by hand.

`ManualEngine` keeps every request's sink and lets the test decide exactly
what reaches it and when: `deliver(request_id, token_ids)` calls the sink now,
synchronously, so several steps (or a step and an engine death) can land in
one pass of the event loop, as they do when the ZMQ reader drains its queue
or several in-process callbacks run before any woken task.

It keeps the client-side promises of `sluice.engine.client_base`: nothing
reaches a sink after its finish or its error; `abort` is recorded and, like a
real engine at its next step, ends the request with an "abort" delta when
the test calls `step_aborts()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sluice.engine.client_base import DeltaSink, QueueTimeout
from sluice.engine.outputs import FinishReason, RequestDelta
from sluice.engine.sampling_params import SamplingParams
from sluice.engine.sink_router import deliver_delta
from sluice.errors import EngineDeadError
from sluice.testing.fake_engine import FakeEngineBase, token_logprobs


class ManualEngine(FakeEngineBase):
    def __init__(self, *, max_model_len: int = 4096):
        self._max_model_len = max_model_len
        self._is_alive = True
        # request id -> (sink, params, prompt length, tokens delivered so far)
        self._sinks: dict[str, DeltaSink] = {}
        self._params: dict[str, SamplingParams] = {}
        self._num_prompt_tokens: dict[str, int] = {}
        self._num_delivered: dict[str, int] = {}
        self.added_request_ids: list[str] = []
        self.aborted_request_ids: list[str] = []
        # Set whenever a request is added (a test awaits it, no sleeping).
        self.request_added = asyncio.Event()

    # -- EngineClient ---------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sink: DeltaSink,
        *,
        queue_timeout: QueueTimeout | None = None,
    ) -> None:
        if not self._is_alive:
            raise EngineDeadError("the manual engine is dead")
        self._sinks[request_id] = sink
        self._params[request_id] = params
        self._num_prompt_tokens[request_id] = len(prompt_token_ids)
        self._num_delivered[request_id] = 0
        self.added_request_ids.append(request_id)
        self.request_added.set()

    def abort(self, request_ids: list[str]) -> None:
        self.aborted_request_ids.extend(request_ids)

    @property
    def num_running(self) -> int:
        return len(self._sinks)

    async def shutdown(self) -> None:
        self.die("the manual engine was shut down")

    # -- what the test drives ----------------------------------------------------

    @property
    def open_request_ids(self) -> list[str]:
        return list(self._sinks)

    def deliver(
        self,
        request_id: str,
        token_ids: Sequence[int],
        finish_reason: FinishReason | None = None,
        stop_token_id: int | None = None,
    ) -> None:
        """One engine step of `request_id`, handed to its sink now."""
        sink = self._sinks[request_id]
        params = self._params[request_id]
        start = self._num_delivered[request_id]
        self._num_delivered[request_id] += len(token_ids)
        logprobs = None
        if params.logprobs is not None:
            logprobs = token_logprobs(start, token_ids, params.logprobs)
        if finish_reason is not None:
            del self._sinks[request_id]
        delta = RequestDelta(
            request_id=request_id,
            new_token_ids=tuple(token_ids),
            logprobs=logprobs,
            finish_reason=finish_reason,
            stop_token_id=stop_token_id,
            num_prompt_tokens=self._num_prompt_tokens[request_id],
        )
        if not deliver_delta(sink, delta):
            self._sinks.pop(request_id, None)

    def step_aborts(self) -> None:
        """End every aborted request still open with an "abort" delta."""
        for request_id in dict.fromkeys(self.aborted_request_ids):
            if request_id in self._sinks:
                self.deliver(request_id, [], "abort")

    def die(self, message: str = "the manual engine died") -> None:
        """Every open sink gets EngineDeadError; new requests are refused."""
        self._is_alive = False
        sinks, self._sinks = self._sinks, {}
        for sink in sinks.values():
            sink.on_error(EngineDeadError(message))
