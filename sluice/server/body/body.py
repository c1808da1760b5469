"""Request bodies: read within the size limit, parsed and converted off the loop.

    parse:   size (413) -> JSON -> counts (limits.check_parsed) -> pydantic
    convert: the route's conversion (to_internal: template, tokens, checks)

A route parses, admits (its own business, on the loop), then converts.
A small body (up to OFFLOAD_THRESHOLD_BYTES) is parsed and converted on the
event loop: a few milliseconds at worst (270 empty messages through a jinja
template), less than the thread hops would add for most. A larger one is
parsed and converted in a worker thread, in one of two lanes that each take
one body at a time: bodies over HUGE_BODY_BYTES (up to seconds of work) in
one, the rest in the other, so an ordinary request never queues behind a
huge one, and the loop never competes with more than two workers for the
GIL. A worker holding the GIL stalls the loop as surely as the loop's own
code (Python hands the GIL over every switch interval, 5 ms, but never in
the middle of a call into C), so a worker works in pieces:
- JSON is parsed by orjson ~64 KiB at a time (`json_pieces`), and pydantic
  validates a window of list elements at a time (`validation_windows`);
- conversion runs with a preprocessor that does everything inline (template,
  tokenizer: the Rust tokenizer releases the GIL while it encodes), and
  compiles grammars inline (llguidance releases the GIL while it compiles);
- meanwhile threads switch every WORKER_SWITCH_INTERVAL_S instead of every
  5 ms (a worker running Python, the template or a fake tokenizer, gives the
  GIL up that often; with a third thread waiting too, the loop could wait 3
  intervals), and while a huge body's worker runs, automatic garbage
  collection is paused (a collection walks every object the body made,
  holding the GIL: 60 ms for a 50,000-part message). Not for the other lane:
  with its bodies back to back the collector would hardly ever run;
- what the body made is dropped a piece at a time (`release_in_pieces`):
  freeing a large structure at once is one long call too.

Invariants:
- A body longer than `max_request_body_bytes` is a 413 in the OpenAI error
  format: by its Content-Length before a byte is read, or, streamed, as soon
  as that many bytes arrived. A body not declared JSON (no Content-Type
  included) is a 415 before reading (`openai_protocol.check_content_type`).
- Both paths give the same result for the same body: the same request, or
  the same error (but for the wording of a JSON syntax error).
- Left as one call for a body within the limits: steps that copy a prompt's
  token ids whole (the tokenizer's list of ids, the prompt's tuple, freeing
  them), ~5 ms for the ~2M ids of a 4 MiB body on a loaded 2-core machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from starlette.requests import Request

from sluice.apis import openai_protocol
from sluice.apis.openai_request import RequestOptions
from sluice.apis.rules.structured_fields import GrammarCheck
from sluice.config import RequestLimits
from sluice.errors import RequestTooLargeError
from sluice.frontend.preprocess import Preprocessor
from sluice.server.body import json_pieces, limits, validation_windows

# Bodies longer than this are parsed and converted in a worker thread (as
# `preprocess` tokenizes texts longer than 8,192 characters in one).
OFFLOAD_THRESHOLD_BYTES = 8 * 1024
# Bodies longer than this take the worker lane of their own.
HUGE_BODY_BYTES = 256 * 1024
# Items freed at once by `release_in_pieces` (~0.1-0.5 ms).
RELEASE_PIECE_ITEMS = 4096
# How often threads switch while a worker handles a large body (Python's default: 5 ms).
WORKER_SWITCH_INTERVAL_S = 0.001

Body = TypeVar("Body", bound=openai_protocol.OpenAIModel)
T = TypeVar("T")
# A route's conversion of its body: to_internal.chat_request and the like.
Converter = Callable[[Body, RequestOptions], Awaitable[T]]


@dataclass(frozen=True, slots=True)
class ParsedBody(Generic[Body]):
    """A validated body, and how long it was: which path it takes."""

    value: Body
    num_bytes: int


@dataclass(frozen=True, slots=True)
class Conversion:
    """One model's request options, as the loop and as a worker thread use them."""

    on_loop: RequestOptions
    # The same conversion for a worker thread: it hands nothing to another thread.
    in_worker: RequestOptions

    @classmethod
    def of(cls, options: RequestOptions) -> Conversion:
        on_loop = options.preprocessor
        in_worker = dataclasses.replace(
            options,
            preprocessor=Preprocessor(
                on_loop.tokenizer, on_loop.max_model_len, offload_threshold_chars=sys.maxsize
            ),
            grammar_check=GrammarCheck(is_inline=True),
        )
        return cls(options, in_worker)


