"""The workload of benchmarks/streaming.py, its checks, and the reference server.

`Workload`: what every benchmark stream asks for (the prompt as token ids,
max_tokens) and must receive (the text each token releases), built from the
tokenizer the way sluice's FakeEngine will parrot the prompt. `count_plain`
and `check_sampled` read a received body against it.

`ReferenceApp`, the floor sluice is measured against, is a bare ASGI app (no
FastAPI, no middleware, no pydantic) served by the same uvicorn + uvloop +
httptools stack as sluice. For any POST it reads the body with orjson, picks
the pre-built events for the request's shape (max_tokens, logprobs,
continuous usage; built once per shape, then cached) and writes them one
event per token, yielding to the event loop between tokens: the pace of a
server fed by an engine step that makes one token per stream per loop turn,
which is how sluice's FakeEngine runs in the benchmark. So the difference
between the two is sluice's work per token: HTTP edge, detokenizing, stop
checking, chunk building, encoding, metrics.

The events are shaped exactly as sluice's /v1/completions chunks (same keys,
same usage fields), so both put the same bytes per token on the wire and the
same checks apply. `duplicate_event=True` sends one token's event twice, its
usage repeated: the original failure, for testing the checks.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import uvicorn

from sluice.frontend.detokenizer import IncrementalDetokenizer
from sluice.testing import FakeTokenizer
from sluice.testing.contract import Expectations, check_stream

if TYPE_CHECKING:
    from sluice.server.served_models.served_model import ServedTokenizer

MODEL = "bench-model"
PROMPT_TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm sun. "
RESPONSE_ID = "cmpl-reference"
CREATED = 1_700_000_000
DONE_EVENT = b"data: [DONE]\n\n"
_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
}


@dataclass(frozen=True, slots=True)
class Workload:
    """What every benchmark stream asks for and must receive."""

    prompt_token_ids: tuple[int, ...]
    # The text each generated token releases, in order; "".join == expected_text.
    token_texts: tuple[str, ...]
    # The full decode of the generated ids (the FakeEngine parrots the prompt).
    expected_text: str

    @property
    def max_tokens(self) -> int:
        return len(self.token_texts)


def load_tokenizer(kind: str, cache_dir: Path) -> ServedTokenizer:
    """The embedded model's tokenizer for "real", the hand-built fake for "fake"."""
    if kind == "fake":
        return FakeTokenizer()
    from sluice.loader.gguf_convert import converted_folder
    from sluice.loader.sources import embedded_gguf_path
    from sluice.tokenizer import Tokenizer

    return Tokenizer.from_folder(converted_folder(embedded_gguf_path(), cache_dir))


def resolve_tokenizer_kind(kind: str, cache_dir: Path) -> str:
    if kind != "auto":
        return kind
    from sluice.loader.gguf_convert import cache_folder_for
    from sluice.loader.sources import embedded_gguf_path

    return "real" if cache_folder_for(embedded_gguf_path(), cache_dir).is_dir() else "fake"


def build_workload(tokenizer: ServedTokenizer, max_tokens: int) -> Workload:
    """The prompt, and what the FakeEngine (parroting it) makes of it, token by token."""
    prompt_ids = tokenizer.encode(PROMPT_TEXT)
    generated = list(itertools.islice(itertools.cycle(prompt_ids), max_tokens))
    detokenizer = IncrementalDetokenizer(tokenizer)
    texts = [detokenizer.push(token_id) for token_id in generated]
    texts[-1] += detokenizer.flush()
    expected_text = tokenizer.decode(generated)
    assert "".join(texts) == expected_text, "the incremental decode equals the full one"
    assert all(texts), "the reference sends one event per token: each must carry text"
    return Workload(tuple(prompt_ids), tuple(texts), expected_text)


def request_body(workload: Workload, is_sampled: bool) -> bytes:
    body = {
        "model": MODEL,
        "prompt": list(workload.prompt_token_ids),
        "max_tokens": workload.max_tokens,
        "stream": True,
        "temperature": 0.0,
        "stream_options": {"include_usage": True, "continuous_usage_stats": is_sampled},
        "logprobs": 1 if is_sampled else None,
    }
    return orjson.dumps(body)


def count_plain(body: bytes, workload: Workload) -> int:
    """The chunks of an unchecked stream; its usage must count max_tokens."""
    assert body.endswith(DONE_EVENT), "the body must end with data: [DONE]"
    done_start = len(body) - len(DONE_EVENT)
    usage_start = body.rindex(b"data: ", 0, done_start)
    usage = orjson.loads(body[usage_start + 6 : done_start])["usage"]
    assert usage["completion_tokens"] == workload.max_tokens, "usage counts max_tokens"
    return body.count(b"\n\n") - 2  # not the usage chunk, not [DONE]


