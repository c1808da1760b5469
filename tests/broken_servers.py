"""Deliberately broken OpenAI-compatible servers, for testing `sluice audit`.

`ScriptServer` answers completions and chat (streamed or not, n, list prompts,
stop strings, logprobs, usage options), the agent APIs (/v1/responses and
/v1/messages, from tests/agent_script.py), /health, /v1/models and /metrics. It
"generates" by reading a fixed script of byte-level tokens (emoji, CJK and
Thai characters split across tokens) from an offset chosen by the prompt, so
every answer is deterministic and streamed == non-streamed. A simulated GPU
makes each token cost `token_delay_s` times the number of running requests.

With `Defect.NONE` it follows STREAMING_CONTRACT.md; every other `Defect`
breaks exactly one rule, the way real servers have broken it. Every server
coalesces as sluice does: while a stream's client is behind (its socket
backs up), the steps generated meanwhile wait and go out as one chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import json
import socket
import struct
import termios
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sluice.audit.records import Exchange


class Defect(enum.Enum):
    NONE = "none"
    ALIASING = "aliasing"  # a delta re-sent in place of the next one, usage frozen
    SPLIT_UTF8 = "split_utf8"  # each chunk decoded alone: split characters become U+FFFD
    STOP_PREFIX_LEAK = "stop_prefix_leak"  # the start of a stop string is sent, never retracted
    USAGE_UNREQUESTED = "usage_unrequested"  # usage on every chunk when not asked
    DONE_MISSING = "done_missing"
    FINISH_TWICE = "finish_twice"
    ROLE_REPEATED = "role_repeated"
    LOGPROBS_COPIED = "logprobs_copied"  # token 0's logprobs copied onto the chunk's other tokens
    # Each streamed token carries the alternatives of the token before it (its own logprob kept).
    LOGPROBS_SHIFTED = "logprobs_shifted"
    # Streamed logprobs shift with the number of requests running: not batch-invariant,
    # which the contract allows (the determinism figure shows it).
    BATCH_VARIANT = "batch_variant"
    # One token per chunk while the client keeps up; when its socket backs up
    # (a slow reader), the tokens waiting merge into one chunk in which each
    # token carries the alternatives of the token before it: the seed's own
    # failure, invisible to fast readers and to one-token chunks.
    LOGPROBS_SHIFTED_WHEN_BACKED_UP = "logprobs_shifted_when_backed_up"
    # The same, but each token of a merged chunk carries the first token's
    # alternatives (its own token and logprob kept).
    LOGPROBS_TOP_COPIED_WHEN_BACKED_UP = "logprobs_top_copied_when_backed_up"
    # Multi-prompt completions streams open with `data: null` (llama-server).
    DATA_NULL = "data_null"
    DISCONNECT_KEEPS_GENERATING = "disconnect_keeps_generating"
    BAD_INPUT_500 = "bad_input_500"
    BAD_INPUT_422 = "bad_input_422"
    # The agent APIs (tests/agent_script.py builds their answers).
    # vLLM PR #45386: a stream cut by max_output_tokens ends with response.completed.
    RESPONSES_COMPLETED_WHEN_TRUNCATED = "responses_completed_when_truncated"
    # vLLM #30099: the text deltas do not add up to the done text (one is lost).
    RESPONSES_DELTA_LOST = "responses_delta_lost"
    # SGLang #24293: a tool_use block's input streamed as text_delta.
    MESSAGES_TEXT_DELTA_ON_TOOL_USE = "messages_text_delta_on_tool_use"


# Defects seen only in the chunks merged while a client is behind: one token
# per chunk while it keeps up, so that nothing else shows them.
_WHEN_BACKED_UP = frozenset(
    {Defect.LOGPROBS_SHIFTED_WHEN_BACKED_UP, Defect.LOGPROBS_TOP_COPIED_WHEN_BACKED_UP}
)
MODEL = "script-model"
SMALL_SEND_BUFFER_BYTES = 4096
# Bytes in the kernel's send queue that mean a backlog, not a few events in
# flight to a client that keeps up.
BACKLOG_BYTES = 2048
CHUNK_SIZES = (1, 2, 3, 1, 4)  # tokens per chunk, cycling: multi-token chunks
_PIECES = (
    ("Once", " upon", " a", " time", ",", " a", " fox"),
    (" \U0001f98a", 3),  # split after 3 bytes
    (" met", " a", " cat", " in"),
    (" 東京", 4),
    (".", " They", " said", " สวัสดี", " and", " waved"),
    (" \U0001f30d", 2),
    (
        " together",
        ",",
        " then",
        " walked",
        " home",
        ".",
        "\n",
        "The",
        " end",
        " came",
        " soon",
        ".",
    ),
    (" 北京", 5),
    (" was", " far", " away", "!"),
)


def _script() -> tuple[bytes, ...]:
    tokens: list[bytes] = []
    for piece in _PIECES:
        if isinstance(piece[1], int):
            data = piece[0].encode()
            tokens += [data[: piece[1]], data[piece[1] :]]
        else:
            tokens += [text.encode() for text in piece]
    return tuple(tokens)


SCRIPT = _script()
# Offsets where a character starts: generation never begins mid-character.
_STARTS = tuple(i for i, token in enumerate(SCRIPT) if token[:1].decode("utf-8", "ignore"))


@dataclass(slots=True)
class Token:
    data: bytes
    logprob: float
    position: int
    # The token whose alternatives this one's entry shows (LOGPROBS_SHIFTED); None: its own.
    top_source: Token | None = None


@dataclass(slots=True)
class Step:
    """One chunk of one choice."""

    tokens: list[Token]
    text: str
    finish: str | None
    # Tokens delivered for this choice once this chunk is out (continuous usage).
    completion_tokens: int


def script_tokens(prompt: str, max_tokens: int) -> list[Token]:
    start = _STARTS[zlib.crc32(prompt.encode()) % len(_STARTS)]
    tokens = []
    for position in range(max_tokens):
        data = SCRIPT[(start + position) % len(SCRIPT)]
        logprob = -0.05 - (zlib.crc32(data + position.to_bytes(4, "little")) % 400) / 100
        tokens.append(Token(data, round(logprob, 4), position))
    return tokens


def complete_text(data: bytes) -> str:
    """The text of `data` without an incomplete last character."""
    for cut in range(4):
        try:
            return data[: len(data) - cut].decode()
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", "replace")


def _first_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
    hits = [(text.find(s) + len(s), text.find(s), s) for s in stops if s and s in text]
    return min(hits)[1:] if hits else None


def run_until_stop(
    tokens: list[Token], stops: list[str], include: bool, min_tokens: int = 0
) -> tuple[list[Token], str, str]:
    """(generated tokens, final text, finish reason) of one greedy choice.
    Stop strings count from token min_tokens + 1 on (vLLM's min_tokens)."""
    data = b""
    for count, token in enumerate(tokens, start=1):
        data += token.data
        hit = _first_stop(complete_text(data), stops) if count > min_tokens else None
        if hit is not None:
            position, stop = hit
            text = complete_text(data)
            return tokens[:count], text[: position + len(stop) if include else position], "stop"
    return tokens, data.decode("utf-8", "replace"), "length"


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that may still become a stop string."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def plan_choice(
    prompt: str, max_tokens: int, stops: list[str], include: bool, defect: Defect
) -> list[Step]:
    generated, final_text, finish = run_until_stop(
        script_tokens(prompt, max_tokens), stops, include
    )
    groups, position = [], 0
    sizes = (1,) if defect in _WHEN_BACKED_UP else CHUNK_SIZES
    while position < len(generated):
        size = sizes[len(groups) % len(sizes)]
        groups.append(generated[position : position + size])
        position += size
    if defect is Defect.SPLIT_UTF8 and not stops:
        return _naive_steps(groups, finish)
    steps, pending, data, sent, count = [], [], b"", 0, 0
    for number, group in enumerate(groups):
        pending += group
        data += b"".join(token.data for token in group)
        count += len(group)
        is_last = number == len(groups) - 1
        visible = complete_text(data)
        if defect is not Defect.STOP_PREFIX_LEAK:
            visible = visible[: len(visible) - _held_back(visible, stops)]
        visible = final_text if is_last else visible
        if visible[sent:] or is_last:
            steps.append(Step(pending, visible[sent:], finish if is_last else None, count))
            pending, sent = [], max(sent, len(visible))
    return steps


