"""A response read as the OpenAI API means it: per chunk, and per choice index.

`view_exchange` turns an `Exchange` into a `StreamView`: what the request
asked for (`RequestShape`), the metadata of every JSON chunk, and for every
choice index its chunks in order (text, role, finish reason, logprob entries,
usage). A non-streamed response becomes a view with one chunk, so the checks
that apply to both (U+FFFD, stop leaks, logprob values) read one shape.

Both APIs are normalised here, once: completions `text` and chat
`delta.content`; completions `logprobs.tokens` and chat `logprobs.content`.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass, field
from typing import Any

from sluice.audit.logprob_entries import LogprobEntry, chat_entries, completion_entries
from sluice.audit.records import AGENT_ENDPOINTS, CHAT, OLLAMA_CHAT, Exchange
from sluice.audit.sse import SseParse, event_time_s, parse_sse

MISSING = "<missing>"


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What a request body asked for, as far as the checks care."""

    is_chat: bool
    is_stream: bool
    # Completions: number of prompts × n; chat: n.
    num_choices: int
    include_usage: bool
    continuous_usage: bool
    # None when logprobs are off; else the number of top alternatives asked for.
    top_logprobs: int | None
    stops: tuple[str, ...]
    include_stop_str: bool
    # Stop strings wait for this many output tokens (vLLM's min_tokens).
    min_tokens: int = 0
    # Completions with echo: the prompts (by prompt index) whose text opens each choice.
    echoed_prompts: tuple[str, ...] = ()
    # temperature 0: each sampled token is the most likely one.
    is_greedy: bool = False
    # Tokens each choice may generate (None when not given): a choice that
    # finished with "length" generated exactly this many.
    max_tokens: int | None = None


@dataclass(slots=True)
class ChunkMeta:
    """The fields of a JSON chunk that must agree across the stream."""

    number: int
    id: Any
    created: Any
    model: Any
    object: Any
    num_choices: int
    # The chunk's usage object (None when absent or null).
    usage: dict[str, Any] | None
    is_error: bool
    time_s: float


@dataclass(slots=True)
class ChoiceChunk:
    """One choice inside one chunk."""

    number: int
    text: str
    # Chat: delta.role when present.
    role: str | None
    has_finish_key: bool
    # The raw value: None, "stop", "length", or a wrong one such as "".
    finish_reason: Any
    # None when the chunk carried no logprobs.
    logprobs: list[LogprobEntry] | None
    # Usage of the chunk when it holds this choice alone (continuous usage is per index).
    usage: dict[str, Any] | None
    time_s: float
    # Chat: the delta's (or message's) tool_calls entries, and its reasoning
    # text; a chunk may carry only these.
    tool_calls: list[Any] = field(default_factory=list)
    reasoning: str = ""
    # Completions whose logprobs came in chat's shape (`content: [...]`, as
    # llama-server sends them): read all the same, so every logprob check runs.
    has_chat_shaped_logprobs: bool = False

    @property
    def has_content(self) -> bool:
        has_other = bool(self.tool_calls) or bool(self.reasoning)
        return self.text != "" or bool(self.logprobs) or has_other


