"""A scripted `EngineClient` on the event loop: the engine contract without a model.

For tests and benchmarks of everything above the engine (frontend, HTTP edge,
load tools). Its client side is the real clients' own (`RoutedEngineClient`),
so it keeps the guarantees of `sluice.engine.client_base` as they do:
- one loop callback per step delivers the deltas of every running request;
- every delta reaches its sink once, in order; nothing follows a finish or
  `on_error`, nor an `abort` (the engine ends the request at its next step,
  with a final "abort" delta nobody hears); `die()` sends
  `on_error(EngineDeadError)` to every open sink and refuses new requests
  until `revive()`.

What a request generates comes from a `TokenScript`: a function of (request
id, prompt ids, params) returning the token ids the "model" would produce (an
iterable, possibly endless; `parrot` repeats the prompt). The engine applies
the params like a real one: it stops with "length" at max_tokens (or the
context end), with "stop" at EOS (unless ignore_eos) or a stop_token_id once
min_tokens were generated, and with "stop" (no stop token) when the script
runs out. With `finish_probability` p, each token after min_tokens ends the
request with probability p, as EOS when an `eos_token_id` is set.

Randomness is seeded: the finish of a request depends only on (seed, request
id), the tokens per step only on the engine's seed, so two engines with the
same seed produce the same tokens for the same request ids.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import cycle

from sluice.engine.engine_request import EngineRequest, Generation
from sluice.engine.messages import (
    AbortRequests,
    AddRequest,
    EngineInput,
    EngineStatsSnapshot,
    ResetPrefixCache,
)
from sluice.engine.outputs import FinishReason, PromptLogprobs, RequestDelta, TokenLogprobs
from sluice.engine.routed_client import RoutedEngineClient
from sluice.engine.sampling_params import SamplingParams

TokenScript = Callable[[str, tuple[int, ...], SamplingParams], Iterable[int]]
# (position in the output, token id, k) -> (logprob, top k ids, their logprobs).
LogprobsFn = Callable[[int, int, int], tuple[float, tuple[int, ...], tuple[float, ...]]]


def generation_of(request: EngineRequest) -> tuple[tuple[int, ...], SamplingParams]:
    """The prompt and params of a generation request (the fakes generate)."""
    payload = request.payload
    assert isinstance(payload, Generation), "the fake engines serve no pooling model"
    return payload.prompt_token_ids, payload.params


def parrot(
    request_id: str, prompt_token_ids: tuple[int, ...], params: SamplingParams
) -> Iterator[int]:
    """The default script: repeat the prompt forever."""
    return cycle(prompt_token_ids)


def fake_logprobs(
    position: int, token_id: int, k: int
) -> tuple[float, tuple[int, ...], tuple[float, ...]]:
    """Deterministic logprobs, distinct at every position (so order and alignment
    can be checked); the alternatives are ids 0..k except the sampled one."""
    logprob = -(1 + position) / 64
    alternatives = tuple(i for i in range(k + 1) if i != token_id)[:k]
    return logprob, alternatives, tuple(logprob - 1.0 - j for j in range(len(alternatives)))


def token_logprobs(
    start: int, token_ids: Sequence[int], k: int, logprobs_fn: LogprobsFn = fake_logprobs
) -> TokenLogprobs:
    """The logprob entries of `token_ids`, the first at output position `start`."""
    entries = [logprobs_fn(start + i, token_id, k) for i, token_id in enumerate(token_ids)]
    return TokenLogprobs(
        logprobs=tuple(e[0] for e in entries),
        top_token_ids=tuple(e[1] for e in entries),
        top_logprobs=tuple(e[2] for e in entries),
    )


@dataclass(slots=True)
class _FakeRequest:
    request_id: str
    tokens: Iterator[int]
    params: SamplingParams
    num_prompt_tokens: int
    # The most tokens it may generate: max_tokens, or up to the context end.
    limit: int
    # Finish draws for this request only: reproducible whatever else runs.
    rng: random.Random
    num_generated: int = 0
    is_aborted: bool = False
    num_prefill_steps_left: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    prompt: tuple[int, ...] = ()


class FakeEngineBase(RoutedEngineClient):
    """What the test engines share: the client side of the real ones
    (`RoutedEngineClient`: sinks in a router, abort silences a sink at once),
    the inputs they were sent, recorded, and engine stats (open requests count
    as running). A subclass plays the engine: `_add` and `_abort`."""

    def __init__(self) -> None:
        super().__init__()
        self._is_alive = True
        # Records for tests: every request added, every abort sent to the engine
        # (of requests still open), how often the prefix cache was reset.
        self.added_request_ids: list[str] = []
        self.aborted_request_ids: list[str] = []
        self.num_prefix_cache_resets = 0

    @abc.abstractmethod
    def _add(self, request: EngineRequest) -> None:
        """The engine's side of add_request (the sink is registered already)."""

    def _abort(self, request_ids: list[str]) -> None:
        """The engine's side of abort (the sinks are unregistered already)."""

    def _send(self, message: EngineInput) -> None:
        if isinstance(message, AddRequest):
            self.added_request_ids.append(message.request.request_id)
            self._add(message.request)
        elif isinstance(message, AbortRequests):
            self.aborted_request_ids.extend(message.request_ids)
            self._abort(message.request_ids)
        elif isinstance(message, ResetPrefixCache):
            self.num_prefix_cache_resets += 1

    @property
    def num_running(self) -> int:
        return self.num_open_requests

    def stats(self) -> EngineStatsSnapshot:
        return EngineStatsSnapshot(num_running=self.num_running)

    async def start(self) -> None:
        self._is_alive = True

    async def shutdown(self) -> None:
        self.die("the engine was shut down")

    # -- test controls ----------------------------------------------------------

    def die(self, message: str = "the engine died") -> None:
        """Fail every open request with EngineDeadError; refuse new ones."""
        self._mark_dead(message)

    def revive(self) -> None:
        self._is_alive = True


