"""Checks of Ollama's API answers (POST /api/chat): NDJSON lines, the final
line's counts, the stream against its non-streamed twin, the error shape.

Invariants (the ids are in catalogue.py):
- `ollama_framing`: a 200 stream is `application/x-ndjson`, each line one JSON
  object, no blank line, the body ending with a newline;
- `ollama_done`: every line but the last says `done: false`, the last
  `done: true` with a `done_reason`; an `{"error": ...}` line ends a failed
  stream and is reported by itself;
- `ollama_empty_line` (strict): a `done: false` line that carries nothing
  (no content, thinking or tool calls): a merged reader's line is larger,
  never empty;
- `ollama_eval_count`: the final line (or body) carries integer
  `prompt_eval_count` and `eval_count`, `eval_count` at most
  `options.num_predict`, and exactly it when `done_reason` is "length": the
  count is the tokens sent;
- `ollama_stream_mismatch` (note, determinism): the lines' concatenated
  content, thinking and tool calls, `done_reason` and `eval_count` equal the
  same greedy request non-streamed;
- `ollama_error_shape`: a 4xx body is `{"error": "message"}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sluice.audit.checks.evidence import finding
from sluice.audit.records import OLLAMA_CHAT, Exchange, Finding
from sluice.audit.stream_view import StreamView

NDJSON_MEDIA_TYPE = "application/x-ndjson"
_QUOTE_CHARS = 160


@dataclass(slots=True)
class OllamaAnswer:
    """A stream's lines (or a body) read as the `ollama` client reads them."""

    # (line number from 1, the line's object); lines that are no object are problems.
    lines: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    # (check id, line number, message)
    problems: list[tuple[str, int, str]] = field(default_factory=list)

    @property
    def final(self) -> dict[str, Any] | None:
        return self.lines[-1][1] if self.lines and self.lines[-1][1].get("done") else None

    def message(self) -> dict[str, Any]:
        """Content, thinking and tool calls summed over the lines."""
        content, thinking = "", ""
        calls: list[Any] = []
        for _, line in self.lines:
            message = line.get("message") or {}
            content += _text(message.get("content"))
            thinking += _text(message.get("thinking"))
            calls += message.get("tool_calls") or []
        return {"content": content, "thinking": thinking, "tool_calls": calls}


def read_answer(exchange: Exchange) -> OllamaAnswer:
    answer = OllamaAnswer()
    raw = exchange.raw
    if not exchange.is_stream:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if isinstance(body, dict):
            answer.lines.append((1, body))
        else:
            answer.problems.append(("ollama_framing", 1, "the body is not one JSON object"))
        return answer
    if raw and not raw.endswith(b"\n"):
        answer.problems.append(("ollama_framing", 0, "the stream does not end with a newline"))
    for number, line in enumerate(raw.split(b"\n")[:-1] if raw else [], start=1):
        try:
            payload = json.loads(line)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            answer.problems.append(("ollama_framing", number, "a line is not one JSON object"))
            continue
        answer.lines.append((number, payload))
    return answer


def check_ollama_status(exchange: Exchange, view: StreamView) -> list[Finding]:
    """A 4xx answer is Ollama's `{"error": "message"}`."""
    if exchange.endpoint != OLLAMA_CHAT or exchange.status is None:
        return []
    if not 400 <= exchange.status < 500:
        return []
    try:
        error = json.loads(exchange.raw)
    except ValueError:
        error = None
    if isinstance(error, dict) and set(error) == {"error"} and isinstance(error["error"], str):
        return []
    message = f'{exchange.status} body is not {{"error": message}}'
    return [finding("ollama_error_shape", exchange, message, evidence=[_quote(exchange.raw)])]


def check_ollama_stream(exchange: Exchange, view: StreamView) -> list[Finding]:
    if exchange.endpoint != OLLAMA_CHAT or not exchange.is_ok:
        return []
    answer = read_answer(exchange)
    problems = list(answer.problems)
    if exchange.is_stream:
        if not exchange.content_type.startswith(NDJSON_MEDIA_TYPE):
            problems.append(("ollama_framing", 0, f"Content-Type {exchange.content_type!r}"))
        problems += _line_problems(answer)
    problems += _count_problems(answer, exchange.body or {})
    return [
        finding(check_id, exchange, message, [number] if number else [],
                evidence=[_quote_line(answer, number)] if number else [])
        for check_id, number, message in problems
    ]  # fmt: skip


