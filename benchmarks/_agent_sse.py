"""What a replayed stream says: when its first content came, and its token counts.

`StreamWatch` reads the `data:` payloads of one server-sent-event stream in
any of the four dialects the replay sends, one at a time with the moment it
arrived, and keeps:
- the first content moment: the first event that carries generated output
  (Responses: any `response.*.delta`; Messages: `content_block_delta`;
  chat: a chunk whose delta has content, reasoning or tool calls;
  completions: a chunk with text, or its finish: a one-token probe whose
  token shows no text yet has still been computed);
- the prompt and cached token counts from the usage the stream reports
  (Responses: the final response's `usage.input_tokens` and
  `input_tokens_details.cached_tokens`; Messages: `message_start` and
  `message_delta` usage, where `input_tokens` leaves out the
  `cache_read_input_tokens`; chat and completions: the usage chunk's
  `prompt_tokens` and `prompt_tokens_details.cached_tokens`, or where a
  server sends none (llama-server) its `timings`: `prompt_n` computed,
  `cache_n` reused); and in any dialect llama-server's `timings.prompt_ms`,
  its own prefill time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class StreamFacts:
    """One replayed request, as its stream told it."""

    first_content_s: float | None = None  # since the request was sent
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    server_prefill_ms: float | None = None  # the server's own, where it reports one
    error: str | None = None


class StreamWatch:
    """Feed it each `data:` payload of one stream with its arrival time."""

    def __init__(self, dialect: str):
        if dialect not in ("responses", "messages", "chat", "completions"):
            raise ValueError(f"unknown dialect {dialect!r}")
        self.dialect = dialect
        self.facts = StreamFacts()

    def feed_line(self, line: str, elapsed_s: float) -> None:
        """One line of the stream (`event:` lines and blanks are skipped)."""
        if not line.startswith("data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == "[DONE]":
            return
        self.feed(json.loads(payload), elapsed_s)

    def feed(self, data: dict[str, Any], elapsed_s: float) -> None:
        if "error" in data and data.get("type") in (None, "error"):
            self.facts.error = json.dumps(data["error"])[:300]
            return
        if self.facts.first_content_s is None and self._is_content(data):
            self.facts.first_content_s = elapsed_s
        getattr(self, f"_usage_{self.dialect}")(data)
        timings = data.get("timings")  # llama-server's, on its last event in every dialect
        if isinstance(timings, dict) and timings.get("prompt_ms") is not None:
            self.facts.server_prefill_ms = timings["prompt_ms"]

    def _is_content(self, data: dict[str, Any]) -> bool:
        if self.dialect == "responses":
            kind = str(data.get("type", ""))
            return kind.startswith("response.") and kind.endswith(".delta")
        if self.dialect == "messages":
            return data.get("type") == "content_block_delta"
        choices = data.get("choices") or []
        if not choices:
            return False
        if self.dialect == "completions":
            # A probe's one token may decode to no text yet (part of a
            # character) or be the end: its finish marks it computed too.
            return bool(choices[0].get("text") or choices[0].get("finish_reason"))
        delta = choices[0].get("delta") or {}
        keys = ("content", "reasoning_content", "reasoning", "tool_calls")
        return any(delta.get(key) for key in keys)

    def _usage_responses(self, data: dict[str, Any]) -> None:
        usage = (data.get("response") or {}).get("usage")
        if usage:
            self.facts.num_prompt_tokens = usage.get("input_tokens")
            details = usage.get("input_tokens_details") or {}
            self.facts.num_cached_tokens = details.get("cached_tokens", 0)

    def _usage_messages(self, data: dict[str, Any]) -> None:
        usage = data.get("usage") or (data.get("message") or {}).get("usage")
        if not usage or usage.get("input_tokens") is None:
            return
        cached = usage.get("cache_read_input_tokens") or 0
        created = usage.get("cache_creation_input_tokens") or 0
        self.facts.num_prompt_tokens = usage["input_tokens"] + cached + created
        self.facts.num_cached_tokens = cached

    def _usage_chat(self, data: dict[str, Any]) -> None:
        usage = data.get("usage")
        if usage and usage.get("prompt_tokens") is not None:
            self.facts.num_prompt_tokens = usage["prompt_tokens"]
            details = usage.get("prompt_tokens_details") or {}
            self.facts.num_cached_tokens = details.get("cached_tokens") or 0
        timings = data.get("timings")
        if timings and timings.get("prompt_n") is not None:
            cached = timings.get("cache_n") or 0
            if self.facts.num_prompt_tokens is None:
                self.facts.num_prompt_tokens = timings["prompt_n"] + cached
                self.facts.num_cached_tokens = cached

    _usage_completions = _usage_chat
