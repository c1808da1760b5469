"""The frontend: one API request in, SSE events or one JSON body out.

`Frontend.stream` and `Frontend.complete` run the same pipeline:
1. Fan out: one engine request per choice (id f"{response_id}-{index}";
   with a seed, choice `index` samples with seed + index), all feeding one
   `OutputProcessor`, which puts released text into the request's
   `StreamOutput` (sluice/frontend/stream_output.py).
2. Render: the output hands over everything released since its last
   hand-over, merged per choice; each choice delta becomes one chunk (stream)
   or is folded into the body (non-stream), by the same builder.
3. Close: usage chunk and [DONE], or the body.

Invariants:
- Errors before the first event (a refused request, an engine that is down
  or full, a queue timeout or an engine failure before the first token)
  propagate from the stream's first `__anext__`, so the HTTP edge can still
  answer with a real HTTP error. After that, an error becomes one
  `data: {"error": ...}` event and then `data: [DONE]`. `complete` lets every
  error propagate.
- Cancellation is not polled: when the consumer goes away (the stream is
  closed, or the task awaiting it cancelled), the `finally` below aborts every
  engine request of the API request that is still running, in one call.
- Each event goes out once, in order: the `StreamOutput` decides whether the
  attached connection writes it directly or the generator yields it; the
  closing events are always yielded, after every delta event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from typing import Protocol

import msgspec

from sluice.engine.client_base import EngineRequests
from sluice.engine.engine_request import EngineRequest, generation_request
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import SluiceError
from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.detokenizer import DecodingTokenizer
from sluice.frontend.logprob_format import TokenStrings
from sluice.frontend.observer import ChunkTimer, RequestObserver
from sluice.frontend.output_processor import OutputProcessor, engine_request_id
from sluice.frontend.request import GenerationRequest
from sluice.frontend.stream_output import StreamOutput, WriteNow
from sluice.frontend.usage import UsageCounter

logger = logging.getLogger(__name__)


class ResponseChunks(Protocol):
    """One API's projection of a request's choice deltas: the events of a
    stream and the folded body. Each API's route builds its own per request
    (sluice/apis/<api>/: CompletionChunks, ChatChunks, ResponsesEvents,
    MessagesEvents, OllamaLines); it lives on the event loop.

    `usage` is the request's one count of delivered tokens: the frontend adds
    each delta's tokens to it just before handing the delta over
    (`delivered_event`, `delivered_fold`); the projection only reads it, and
    so do the access log, the key's spend and the span (`on_end`)."""

    usage: UsageCounter

    def opening_events(self) -> list[bytes]:
        """Events sent with the first delta's, before them."""
        ...

    def delta_event(self, index: int, delta: ChoiceDelta) -> bytes | None:
        """The bytes of one or more whole SSE events carrying `delta`, written
        at once; None when output parsing holds all of it back for now."""
        ...

    def closing_events(self) -> list[bytes]:
        """The events after every choice finished (usage, [DONE] or the
        API's terminal event)."""
        ...

    def error_events(self, error: Exception) -> list[bytes]:
        """The events that end a stream which fails after its first event."""
        ...

    def fold(self, index: int, delta: ChoiceDelta) -> None: ...

    def body(self) -> bytes: ...


class EventStream:
    """The SSE events of one streamed request, one per item, [DONE] last.

    Iterate it (or `anext` it for the first event); `aclose` it in every case.
    The HTTP edge `attach`es its connection's `write_now` once the first event
    is out: delta events may then be written directly, never out of order
    with the ones iterated here (sluice/frontend/stream_output.py).
    """

    __slots__ = ("_events", "_output")

    def __init__(self, events: AsyncGenerator[bytes, None], output: StreamOutput):
        self._events = events
        self._output = output

    def __aiter__(self) -> AsyncGenerator[bytes, None]:
        return self._events  # iterated directly: no extra frame per event

    def __anext__(self):
        return self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()

    def attach(self, write_now: WriteNow) -> None:
        self._output.attach(write_now)

    def detach(self) -> None:
        self._output.detach()