@dataclass(slots=True)
class StreamView:
    request: RequestShape
    chunks: list[ChunkMeta] = field(default_factory=list)
    choices: dict[int, list[ChoiceChunk]] = field(default_factory=dict)
    sse: SseParse | None = None

    def text(self, index: int) -> str:
        return "".join(chunk.text for chunk in self.choices.get(index, []))

    def texts(self) -> dict[int, str]:
        return {index: self.text(index) for index in self.choices}

    def echo_chars(self, index: int) -> int:
        """Characters of echoed prompt opening choice `index` (completions: index = prompt * n + j)."""
        prompts = self.request.echoed_prompts
        if not prompts:
            return 0
        per_prompt = max(1, self.request.num_choices // len(prompts))
        return len(prompts[min(index // per_prompt, len(prompts) - 1)])


def is_prompt_entry(entry: LogprobEntry, echo_chars: int) -> bool:
    """An echoed prompt token's entry: given, not sampled (nor counted as output)."""
    return entry.text_offset is not None and entry.text_offset < echo_chars


def request_shape(endpoint: str, body: dict[str, Any] | None) -> RequestShape:
    """What a body asked for; fields of the wrong type read as not asked (bad-input bodies)."""
    body = body if isinstance(body, dict) else {}
    is_chat = endpoint == CHAT
    n = body["n"] if _is_count(body.get("n")) else 1
    prompt = body.get("prompt")
    is_prompt_list = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], str)
    num_prompts = len(prompt) if is_prompt_list and not is_chat else 1
    options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    stops = body.get("stop")
    stops = [stops] if isinstance(stops, str) else stops if isinstance(stops, list) else []
    return RequestShape(
        is_chat=is_chat,
        is_stream=body.get("stream") is True,
        num_choices=num_prompts * n,
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(
            options.get("include_usage") and options.get("continuous_usage_stats")
        ),
        top_logprobs=_top_logprobs(is_chat, body),
        stops=tuple(stop for stop in stops if isinstance(stop, str) and stop),
        include_stop_str=body.get("include_stop_str_in_output") is True,
        min_tokens=body["min_tokens"] if _is_count(body.get("min_tokens")) else 0,
        echoed_prompts=_echoed_prompts(is_chat, body),
        is_greedy=_is_zero(body.get("temperature")),
        max_tokens=body["max_tokens"] if _is_count(body.get("max_tokens")) else None,
    )


def _is_zero(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def _echoed_prompts(is_chat: bool, body: dict[str, Any]) -> tuple[str, ...]:
    if is_chat or body.get("echo") is not True:
        return ()
    prompt = body.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
    return tuple(p for p in prompts if isinstance(p, str))


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _top_logprobs(is_chat: bool, body: dict[str, Any]) -> int | None:
    if is_chat:
        if body.get("logprobs") is not True:
            return None
        return body["top_logprobs"] if _is_count(body.get("top_logprobs")) else 0
    return body["logprobs"] if _is_count(body.get("logprobs")) else None


# id(exchange) -> its view, for exchanges still alive (a finalizer drops the
# entry before the id can be reused). Views are read many times per exchange
# (every check, the metrics, the twin's comparisons) and never change once the
# response is complete.
_VIEWS: dict[int, StreamView] = {}


def view_of(exchange: Exchange) -> StreamView:
    """The exchange's view, computed once (call it when the response is complete)."""
    key = id(exchange)
    view = _VIEWS.get(key)
    if view is None:
        view = _VIEWS[key] = view_exchange(exchange)
        weakref.finalize(exchange, _VIEWS.pop, key, None)
    return view


def view_exchange(exchange: Exchange) -> StreamView:
    view = StreamView(request=request_shape(exchange.endpoint, exchange.body))
    if exchange.endpoint == OLLAMA_CHAT:
        return view  # NDJSON lines, no SSE: read by checks/ollama.py
    if exchange.endpoint in AGENT_ENDPOINTS:
        # No choices to read: only the events, for the findings to quote.
        if exchange.is_stream and exchange.status == 200:
            view.sse = parse_sse(exchange.raw)
        return view
    if exchange.is_stream and exchange.status == 200:
        _fill_stream(view, exchange)
    elif exchange.is_ok:
        _fill_nonstream(view, exchange)
    return view


def _fill_stream(view: StreamView, exchange: Exchange) -> None:
    view.sse = parse_sse(exchange.raw)
    for event in view.sse.events:
        if not isinstance(event.payload, dict):
            continue
        time_s = event_time_s(event, exchange.arrival_offsets, exchange.arrival_times_s)
        _add_chunk(view, event.number, event.payload, time_s)


def _fill_nonstream(view: StreamView, exchange: Exchange) -> None:
    try:
        payload = json.loads(exchange.raw)
    except ValueError:
        return
    if isinstance(payload, dict):
        _add_chunk(view, 0, payload, exchange.end_s)


def _add_chunk(view: StreamView, number: int, payload: dict[str, Any], time_s: float) -> None:
    choices = payload.get("choices")
    choices = choices if isinstance(choices, list) else []
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else None
    view.chunks.append(
        ChunkMeta(
            number=number,
            id=payload.get("id", MISSING),
            created=payload.get("created", MISSING),
            model=payload.get("model", MISSING),
            object=payload.get("object", MISSING),
            num_choices=len(choices),
            usage=usage,
            is_error="error" in payload,
            time_s=time_s,
        )
    )
    for choice in choices:
        if isinstance(choice, dict) and isinstance(choice.get("index"), int):
            chunk = _choice_chunk(view.request.is_chat, number, choice, time_s)
            chunk.usage = usage if len(choices) == 1 else None
            view.choices.setdefault(choice["index"], []).append(chunk)


def _choice_chunk(is_chat: bool, number: int, choice: dict[str, Any], time_s: float) -> ChoiceChunk:
    chat_shaped = None
    if is_chat:
        delta = choice.get("delta") or choice.get("message") or {}
        text, role = delta.get("content"), delta.get("role")
        entries = chat_entries(choice.get("logprobs"))
    else:
        text, role = choice.get("text"), None
        entries = completion_entries(choice.get("logprobs"))
        chat_shaped = chat_entries(choice.get("logprobs")) if entries is None else None
        entries = entries if chat_shaped is None else chat_shaped
    chunk = ChoiceChunk(
        number=number,
        text=text if isinstance(text, str) else "",
        role=role if isinstance(role, str) else None,
        has_finish_key="finish_reason" in choice,
        finish_reason=choice.get("finish_reason"),
        logprobs=entries,
        usage=None,
        time_s=time_s,
    )
    chunk.has_chat_shaped_logprobs = chat_shaped is not None
    if is_chat:
        tool_calls = delta.get("tool_calls")
        chunk.tool_calls = tool_calls if isinstance(tool_calls, list) else []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        chunk.reasoning = reasoning if isinstance(reasoning, str) else ""
    return chunk