def check_ollama_twin(exchange: Exchange, view: StreamView) -> list[Finding]:
    """A greedy stream's answer equals the same request non-streamed."""
    twin = exchange.twin
    if exchange.endpoint != OLLAMA_CHAT or not exchange.is_stream or not exchange.is_ok:
        return []
    if twin is None or not twin.is_ok or exchange.reader == "abandon":
        return []
    streamed, whole = read_answer(exchange), read_answer(twin)
    if streamed.final is None or whole.final is None:
        return []  # the stream's own checks report it
    differences = [
        name
        for name, mine, theirs in (
            ("content", streamed.message()["content"], _text(_message(whole)["content"])),
            ("thinking", streamed.message()["thinking"], _text(_message(whole).get("thinking"))),
            ("tool_calls", streamed.message()["tool_calls"], _message(whole).get("tool_calls") or []),
            ("done_reason", streamed.final.get("done_reason"), whole.final.get("done_reason")),
            ("eval_count", streamed.final.get("eval_count"), whole.final.get("eval_count")),
        )
        if mine != theirs
    ]  # fmt: skip
    if not differences:
        return []
    message = f"the stream differs from its non-streamed twin in {', '.join(differences)}"
    return [finding("ollama_stream_mismatch", exchange, message, evidence=[])]


def _line_problems(answer: OllamaAnswer) -> list[tuple[str, int, str]]:
    problems: list[tuple[str, int, str]] = []
    if any("error" in line for _, line in answer.lines):
        return problems  # a failed stream: the error line says why
    if answer.final is None:
        last = answer.lines[-1][0] if answer.lines else 0
        problems.append(("ollama_done", last, "the last line is not `done: true`"))
    for number, line in answer.lines[:-1]:
        if line.get("done") is not False:
            problems.append(("ollama_done", number, "a line before the last is not `done: false`"))
        elif not _carries_output(line):
            problems.append(("ollama_empty_line", number, "a `done: false` line carries nothing"))
    return problems


def _count_problems(answer: OllamaAnswer, body: dict[str, Any]) -> list[tuple[str, int, str]]:
    final = answer.final
    if final is None:
        return []
    number = answer.lines[-1][0]
    counts = {name: final.get(name) for name in ("prompt_eval_count", "eval_count")}
    missing = [name for name, value in counts.items() if not _is_count(value)]
    if missing:
        return [("ollama_eval_count", number, f"the final line lacks {', '.join(missing)}")]
    if final.get("done_reason") is None:
        return [("ollama_done", number, "the final line has no done_reason")]
    num_predict = (body.get("options") or {}).get("num_predict")
    eval_count = counts["eval_count"]
    if not isinstance(num_predict, int) or not isinstance(eval_count, int) or num_predict < 0:
        return []
    if eval_count > num_predict or (final["done_reason"] == "length" and eval_count != num_predict):
        message = (
            f"eval_count {eval_count} with num_predict {num_predict} and done_reason "
            f"{final['done_reason']!r}"
        )
        return [("ollama_eval_count", number, message)]
    return []


def _carries_output(line: dict[str, Any]) -> bool:
    message = line.get("message") or {}
    return bool(message.get("content") or message.get("thinking") or message.get("tool_calls"))


def _message(answer: OllamaAnswer) -> dict[str, Any]:
    final = answer.final or {}
    message = final.get("message")
    return message if isinstance(message, dict) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _quote_line(answer: OllamaAnswer, number: int) -> str:
    line = next((json.dumps(payload) for n, payload in answer.lines if n == number), "")
    return f"#{number} {line[:_QUOTE_CHARS]}"


def _quote(raw: bytes) -> str:
    return raw[:_QUOTE_CHARS].decode("utf-8", errors="replace")