class BodyReader:
    """Reads, parses and converts the bodies of one app's routes; `options`
    (or `default_conversion()`, read at each use): the conversion of a route
    that names no other (`convert`)."""

    def __init__(
        self,
        request_limits: RequestLimits,
        options: RequestOptions | None = None,
        offload_threshold_bytes: int = OFFLOAD_THRESHOLD_BYTES,
        default_conversion: Callable[[], Conversion | None] | None = None,
    ):
        self.limits = request_limits
        conversion = None if options is None else Conversion.of(options)
        self._default_conversion = default_conversion or (lambda: conversion)
        self.offload_threshold_bytes = offload_threshold_bytes
        # The worker lanes: one body at a time in each.
        self._large_lane = asyncio.Lock()
        self._huge_lane = asyncio.Lock()

    async def parse(self, request: Request, model: type[Body]) -> ParsedBody[Body]:
        """The request's body as `model`; RequestError (400, 413) for what is refused."""
        self._check_declared_length(request.headers.get("content-length"))
        openai_protocol.check_content_type(request.headers.get("content-type"))
        chunks = await self._read(request)
        num_bytes = sum(len(chunk) for chunk in chunks)
        lane = self._lane(num_bytes)
        if lane is None:
            data = openai_protocol.json_object(b"".join(chunks))
            limits.check_parsed(data, model, self.limits)
            return ParsedBody(openai_protocol.validate_body(data, model), num_bytes)
        async with lane:
            value = await asyncio.to_thread(
                _in_worker, lane is self._huge_lane, _parse, chunks, model, self.limits
            )
        return ParsedBody(value, num_bytes)

    async def convert(
        self,
        body: ParsedBody[Body],
        convert: Converter[Body, T],
        conversion: Conversion | None = None,
    ) -> T:
        """`convert(body)` with the model's `conversion` (default: the reader's);
        for a large body in a worker thread, which then drops the body."""
        conversion = conversion or self._default_conversion()
        assert conversion is not None, "no request options to convert with"
        lane = self._lane(body.num_bytes)
        if lane is None:
            return await convert(body.value, conversion.on_loop)
        async with lane:
            return await asyncio.to_thread(
                _in_worker,
                lane is self._huge_lane,
                _convert,
                body.value,
                convert,
                conversion.in_worker,
            )

    def _lane(self, num_bytes: int) -> asyncio.Lock | None:
        """The worker lane of a body this long; None: the event loop."""
        if num_bytes <= self.offload_threshold_bytes:
            return None
        return self._huge_lane if num_bytes > HUGE_BODY_BYTES else self._large_lane

    def _check_declared_length(self, content_length: str | None) -> None:
        if content_length is None or not (content_length.isascii() and content_length.isdigit()):
            return  # none declared (chunked), or uvicorn refuses it itself
        if int(content_length) > self.limits.max_request_body_bytes:
            raise _too_large(self.limits.max_request_body_bytes)

    async def _read(self, request: Request) -> list[bytes]:
        """The body's chunks as they came: joined later, off the loop if large (a
        bytearray grown chunk by chunk copied itself over and over, ~2 ms a chunk)."""
        chunks, num_bytes = [], 0
        async for chunk in request.stream():
            num_bytes += len(chunk)
            if num_bytes > self.limits.max_request_body_bytes:
                raise _too_large(self.limits.max_request_body_bytes)
            chunks.append(chunk)
        return chunks


def _too_large(max_bytes: int) -> RequestTooLargeError:
    return RequestTooLargeError(
        f"the request body is longer than this server's limit of {max_bytes} bytes",
        code="request_too_large",
    )


# -- in the worker thread --------------------------------------------------------


def _parse(chunks: list[bytes], model: type[Body], request_limits: RequestLimits) -> Body:
    data = openai_protocol.json_object(b"".join(chunks), loads=json_pieces.loads)
    value = None
    try:
        limits.check_parsed(data, model, request_limits)
        value = validation_windows.validate(model, data)
        return value
    finally:
        # Fields typed Any (a tool's parameters, a schema, the Responses API's
        # items) keep the parsed JSON's own lists and dicts: those stay whole.
        release_in_pieces(data, keep=_containers_of(value))