def _naive_steps(groups: list[list[Token]], finish: str) -> list[Step]:
    steps, count = [], 0
    for number, group in enumerate(groups):
        count += len(group)
        text = b"".join(token.data for token in group).decode("utf-8", "replace")
        steps.append(Step(group, text, finish if number == len(groups) - 1 else None, count))
    return steps


def _token_string(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{byte:02x}" for byte in data)


def _alternatives(token: Token, top: int) -> list[tuple[str, float, bytes]]:
    own = (_token_string(token.data), token.logprob, token.data)
    others = [
        (f" alt{k}", round(token.logprob - 0.5 * k, 4), f" alt{k}".encode()) for k in range(1, top)
    ]
    return [own, *others][:top]


def chat_logprobs(tokens: list[Token], top: int, copy_first: bool) -> dict[str, Any]:
    content = []
    for token in tokens:
        source = tokens[0] if copy_first else token
        alternatives = [
            {"token": t, "logprob": lp, "bytes": list(b)}
            for t, lp, b in _alternatives(source.top_source or source, top)
        ]
        content.append(
            {
                "token": _token_string(token.data),
                "logprob": source.logprob,
                "bytes": list(token.data),
                "top_logprobs": alternatives,
            }
        )
    return {"content": content}


def completion_logprobs(
    tokens: list[Token], top: int, copy_first: bool, offset_bytes: bytes
) -> dict[str, Any]:
    out: dict[str, list[Any]] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    data = offset_bytes
    for token in tokens:
        source = tokens[0] if copy_first else token
        out["tokens"].append(_token_string(token.data))
        out["token_logprobs"].append(source.logprob)
        alternatives = _alternatives(source.top_source or source, top)
        out["top_logprobs"].append({t: lp for t, lp, _ in alternatives})
        out["text_offset"].append(len(complete_text(data)))
        data += token.data
    return out


# --- Validation ---------------------------------------------------------------------------

_NUMBER = (int, float)


def _is_number(value: Any, low: float, high: float) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool) and low <= value <= high