class FakeEngine(FakeEngineBase):
    def __init__(
        self,
        script: TokenScript = parrot,
        *,
        tokens_per_step: int | tuple[int, int] = 1,
        step_interval_s: float = 0.0,
        finish_probability: float = 0.0,
        eos_token_id: int | None = None,
        prefill_steps: int = 0,
        max_model_len: int = 4096,
        seed: int = 0,
        logprobs_fn: LogprobsFn = fake_logprobs,
    ):
        low = tokens_per_step if isinstance(tokens_per_step, int) else min(tokens_per_step)
        if low < 1:
            raise ValueError("tokens_per_step must be at least 1")
        super().__init__()
        self._script = script
        # Tokens each request gains per step: fixed, or uniform in [low, high].
        self._tokens_per_step = tokens_per_step
        # 0: the next step runs on the next loop iteration (as fast as asked).
        self._step_interval_s = step_interval_s
        self._finish_probability = finish_probability
        self._eos_token_id = eos_token_id
        # Steps a new request spends "in prefill", producing no delta.
        self._prefill_steps = prefill_steps
        self._max_model_len = max_model_len
        self._seed = seed
        self._rng = random.Random(seed)
        self._logprobs_fn = logprobs_fn
        self._requests: dict[str, _FakeRequest] = {}
        self._step_handle: asyncio.Handle | None = None
        # Records for tests.
        self.num_steps = 0
        # request id -> every token id it generated (aborted ones included).
        self.outputs: dict[str, list[int]] = {}

    # -- the engine's side ------------------------------------------------------

    def _add(self, request: EngineRequest) -> None:
        request_id, (prompt, params) = request.request_id, generation_of(request)
        fake = _FakeRequest(
            request_id=request_id,
            tokens=iter(self._script(request_id, prompt, params)),
            params=params,
            num_prompt_tokens=len(prompt),
            limit=min(params.max_tokens, self._max_model_len - len(prompt)),
            rng=random.Random(f"{self._seed}:{request_id}"),
            num_prefill_steps_left=self._prefill_steps,
            prompt=prompt,
        )
        self._requests[request_id] = fake
        self.outputs[request_id] = fake.output_token_ids
        self._schedule_step()

    def _abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            request = self._requests.get(request_id)
            if request is not None:
                request.is_aborted = True
        self._schedule_step()

    @property
    def num_running(self) -> int:
        return len(self._requests)  # an aborted one until the step that ends it

    def _mark_dead(self, message: str) -> None:
        if self._step_handle is not None:
            self._step_handle.cancel()
            self._step_handle = None
        self._requests = {}
        super()._mark_dead(message)

    # -- stepping ---------------------------------------------------------------

    def _schedule_step(self) -> None:
        if self._step_handle is not None or not self._requests or not self._is_alive:
            return
        loop = asyncio.get_running_loop()
        if self._step_interval_s > 0:
            self._step_handle = loop.call_later(self._step_interval_s, self._step)
        else:
            self._step_handle = loop.call_soon(self._step)

    def _step(self) -> None:
        """One engine step: advance every request, then deliver all deltas."""
        self._step_handle = None
        self.num_steps += 1
        deltas: list[RequestDelta] = []
        for request in list(self._requests.values()):
            delta = self._advance(request)
            if delta is None:
                continue
            if delta.is_finished:
                del self._requests[request.request_id]
            deltas.append(delta)
        self._on_step(deltas, [], self.stats())
        self._schedule_step()

    def _advance(self, request: _FakeRequest) -> RequestDelta | None:
        if request.is_aborted:
            return self._delta(request, [], "abort", None)
        if request.num_prefill_steps_left > 0:
            request.num_prefill_steps_left -= 1
            return None
        new_token_ids: list[int] = []
        num_tokens = self._tokens_per_step
        if not isinstance(num_tokens, int):
            num_tokens = self._rng.randint(*num_tokens)
        for _ in range(num_tokens):
            finish = self._generate_one(request, new_token_ids)
            if finish is not None:
                return self._delta(request, new_token_ids, *finish)
        if not new_token_ids:
            return None
        return self._delta(request, new_token_ids, None, None)

    def _generate_one(
        self, request: _FakeRequest, new_token_ids: list[int]
    ) -> tuple[FinishReason, int | None] | None:
        """Generate one token into `new_token_ids`; the finish it causes, if any."""
        # The benchmark's fake runs this for every token it streams: its cost
        # counts against the frontend's figures, so it stays lean.
        params = request.params
        limit = request.limit
        if request.num_generated >= limit:
            return "length", None
        can_stop = request.num_generated >= params.min_tokens
        probability = self._finish_probability
        if can_stop and probability and request.rng.random() < probability:
            if self._eos_token_id is None or params.ignore_eos:
                return "stop", None
            token_id = self._eos_token_id
        else:
            next_id = next(request.tokens, None)
            if next_id is None:
                return "stop", None
            token_id = next_id
        new_token_ids.append(token_id)
        request.num_generated += 1
        is_eos = token_id == self._eos_token_id and not params.ignore_eos
        if can_stop and (is_eos or token_id in params.stop_token_ids):
            return "stop", token_id
        if request.num_generated >= limit:
            return "length", None
        return None

    def _delta(
        self,
        request: _FakeRequest,
        new_token_ids: list[int],
        finish_reason: FinishReason | None,
        stop_token_id: int | None,
    ) -> RequestDelta:
        start = len(request.output_token_ids)
        request.output_token_ids.extend(new_token_ids)
        logprobs = None
        if request.params.logprobs is not None:
            logprobs = token_logprobs(
                start, new_token_ids, request.params.logprobs, self._logprobs_fn
            )
        return RequestDelta(
            request_id=request.request_id,
            new_token_ids=tuple(new_token_ids),
            logprobs=logprobs,
            finish_reason=finish_reason,
            stop_token_id=stop_token_id,
            num_prompt_tokens=request.num_prompt_tokens,
            prompt_logprobs=self._prompt_logprobs(request) if start == 0 else None,
        )

    def _prompt_logprobs(self, request: _FakeRequest) -> PromptLogprobs | None:
        """As the engine: for prompt tokens 1 .. n-1, iff the request asked."""
        k = request.params.prompt_logprobs
        if k is None:
            return None
        entries = [self._logprobs_fn(-i - 1, t, k) for i, t in enumerate(request.prompt[1:])]
        return PromptLogprobs(
            tuple(e[0] for e in entries),
            (1,) * len(entries),
            tuple(e[1] for e in entries),
            tuple(e[2] for e in entries),
        )


class LoopFakeEngine(FakeEngine):
    """A FakeEngine that a test on another thread drives and waits on: it
    remembers the loop it runs on (a `LiveServer`'s) to die and revive there,
    returning once done, and wakes `wait_until` whenever a request is added
    or aborted."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._changed = threading.Condition()

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        await super().start()

    def _send(self, message: EngineInput) -> None:
        super()._send(message)
        with self._changed:
            self._changed.notify_all()

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
        """Block (another thread than the engine's) until `predicate()` holds,
        checked whenever a request is added or aborted; TimeoutError after `timeout_s`."""
        with self._changed:
            if not self._changed.wait_for(predicate, timeout_s):
                raise TimeoutError(f"the fake engine did not reach the state in {timeout_s} s")

    def die_threadsafe(self) -> None:
        """`die()` on the engine's loop; returns once it has died."""
        self._on_loop(self.die)

    def revive_threadsafe(self) -> None:
        """`revive()` on the engine's loop; returns once it is alive."""
        self._on_loop(self.revive)

    def _on_loop(self, action: Callable[[], object], timeout_s: float = 30.0) -> None:
        done: concurrent.futures.Future[object] = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(lambda: done.set_result(action()))
        done.result(timeout_s)