class Frontend:
    def __init__(
        self,
        engine: EngineRequests,
        tokenizer: DecodingTokenizer,
        observer: RequestObserver | None = None,
    ):
        self._engine = engine
        self._tokenizer = tokenizer
        self._observer = observer
        self._strings = TokenStrings(tokenizer)

    @property
    def strings(self) -> TokenStrings:
        """Token strings for logprob entries, for builders made by a route."""
        return self._strings

    def stream(
        self,
        request: GenerationRequest,
        chunks: ResponseChunks,
        engine: EngineRequests | None = None,
        observer: RequestObserver | None = None,
        trace_context: str | None = None,
    ) -> EventStream:
        """The SSE events of `request`; nothing starts before the first `__anext__`.
        Its engine requests are added to `engine` (default: the frontend's;
        the HTTP edge passes its gate's, with the request's queue deadline) with `trace_context`
        (the traceparent their engine spans continue); `chunks` (its API's
        builder) projects its deltas; `observer` (default: the
        frontend's) is told of it."""
        run = _RequestRun(
            request, engine or self._engine, observer or self._observer, chunks.usage, trace_context
        )

        def render(taken: list[tuple[int, ChoiceDelta]]) -> list[bytes]:
            events = [delivered_event(chunks, index, delta) for index, delta in taken]
            run.observe(taken)
            # None: output parsing holds all of a delta's text back for now.
            return [event for event in events if event is not None]

        output = StreamOutput(request.num_choices, render)
        return EventStream(self._events(run, chunks, output), output)

    async def _events(
        self, run: _RequestRun, chunks: ResponseChunks, output: StreamOutput
    ) -> AsyncGenerator[bytes, None]:
        # Not cancelled: every event was made, or an error ended the stream.
        is_ended = False
        try:
            run.start(self._tokenizer, output)
            # The opening events (chat's role chunks) wait for the first
            # tokens, as vLLM sends them: a client timing its first chunk
            # measures the time to first token, and an error before it is
            # still an HTTP error.
            opening = chunks.opening_events()
            has_yielded = False
            try:
                while events := await output.next_events():
                    for event in opening + events if opening else events:
                        yield event
                    opening, has_yielded = [], True
                closing = opening + chunks.closing_events()
            except Exception as error:
                if not has_yielded:
                    is_ended = True
                    raise  # nothing sent yet: the edge answers with an HTTP error
                closing = chunks.error_events(_logged(error))
            is_ended = True
            for event in closing:
                yield event
        finally:
            run.close(is_aborted=not is_ended and not output.is_done)

    async def complete(
        self,
        request: GenerationRequest,
        chunks: ResponseChunks,
        engine: EngineRequests | None = None,
        observer: RequestObserver | None = None,
        trace_context: str | None = None,
    ) -> bytes:
        """The JSON body of `request`; engine errors propagate. The rest as for `stream`."""
        run = _RequestRun(
            request, engine or self._engine, observer or self._observer, chunks.usage, trace_context
        )

        def fold(taken: list[tuple[int, ChoiceDelta]]) -> list[bytes]:
            for index, delta in taken:
                delivered_fold(chunks, index, delta)
            run.observe(taken)
            return []

        output = StreamOutput(request.num_choices, fold)
        is_cancelled = False
        try:
            run.start(self._tokenizer, output)
            await output.next_events()  # [] once every choice is folded in
        except asyncio.CancelledError:
            is_cancelled = True
            raise
        finally:
            run.close(is_aborted=is_cancelled and not output.is_done)
        return chunks.body()


def delivered_event(chunks: ResponseChunks, index: int, delta: ChoiceDelta) -> bytes | None:
    """Count `delta`'s tokens as delivered, then project it as its event(s)."""
    chunks.usage.add(index, len(delta.token_ids), delta.num_cached_tokens)
    return chunks.delta_event(index, delta)


def delivered_fold(chunks: ResponseChunks, index: int, delta: ChoiceDelta) -> None:
    """Count `delta`'s tokens as delivered, then fold it into the body."""
    chunks.usage.add(index, len(delta.token_ids), delta.num_cached_tokens)
    chunks.fold(index, delta)


class _RequestRun:
    """One API request in flight: its engine requests and its timing; its
    delivered tokens are `usage`'s (its projection's)."""

    def __init__(
        self,
        request: GenerationRequest,
        engine: EngineRequests,
        observer: RequestObserver | None,
        usage: UsageCounter,
        trace_context: str | None = None,
    ):
        self._request = request
        self._engine = engine
        self._trace_context = trace_context
        self._observer = observer
        self._timer = None if observer is None else ChunkTimer(observer)
        self._processor: OutputProcessor | None = None
        self._usage = usage

    def start(self, tokenizer: DecodingTokenizer, output: StreamOutput) -> None:
        """Add one engine request per choice, all feeding `output`."""
        request = self._request
        processor = self._processor = OutputProcessor(request, tokenizer, self._engine, output)
        added: list[str] = []
        try:
            for engine_request in engine_requests_of(request, self._trace_context):
                self._engine.add_request(engine_request, processor)
                added.append(engine_request.request_id)
        except BaseException:
            processor.close()
            if added:  # a dead engine ignores it
                self._engine.abort(added)
            raise

    def observe(self, taken: list[tuple[int, ChoiceDelta]]) -> None:
        """Time what was handed over (already counted in `usage`)."""
        if self._timer is not None:
            self._observe(taken)

    def close(self, *, is_aborted: bool) -> None:
        """Stop listening and abort whatever still runs in the engine.
        `is_aborted`: the consumer went away before every choice finished."""
        processor = self._processor
        if processor is not None:
            processor.close()
            unfinished = processor.unfinished_request_ids
            if unfinished:  # a dead engine ignores it
                self._engine.abort(unfinished)
        if self._timer is not None:
            self._timer.report()
        if self._observer is not None:
            if is_aborted:
                self._observer.on_abort()
            self._observer.on_end(self._usage.num_all_completion_tokens())

    def _observe(self, taken: list[tuple[int, ChoiceDelta]]) -> None:
        assert self._timer is not None and self._observer is not None, "with an observer only"
        now_s = time.perf_counter()
        for index, delta in taken:
            if delta.token_ids:
                self._timer.on_tokens(index, len(delta.token_ids), now_s)
            if delta.finish_reason is not None:
                self._observer.on_finish(
                    delta.num_prompt_tokens,
                    self._usage.num_completion_tokens(index),
                    now_s - self._timer.started_s,
                    delta.finish_reason,
                )


def engine_requests_of(
    request: GenerationRequest, trace_context: str | None = None
) -> list[EngineRequest]:
    """The engine requests of `request`, one per choice, in choice order."""
    return [
        generation_request(
            engine_request_id(request.response_id, index),
            request.prompts[index // request.n].token_ids,
            _choice_params(request.params, index),
            trace_context,
        )
        for index in range(request.num_choices)
    ]


def _choice_params(params: SamplingParams, index: int) -> SamplingParams:
    if params.seed is None:
        return params
    return msgspec.structs.replace(params, seed=params.seed + index)


def _logged(error: Exception) -> Exception:
    if not isinstance(error, SluiceError):
        logger.exception("stream failed after it started", exc_info=error)
    return error