def _is_count(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def invalid_param(kind: str, body: dict[str, Any]) -> str | None:
    """The name of the first invalid field, None when the request is valid."""
    rules: list[tuple[str, bool]] = [
        ("max_tokens", body.get("max_tokens") is None or _is_count(body["max_tokens"], 1, 100_000)),
        ("n", body.get("n") is None or _is_count(body["n"], 1, 16)),
        ("temperature", body.get("temperature") is None or _is_number(body["temperature"], 0, 2)),
        ("top_p", body.get("top_p") is None or _is_number(body["top_p"], 1e-9, 1)),
        ("stream", body.get("stream") is None or isinstance(body["stream"], bool)),
        ("stop", _is_stop(body.get("stop"))),
        ("stream_options", _is_stream_options(body)),
    ]
    if kind == "chat":
        rules += [
            ("messages", _is_messages(body.get("messages"))),
            ("logprobs", body.get("logprobs") is None or isinstance(body["logprobs"], bool)),
            (
                "top_logprobs",
                body.get("top_logprobs") is None or _is_count(body["top_logprobs"], 0, 20),
            ),
        ]
    else:
        rules += [
            ("prompt", _is_prompt(body.get("prompt"))),
            ("logprobs", body.get("logprobs") is None or _is_count(body["logprobs"], 0, 20)),
        ]
    return next((name for name, is_valid in rules if not is_valid), None)


def _is_stop(stop: Any) -> bool:
    return (
        stop is None
        or isinstance(stop, str)
        or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    )


def _is_stream_options(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return options is None or (isinstance(options, dict) and body.get("stream") is True)


def _is_messages(messages: Any) -> bool:
    roles = {"system", "user", "assistant"}
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(
            isinstance(m, dict) and m.get("role") in roles and isinstance(m.get("content"), str)
            for m in messages
        )
    )


def _is_prompt(prompt: Any) -> bool:
    return isinstance(prompt, str) or (
        isinstance(prompt, list) and bool(prompt) and all(isinstance(p, str) for p in prompt)
    )


# --- The server ----------------------------------------------------------------------------


@dataclass(slots=True)
class Call:
    """One validated request."""

    kind: str  # "completion" or "chat"
    body: dict[str, Any]
    prompts: list[str]
    n: int
    top: int | None
    id: str
    created: int

    @property
    def options(self) -> dict[str, Any]:
        return self.body.get("stream_options") or {}


class ScriptServer:
    def __init__(
        self,
        defect: Defect = Defect.NONE,
        *,
        token_delay_s: float = 0.001,
        ignores: frozenset[str] = frozenset(),
        answers_any_model: bool = False,
        serves_agent_apis: bool = True,
        exports_gauge: bool = True,
        coalesces: bool = True,
    ):
        self.defect = defect
        # False: /v1/responses and /v1/messages are not routed (404), as on
        # servers that speak only chat and completions.
        self.serves_agent_apis = serves_agent_apis
        self.token_delay_s = token_delay_s
        # vLLM extensions this server does not know (it drops the fields, as
        # llama-server does): continuous_usage_stats, include_stop_str_in_output,
        # min_tokens, prompt_logprobs, and stop_reason (an output field).
        self.ignores = ignores
        self.answers_any_model = answers_any_model
        # False: /metrics has no running-requests gauge (abort not verifiable).
        self.exports_gauge = exports_gauge
        # False: every step is written as it comes, however far behind the client is.
        self.coalesces = coalesces
        self.running = 0  # requests generating now: the simulated GPU's load
        self._calls = 0
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        if self.serves_agent_apis:
            app.router.add_post("/v1/responses", self._responses)
            app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        return await self._plain("")

    async def _models(self, request: web.Request) -> web.Response:
        return await self._json({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        gauge = f"script_num_requests_running {self.running}\n" if self.exports_gauge else ""
        return await self._plain(f"script_requests_total {self._calls}\n{gauge}")

    async def _plain(self, text: str) -> web.Response:
        return web.Response(text=text)

    async def _json(self, payload: Any, status: int = 200) -> web.Response:
        return web.Response(
            text=json.dumps(payload), status=status, content_type="application/json"
        )

    async def _error(self, status: int, message: str, param: str | None) -> web.Response:
        if self.defect is Defect.BAD_INPUT_500:
            return web.Response(text="Internal Server Error", status=500)
        if self.defect is Defect.BAD_INPUT_422:
            return await self._json({"detail": [{"loc": ["body", param], "msg": message}]}, 422)
        error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
        return await self._json({"error": error}, status)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completion")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._agent(request, "responses")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._agent(request, "messages")

    async def _agent(self, request: web.Request, kind: str) -> web.StreamResponse:
        from tests import agent_script  # it builds on this module: imported once needed

        try:
            body = json.loads(await request.read())
        except ValueError:
            return await self._error(400, "malformed JSON", None)
        if kind == "messages" and not isinstance(body.get("max_tokens"), int):
            error = {"type": "invalid_request_error", "message": "max_tokens: field required"}
            return await self._json({"type": "error", "error": error}, 400)
        if kind == "messages":
            prompt = " ".join(str(m.get("content")) for m in body.get("messages") or [])
            answer = agent_script.answer_for(prompt, body["max_tokens"], body)
            events, final = agent_script.messages_events(answer, self.defect)
        else:
            limit = body.get("max_output_tokens") or 16
            answer = agent_script.answer_for(str(body.get("input")), limit, body)
            is_stream = body.get("stream") is True
            events, final = agent_script.responses_events(answer, body, self.defect, is_stream)
        if body.get("stream") is not True:
            return await self._json(final)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await self._gpu(1)
            with contextlib.suppress(ConnectionError):
                await response.write(agent_script.encode(event))
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    async def _handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return await self._error(400, "malformed JSON", None)
        if not isinstance(body, dict):
            return await self._error(400, "the body must be a JSON object", None)
        if body.get("model") != MODEL and not self.answers_any_model:
            return await self._error(404, f"model {body.get('model')!r} does not exist", "model")
        for name in self.ignores:
            body.pop(name, None)
            if isinstance(body.get("stream_options"), dict):
                body["stream_options"].pop(name, None)
        if (param := invalid_param(kind, body)) is not None:
            return await self._error(400, f"invalid {param}", param)
        call = self._call(kind, body)
        if body.get("stream"):
            return await self._stream(request, call)
        return await self._complete(call)

    def _call(self, kind: str, body: dict[str, Any]) -> Call:
        self._calls += 1
        if kind == "chat":
            prompts = [" ".join(m["content"] for m in body["messages"])]
            top = (body.get("top_logprobs") or 0) if body.get("logprobs") else None
        else:
            prompts = [body["prompt"]] if isinstance(body["prompt"], str) else body["prompt"]
            top = body.get("logprobs")
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        return Call(
            kind,
            body,
            prompts,
            body.get("n") or 1,
            top,
            f"{prefix}-{self._calls}",
            int(time.time()),
        )

    def _plans(self, call: Call) -> list[list[Step]]:
        stops = call.body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        include = bool(call.body.get("include_stop_str_in_output"))
        max_tokens = call.body.get("max_tokens") or 16
        return [
            plan_choice(prompt, max_tokens, stops, include, self.defect)
            for prompt in call.prompts
            for _ in range(call.n)
        ]

    async def _gpu(self, num_tokens: int) -> None:
        await asyncio.sleep(self.token_delay_s * num_tokens * max(self.running, 1))

    # --- Non-streamed ----------------------------------------------------------------------

    async def _complete(self, call: Call) -> web.Response:
        stops = call.body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        include = bool(call.body.get("include_stop_str_in_output"))
        choices, completion_tokens = [], 0
        for index in range(len(call.prompts) * call.n):
            prompt = call.prompts[index // call.n]
            tokens = script_tokens(prompt, call.body.get("max_tokens") or 16)
            min_tokens = call.body.get("min_tokens") or 0
            generated, text, finish = run_until_stop(tokens, stops, include, min_tokens)
            completion_tokens += len(generated)
            choice = self._final_choice(call, index, generated, text, finish)
            if "stop_reason" not in self.ignores:
                choice["stop_reason"] = _stop_reason(generated, stops, finish)
            if call.body.get("prompt_logprobs") is not None:
                words = prompt.split()
                choice["prompt_logprobs"] = [None] + [{word: -1.0} for word in words[1:]]
            choices.append(choice)
        self.running += 1
        try:
            await self._gpu(completion_tokens)
        finally:
            self.running -= 1
        kind = "chat.completion" if call.kind == "chat" else "text_completion"
        payload = {
            "id": call.id,
            "object": kind,
            "created": call.created,
            "model": MODEL,
            "choices": choices,
        }
        payload["usage"] = _usage(_prompt_tokens(call), completion_tokens)
        return await self._json(payload)

    def _final_choice(
        self, call: Call, index: int, tokens: list[Token], text: str, finish: str
    ) -> dict[str, Any]:
        if call.kind == "chat":
            logprobs = chat_logprobs(tokens, call.top, False) if call.top is not None else None
            message = {"role": "assistant", "content": text}
            return {
                "index": index,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish,
            }
        logprobs = (
            completion_logprobs(tokens, call.top, False, b"") if call.top is not None else None
        )
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    # --- Streamed --------------------------------------------------------------------------

    async def _stream(self, request: web.Request, call: Call) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.running += 1
        try:
            is_backed_up = _backlog_probe(request)
            for num_tokens, payload in self._events(call, is_backed_up):
                await self._gpu(num_tokens)
                if payload is None:
                    continue  # generated, held back for a client that is behind
                data = (
                    payload
                    if isinstance(payload, bytes)
                    else json.dumps(payload, ensure_ascii=False).encode()
                )
                try:
                    await response.write(b"data: " + data + b"\n\n")
                except ConnectionError:
                    if self.defect is not Defect.DISCONNECT_KEEPS_GENERATING:
                        return response  # the client left: stop generating
        finally:
            self.running -= 1
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    def _events(
        self, call: Call, is_backed_up: Callable[[], bool]
    ) -> Iterator[tuple[int, dict[str, Any] | bytes | None]]:
        """(tokens this event costs, payload) in stream order; None: nothing
        written (tokens held for a client that is behind)."""
        plans = [self._defective(steps) for steps in self._plans(call)]
        if self.defect is Defect.DATA_NULL and len(call.prompts) > 1:
            yield 0, b"null"
        if call.kind == "chat":
            for index in range(len(plans)):
                role = {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                yield 0, self._chunk(call, [role], index, 0)
        sent_bytes = [b""] * len(plans)
        held: list[list[Step]] = [[] for _ in plans]
        for round_number in range(max(len(steps) for steps in plans)):
            for index, steps in enumerate(plans):
                if round_number < len(steps):
                    step = steps[round_number]
                    held[index].append(step)
                    if self.coalesces and is_backed_up() and round_number < len(steps) - 1:
                        yield len(step.tokens), None
                        continue
                    step, held[index] = _merged(held[index], self.defect), []
                    choice = self._stream_choice(call, index, step, sent_bytes[index])
                    sent_bytes[index] += b"".join(token.data for token in step.tokens)
                    yield (
                        len(step.tokens),
                        self._chunk(call, [choice], index, step.completion_tokens),
                    )
        if call.options.get("include_usage"):
            completion = sum(steps[-1].completion_tokens for steps in plans)
            yield 0, self._envelope(call, [], _usage(_prompt_tokens(call), completion))
        if self.defect is not Defect.DONE_MISSING:
            yield 0, b"[DONE]"

    def _defective(self, steps: list[Step]) -> list[Step]:
        if self.defect is Defect.ALIASING:
            # The aliasing bug: a slot read again after its next delta overwrote it.
            for number in range(3, len(steps) - 1, 4):
                previous = steps[number - 1]
                steps[number] = Step(
                    previous.tokens, previous.text, None, previous.completion_tokens
                )
        if self.defect is Defect.LOGPROBS_SHIFTED:
            tokens = [token for step in steps for token in step.tokens]
            for previous, token in zip(tokens, tokens[1:], strict=False):
                token.top_source = previous
        if self.defect is Defect.FINISH_TWICE:
            last = steps[-1]
            steps.append(Step([], "", last.finish, last.completion_tokens))
        return steps

    def _stream_choice(
        self, call: Call, index: int, step: Step, sent_bytes: bytes
    ) -> dict[str, Any]:
        copy_first = self.defect is Defect.LOGPROBS_COPIED
        if self.defect is Defect.BATCH_VARIANT:
            shift = 0.001 * (self.running - 1)
            tokens = [Token(t.data, round(t.logprob - shift, 4), t.position) for t in step.tokens]
            step = Step(tokens, step.text, step.finish, step.completion_tokens)
        if call.kind == "chat":
            logprobs = (
                chat_logprobs(step.tokens, call.top, copy_first) if call.top is not None else None
            )
            delta: dict[str, Any] = {"content": step.text} if step.text else {}
            if self.defect is Defect.ROLE_REPEATED:
                delta["role"] = "assistant"
            return {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": step.finish,
            }
        logprobs = (
            completion_logprobs(step.tokens, call.top, copy_first, sent_bytes)
            if call.top is not None
            else None
        )
        return {
            "index": index,
            "text": step.text,
            "logprobs": logprobs,
            "finish_reason": step.finish,
        }

    def _chunk(
        self, call: Call, choices: list[dict[str, Any]], index: int, completion_tokens: int
    ) -> dict[str, Any]:
        options = call.options
        is_continuous = options.get("include_usage") and options.get("continuous_usage_stats")
        is_leaking = self.defect is Defect.USAGE_UNREQUESTED and not options.get("include_usage")
        prompt_tokens = len(call.prompts[index // call.n].split()) + 1
        usage = _usage(prompt_tokens, completion_tokens) if is_continuous or is_leaking else None
        return self._envelope(call, choices, usage)

    def _envelope(
        self, call: Call, choices: list[dict[str, Any]], usage: dict[str, int] | None
    ) -> dict[str, Any]:
        kind = "chat.completion.chunk" if call.kind == "chat" else "text_completion"
        payload = {
            "id": call.id,
            "object": kind,
            "created": call.created,
            "model": MODEL,
            "choices": choices,
        }
        if usage is not None:
            payload["usage"] = usage
        return payload


def _backlog_probe(request: web.Request) -> Callable[[], bool]:
    """Whether bytes wait to be taken by the client: in our transport's buffer
    or, unsent, in the kernel's send queue (the client's receive window is
    closed). A small kernel send buffer makes a slow reader show up quickly."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if transport is None or sock is None:
        return lambda: False
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_SEND_BUFFER_BYTES)

    def is_backed_up() -> bool:
        if transport.is_closing() or sock.fileno() < 0:
            return False  # the client left
        queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        return transport.get_write_buffer_size() > 0 or queued > BACKLOG_BYTES

    return is_backed_up


def _merged(steps: list[Step], defect: Defect) -> Step:
    """Held steps as one chunk. LOGPROBS_SHIFTED_WHEN_BACKED_UP: each token after
    the first shows its predecessor's alternatives; LOGPROBS_TOP_COPIED_WHEN_BACKED_UP:
    the first token's."""
    if len(steps) == 1:
        return steps[0]
    tokens = [token for step in steps for token in step.tokens]
    for previous, token in zip(tokens, tokens[1:], strict=False):
        if defect is Defect.LOGPROBS_SHIFTED_WHEN_BACKED_UP:
            token.top_source = previous
        elif defect is Defect.LOGPROBS_TOP_COPIED_WHEN_BACKED_UP:
            token.top_source = tokens[0]
    text = "".join(step.text for step in steps)
    return Step(tokens, text, steps[-1].finish, steps[-1].completion_tokens)


def _stop_reason(generated: list[Token], stops: list[str], finish: str) -> str | None:
    """vLLM's stop_reason: the stop string that ended the choice."""
    text = complete_text(b"".join(token.data for token in generated))
    hit = _first_stop(text, stops) if finish == "stop" else None
    return hit[1] if hit is not None else None


def _prompt_tokens(call: Call) -> int:
    return sum(len(prompt.split()) + 1 for prompt in call.prompts)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@contextlib.contextmanager
def serving(defect: Defect = Defect.NONE, **kwargs: Any) -> Iterator[str]:
    """Run a ScriptServer on its own thread and event loop; yields its base URL."""
    server = ScriptServer(defect, **kwargs)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=10)
    finally:
        asyncio.run_coroutine_threadsafe(_shut_down(server), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


async def _shut_down(server: ScriptServer) -> None:
    """Stop the server, then end handlers still generating for clients long gone."""
    await server.stop()
    pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


# --- Hand-built responses, for unit tests of single checks ---------------------------------


def sse(*payloads: dict[str, Any] | bytes, done: bool = True) -> bytes:
    """A well-framed event stream of `payloads`, ending with [DONE] unless told not to."""
    events = [
        p if isinstance(p, bytes) else json.dumps(p, ensure_ascii=False).encode() for p in payloads
    ]
    if done:
        events.append(b"[DONE]")
    return b"".join(b"data: " + event + b"\n\n" for event in events)


def completion_chunk(
    index: int, text: str, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choice = {
        "index": index,
        "text": text,
        "logprobs": extra.pop("logprobs", None),
        "finish_reason": finish,
    }
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": MODEL,
        "choices": [choice],
        **extra,
    }


def chat_chunk(
    index: int, delta: dict[str, Any], finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": extra.pop("logprobs", None),
        "finish_reason": finish,
    }
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [choice],
        **extra,
    }


def usage_chunk(kind: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1" if kind == "chat" else "cmpl-1",
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": 1,
        "model": MODEL,
        "choices": [],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def recorded(endpoint: str, body: dict[str, Any], raw: bytes, **fields: Any) -> Exchange:
    """An exchange as the transport would record it: a 200 stream by default, one piece."""
    exchange = Exchange("unit", "server", endpoint, body, case="unit/case")
    exchange.status = fields.pop("status", 200)
    exchange.content_type = fields.pop(
        "content_type", "text/event-stream" if body.get("stream") else "application/json"
    )
    exchange.raw = raw
    exchange.arrival_offsets, exchange.arrival_times_s = [len(raw)], [0.5]
    exchange.sent_s, exchange.end_s = 0.0, 0.5
    for name, value in fields.items():
        setattr(exchange, name, value)
    return exchange