def _convert(body: Body, convert: Converter[Body, T], options: RequestOptions) -> T:
    try:
        return _run_inline(convert(body, options))  # type: ignore[arg-type]
    finally:
        # Conversion copies what it keeps (tuples of ids, strings): the body is done.
        release_in_pieces(body)


def _run_inline(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends, run in this thread."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value
    coroutine.close()
    raise AssertionError("a conversion suspended in the worker thread; it must run inline")


def release_in_pieces(value: object, keep: frozenset[int] = frozenset()) -> None:
    """Empty `value`'s lists and dicts (and a model's), RELEASE_PIECE_ITEMS at a
    time: each step frees at most that many items, whose own containers are
    emptied the same way. The caller's references remain, to empty shells.
    Containers whose id is in `keep` (and what they hold) stay untouched."""
    containers = [value]
    while containers:
        container = containers.pop()
        if id(container) in keep:
            continue
        if isinstance(container, BaseModel):
            containers.extend(v for v in container.__dict__.values() if _is_container(v))
        elif isinstance(container, list):
            while container:
                piece = container[-RELEASE_PIECE_ITEMS:]
                del container[-RELEASE_PIECE_ITEMS:]
                # A piece of plain values (token ids, strings) is checked in C.
                if any(map(isinstance, piece, repeat(_CONTAINER_TYPES))):
                    containers.extend(item for item in piece if _is_container(item))
        elif isinstance(container, dict):
            while container:
                _, item = container.popitem()
                if _is_container(item):
                    containers.append(item)


_CONTAINER_TYPES = (list, dict, BaseModel)


def _containers_of(value: object) -> frozenset[int]:
    """The ids of every list, dict and model reachable from `value`."""
    seen: set[int] = set()
    containers = [value] if _is_container(value) else []
    while containers:
        container = containers.pop()
        if id(container) in seen:
            continue
        seen.add(id(container))
        if isinstance(container, BaseModel):
            containers.extend(v for v in container.__dict__.values() if _is_container(v))
        elif isinstance(container, dict):
            containers.extend(v for v in container.values() if _is_container(v))
        else:  # a list: a piece at a time, so the GIL is let go between pieces
            for start in range(0, len(container), RELEASE_PIECE_ITEMS):  # type: ignore[arg-type]
                piece = container[start : start + RELEASE_PIECE_ITEMS]  # type: ignore[index]
                if any(map(isinstance, piece, repeat(_CONTAINER_TYPES))):
                    containers.extend(item for item in piece if _is_container(item))
    return frozenset(seen)


def _is_container(value: object) -> bool:
    return isinstance(value, _CONTAINER_TYPES)


class _WorkerSettings:
    """The interpreter's settings while workers run: threads switch every
    WORKER_SWITCH_INTERVAL_S while any runs, and automatic garbage collection
    is off while any that pauses it runs.

    Both settings are the interpreter's, so this is too (one instance, below):
    the first worker in sets a setting, the last one out restores what it found.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._num_workers = 0
        self._num_pausing = 0
        self._switch_interval_s = 0.0
        self._was_collecting = False

    @contextlib.contextmanager
    def applied(self, pause_collector: bool) -> Iterator[None]:
        with self._lock:
            if self._num_workers == 0:
                self._switch_interval_s = sys.getswitchinterval()
                sys.setswitchinterval(min(WORKER_SWITCH_INTERVAL_S, self._switch_interval_s))
            self._num_workers += 1
            if pause_collector:
                if self._num_pausing == 0:
                    self._was_collecting = gc.isenabled()
                    gc.disable()
                self._num_pausing += 1
        try:
            yield
        finally:
            with self._lock:
                self._num_workers -= 1
                if self._num_workers == 0:
                    sys.setswitchinterval(self._switch_interval_s)
                if pause_collector:
                    self._num_pausing -= 1
                    if self._num_pausing == 0 and self._was_collecting:
                        gc.enable()


_WORKER_SETTINGS = _WorkerSettings()


def _in_worker(pause_collector: bool, function: Callable[..., T], *args: Any) -> T:
    with _WORKER_SETTINGS.applied(pause_collector):
        return function(*args)
