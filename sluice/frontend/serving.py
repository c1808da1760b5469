"""The frontend: one API request in, SSE events or one JSON body out.

`Frontend.stream` and `Frontend.complete` run the same pipeline:
1. Fan out: one engine request per choice (id f"{response_id}-{index}";
   with a seed, choice `index` samples with seed + index), all feeding one
   `OutputProcessor`, which puts released text into one `Mailbox`.
2. Read: each take from the mailbox is everything released since the last
   one, merged per choice; each choice delta becomes one chunk (stream) or is
   folded into the body (non-stream), by the same builder.
3. Close: usage chunk and [DONE], or the body.

Invariants:
- Errors before the first event (a refused request, an engine that is down
  or full, a queue timeout or an engine failure before the first token)
  propagate from the generator's first `__anext__`, so the HTTP edge can still
  answer with a real HTTP error. After that, an error becomes one
  `data: {"error": ...}` event and then `data: [DONE]`. `complete` lets every
  error propagate.
- Cancellation is not polled: when the consumer goes away (the generator is
  closed, or the task awaiting it cancelled), the `finally` below aborts every
  engine request of the API request that is still running, in one call, and
  drops the mailbox.
- Each yielded item is exactly one SSE event. With a `DirectWrite` set by
  the edge, delta events made while the generator is parked are written
  there instead of yielded (sluice/frontend/direct_write.py); either way each
  event goes out once, in order, and the closing events are always yielded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator
from typing import Protocol

import msgspec

from sluice.engine.client_base import EngineClient
from sluice.engine.sampling_params import SamplingParams
from sluice.errors import InvalidRequestError, SluiceError
from sluice.frontend.chat_chunks import ChatChunks
from sluice.frontend.completions_chunks import CompletionChunks
from sluice.frontend.debug import DebugHooks
from sluice.frontend.deltas import ChoiceDelta
from sluice.frontend.detokenizer import DecodingTokenizer
from sluice.frontend.direct_write import DirectWrite, DirectWriter
from sluice.frontend.logprob_format import TokenStrings
from sluice.frontend.mailbox import Mailbox
from sluice.frontend.observer import ChunkTimer, RequestObserver
from sluice.frontend.output_processor import OutputProcessor, engine_request_id
from sluice.frontend.request import GenerationRequest
from sluice.frontend.sse import DONE_EVENT, encode_event, error_payload

logger = logging.getLogger(__name__)


class _ResponseChunks(Protocol):
    """What CompletionChunks and ChatChunks have in common."""

    def opening_events(self) -> list[bytes]: ...

    def delta_event(self, index: int, delta: ChoiceDelta) -> bytes: ...

    def closing_events(self) -> list[bytes]: ...

    def fold(self, index: int, delta: ChoiceDelta) -> None: ...

    def body(self) -> bytes: ...


class Frontend:
    def __init__(
        self,
        engine: EngineClient,
        tokenizer: DecodingTokenizer,
        observer: RequestObserver | None = None,
        debug: DebugHooks | None = None,
    ):
        self._engine = engine
        self._tokenizer = tokenizer
        self._observer = observer
        self._debug = debug
        self._strings = TokenStrings(tokenizer)

    async def stream(
        self, request: GenerationRequest, direct: DirectWrite | None = None
    ) -> AsyncGenerator[bytes, None]:
        """The SSE events of `request`, one per item, [DONE] last.

        With `direct` (and no debug hooks), once the edge sets `direct.write`,
        delta events go straight to it while this generator is parked
        (sluice/frontend/direct_write.py); it yields the rest.
        """
        run = self._start(request)
        chunks = self._chunks(request)
        writer = None
        if direct is not None and self._debug is None:
            writer = DirectWriter(direct, run, chunks, run.mailbox)
        # Not cancelled: every event was made, or an error ended the stream.
        is_ended = False
        try:
            opening = chunks.opening_events()
            for event in opening:
                yield event
            has_yielded = bool(opening)
            try:
                while not run.is_done or (writer is not None and writer.backlog):
                    if writer is not None and writer.backlog:
                        backlog, writer.backlog = writer.backlog, []
                        for event in backlog:
                            yield event
                        continue
                    if self._debug is not None:
                        await self._debug.before_read()
                    if writer is not None and writer.is_enabled:
                        await self._wait_writing_directly(run, writer)
                    else:
                        # `run.take()` inlined (it runs for every token): the wait
                        # is over at once when something is pending.
                        await run.wait()
                    if (taken := run.take_nowait()) is None:
                        continue
                    for index, delta in taken:
                        yield chunks.delta_event(index, delta)
                        has_yielded = True
                closing = chunks.closing_events()
            except Exception as error:
                if not has_yielded:
                    is_ended = True
                    raise  # nothing sent yet: the edge answers with an HTTP error
                closing = [encode_event(error_payload(_logged(error))), DONE_EVENT]
            is_ended = True
            for event in closing:
                yield event
        finally:
            run.close(is_cancelled=not is_ended)

    @staticmethod
    async def _wait_writing_directly(run: _RequestRun, writer: DirectWriter) -> None:
        """Park until the direct writer wakes us (or something was pending already)."""
        mailbox = run.mailbox
        if not mailbox.is_empty:
            return
        mailbox.listener = writer.on_put
        try:
            await mailbox.wait()
        finally:
            mailbox.listener = None
        if writer.error is not None:
            error, writer.error = writer.error, None
            raise error

    async def complete(self, request: GenerationRequest) -> bytes:
        """The JSON body of `request`; engine errors propagate."""
        run = self._start(request)
        chunks = self._chunks(request)
        is_cancelled = False
        try:
            while not run.is_done:
                for index, delta in await run.take():
                    chunks.fold(index, delta)
        except asyncio.CancelledError:
            is_cancelled = True
            raise
        finally:
            run.close(is_cancelled=is_cancelled)
        return chunks.body()

    async def aclose(self) -> None:
        """Stop background work (the debug hooks' loop stalls)."""
        if self._debug is not None:
            await self._debug.stop()

    def _start(self, request: GenerationRequest) -> _RequestRun:
        if request.echo and request.logprobs is not None:
            raise InvalidRequestError(
                "echo with logprobs is not supported: prompt logprobs are not computed",
                param="echo",
            )
        if self._debug is not None:
            self._debug.ensure_running()
        mailbox = Mailbox()
        processor = OutputProcessor(request, self._tokenizer, self._engine, mailbox)
        run = _RequestRun(request, self._engine, processor, mailbox, self._observer)
        self._fan_out(request, processor)
        return run

    def _fan_out(self, request: GenerationRequest, processor: OutputProcessor) -> None:
        added: list[str] = []
        try:
            for index in range(request.num_choices):
                request_id = engine_request_id(request.response_id, index)
                prompt = request.prompts[index // request.n]
                params = _choice_params(request.params, index)
                self._engine.add_request(request_id, list(prompt.token_ids), params, processor)
                added.append(request_id)
        except BaseException:
            processor.close()
            if added and self._engine.is_alive:
                self._engine.abort(added)
            raise

    def _chunks(self, request: GenerationRequest) -> _ResponseChunks:
        if request.kind == "chat":
            return ChatChunks(request, self._strings)
        return CompletionChunks(request, self._strings)


class _RequestRun:
    """One API request in flight: its mailbox, its processor, its timing."""

    def __init__(
        self,
        request: GenerationRequest,
        engine: EngineClient,
        processor: OutputProcessor,
        mailbox: Mailbox,
        observer: RequestObserver | None,
    ):
        self._engine = engine
        self._processor = processor
        self.mailbox = mailbox
        self._observer = observer
        self._timer = None if observer is None else ChunkTimer(observer)
        self._num_unfinished = request.num_choices
        # Per choice index: tokens handed over so far.
        self._num_tokens = [0] * request.num_choices

    @property
    def is_done(self) -> bool:
        """Every choice's finish has been taken."""
        return self._num_unfinished == 0

    async def take(self) -> list[tuple[int, ChoiceDelta]]:
        """Everything released since the last take, by choice index."""
        while (taken := self.take_nowait()) is None:
            await self.mailbox.wait()
        return taken

    def take_nowait(self) -> list[tuple[int, ChoiceDelta]] | None:
        """`take` if anything was released, else None (then await `wait()`)."""
        slot = self.mailbox.take()
        if slot is None:
            return None
        taken = sorted(slot.items()) if len(slot) > 1 else list(slot.items())
        num_tokens = 0
        for index, delta in taken:
            num_tokens += len(delta.token_ids)
            self._num_tokens[index] += len(delta.token_ids)
            if delta.finish_reason is not None:
                self._num_unfinished -= 1
        if self._timer is not None:
            self._observe(taken, num_tokens)
        return taken

    def wait(self) -> asyncio.Future[None]:
        """Done once something was released."""
        return self.mailbox.wait()

    def close(self, *, is_cancelled: bool) -> None:
        """Drop the mailbox and abort whatever still runs in the engine."""
        self._processor.close()
        unfinished = self._processor.unfinished_request_ids
        if unfinished and self._engine.is_alive:
            self._engine.abort(unfinished)
        if self._timer is not None:
            self._timer.report()
        if is_cancelled and not self.is_done and self._observer is not None:
            self._observer.on_abort()

    def _observe(self, taken: list[tuple[int, ChoiceDelta]], num_tokens: int) -> None:
        assert self._timer is not None and self._observer is not None, "with an observer only"
        now_s = time.perf_counter()
        if num_tokens:
            self._timer.on_tokens(num_tokens, now_s)
        for index, delta in taken:
            if delta.finish_reason is not None:
                self._observer.on_finish(
                    delta.num_prompt_tokens,
                    self._num_tokens[index],
                    now_s - self._timer.started_s,
                    delta.finish_reason,
                )


def _choice_params(params: SamplingParams, index: int) -> SamplingParams:
    if params.seed is None:
        return params
    return msgspec.structs.replace(params, seed=params.seed + index)


def _logged(error: Exception) -> Exception:
    if not isinstance(error, SluiceError):
        logger.exception("stream failed after it started", exc_info=error)
    return error