def check_sampled(body: bytes, workload: Workload) -> int:
    """The chunks of a fully checked stream (logprobs, continuous usage)."""
    expect = Expectations(
        "completion", 1, logprobs=1, include_usage=True, continuous_usage_stats=True
    )
    result = check_stream(body, expect)
    assert result.error is None, f"error event: {result.error}"
    (choice,) = result.choices
    assert choice.text == workload.expected_text, "streamed text == full decode (I1)"
    assert "".join(choice.token_strings) == workload.expected_text, "token strings (I2, I3)"
    assert len(choice.token_strings) == workload.max_tokens, "one entry per token (I2)"
    assert result.usage is not None and result.usage["completion_tokens"] == workload.max_tokens
    assert result.usage["prompt_tokens"] == len(workload.prompt_token_ids), "prompt usage"
    assert choice.finish_reason == "length", "finish_reason length at max_tokens (I4)"
    return choice.num_chunks


@dataclass(frozen=True, slots=True)
class StreamShape:
    """The request fields that change the bytes of a response."""

    num_tokens: int
    has_logprobs: bool
    include_usage: bool
    continuous_usage: bool


def shape_of(request: dict[str, Any], workload: Workload) -> StreamShape:
    options = request.get("stream_options") or {}
    return StreamShape(
        num_tokens=min(request.get("max_tokens") or 16, workload.max_tokens),
        has_logprobs=request.get("logprobs") is not None,
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("continuous_usage_stats")),
    )


def build_events(workload: Workload, shape: StreamShape) -> list[bytes]:
    """Every SSE event of one response, one content chunk per token, [DONE] last."""
    num_prompt_tokens = len(workload.prompt_token_ids)
    events = []
    text_offset = 0
    for position in range(shape.num_tokens):
        text = workload.token_texts[position]
        is_last = position == shape.num_tokens - 1
        choice = {
            "index": 0,
            "text": text,
            "logprobs": _logprobs(text, position, text_offset) if shape.has_logprobs else None,
            "finish_reason": "length" if is_last else None,
            "stop_reason": None,
        }
        chunk = _envelope([choice])
        if shape.continuous_usage:
            chunk["usage"] = _usage(num_prompt_tokens, position + 1)
        events.append(_event(chunk))
        text_offset += len(text)
    if shape.include_usage:
        usage_chunk = _envelope([])
        usage_chunk["usage"] = _usage(num_prompt_tokens, shape.num_tokens)
        events.append(_event(usage_chunk))
    return [*events, DONE_EVENT]


class ReferenceApp:
    """ASGI: any HTTP request streams the pre-built events its body asks for."""

    def __init__(self, workload: Workload, *, duplicate_event: bool = False):
        self._workload = workload
        self._duplicate_event = duplicate_event
        self._events: dict[StreamShape, list[bytes]] = {}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        request = orjson.loads(await _read_body(receive))
        events = self._events_for(shape_of(request, self._workload))
        await send(_START)
        for event in events:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await asyncio.sleep(0)  # the next token comes with the next engine step
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _events_for(self, shape: StreamShape) -> list[bytes]:
        events = self._events.get(shape)
        if events is None:
            events = self._events[shape] = build_events(self._workload, shape)
            if self._duplicate_event and shape.num_tokens > 1:
                events.insert(1, events[1])
        return events


def listening_socket() -> socket.socket:
    """A socket on a free 127.0.0.1 port, listening with room for 512+ connects."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    return sock


def serve_reference(port_out: Connection, workload: Workload, duplicate_event: bool) -> None:
    """Process entry: send the bound port through `port_out`, then serve until SIGTERM."""
    config = uvicorn.Config(
        ReferenceApp(workload, duplicate_event=duplicate_event),
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_config=None,
    )
    sock = listening_socket()
    port_out.send(sock.getsockname()[1])
    uvicorn.Server(config).run(sockets=[sock])


async def _read_body(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def _envelope(choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": RESPONSE_ID,
        "object": "text_completion",
        "created": CREATED,
        "model": MODEL,
        "choices": choices,
    }


def _logprobs(text: str, position: int, text_offset: int) -> dict[str, list[Any]]:
    logprob = -(1 + position) / 64  # sluice.testing.fake_logprobs' values
    return {
        "tokens": [text],
        "token_logprobs": [logprob],
        "top_logprobs": [{text: logprob}],
        "text_offset": [text_offset],
    }


def _usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
    }


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"
