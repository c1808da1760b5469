"""An `EngineClient` whose steps the test delivers by hand.

`ManualEngine` keeps every request's sink and lets the test decide exactly
what reaches it and when: `deliver(request_id, token_ids)` hands one step to
the sink now, synchronously, so several steps (or a step and an engine
death) can land in one pass of the event loop, as they do when the ZMQ
reader drains its queue or several in-process callbacks run before any
woken task.

Its client side is the real clients' own (`RoutedEngineClient`), so it keeps
their promises (`sluice.engine.client_base`): nothing reaches a sink after
its finish, its error or its `abort`; a delivery to such a request is
dropped, as a real engine's late step would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sluice.engine.engine_request import EngineRequest
from sluice.engine.outputs import FinishReason, RequestDelta
from sluice.engine.sampling_params import SamplingParams
from sluice.testing.fake_engine import FakeEngineBase, generation_of, token_logprobs


class ManualEngine(FakeEngineBase):
    def __init__(self, *, max_model_len: int = 4096):
        super().__init__()
        self._max_model_len = max_model_len
        # request id -> its params, prompt length and tokens delivered so far.
        self._params: dict[str, SamplingParams] = {}
        self._num_prompt_tokens: dict[str, int] = {}
        self._num_delivered: dict[str, int] = {}
        # Set whenever a request is added (a test awaits it, no sleeping).
        self.request_added = asyncio.Event()

    def _add(self, request: EngineRequest) -> None:
        request_id, (prompt_token_ids, params) = request.request_id, generation_of(request)
        self._params[request_id] = params
        self._num_prompt_tokens[request_id] = len(prompt_token_ids)
        self._num_delivered[request_id] = 0
        self.request_added.set()

    # -- what the test drives ----------------------------------------------------

    @property
    def open_request_ids(self) -> list[str]:
        return [i for i in dict.fromkeys(self.added_request_ids) if i in self._router]

    def deliver(
        self,
        request_id: str,
        token_ids: Sequence[int],
        finish_reason: FinishReason | None = None,
        stop_token_id: int | None = None,
    ) -> None:
        """One engine step of `request_id`, handed to its sink now."""
        params = self._params[request_id]
        start = self._num_delivered[request_id]
        self._num_delivered[request_id] += len(token_ids)
        logprobs = None
        if params.logprobs is not None:
            logprobs = token_logprobs(start, token_ids, params.logprobs)
        delta = RequestDelta(
            request_id=request_id,
            new_token_ids=tuple(token_ids),
            logprobs=logprobs,
            finish_reason=finish_reason,
            stop_token_id=stop_token_id,
            num_prompt_tokens=self._num_prompt_tokens[request_id],
        )
        self._on_step([delta], [], self.stats())
