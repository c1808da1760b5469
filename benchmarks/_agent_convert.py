"""A recorded request made ready to replay: in its own dialect, or as chat completions.

Replay changes only what decides the answer's length and sampling, never
the prompt: `stream` on (with usage), the output limit set to the replay's
small fixed count, greedy (`temperature` 0, no `top_p`/`top_k`), and no
stop sequences (so every request decodes the same number of tokens).

Tools: the embedded model's 8,192-token context cannot hold an agent's tool
definitions (Codex's take ~6,000 tokens shown to it), so the recordings were
made against `--tool-call-parser none`, where the server shows no tools.
`drop_tools` (the replay's default) removes `tools` and `tool_choice` from
every body, which gives the default `sluice serve` the same prompt.

For a peer that speaks only chat completions (vLLM; llama-server with
`--llama-as-chat`), a body is converted as sluice itself reads it, so the
chat template sees the same messages:
- Responses: `instructions` as a leading system message, `input` through
  sluice's own reader (sluice/apis/responses/input_items.py: developer -> system,
  text parts joined by newlines, calls as assistant `tool_calls`, outputs as
  `tool` messages, reasoning items skipped), tools through its `chat_tools`.
- Messages: `system` (a string, or its text blocks joined by newlines) as a
  system message; each message's text blocks joined by newlines, `tool_use`
  as `tool_calls`, `tool_result` as `tool` messages before the text,
  thinking blocks left out (as sluice/apis/messages/to_internal.py does);
  tools as chat functions with their `input_schema` as parameters.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from sluice.apis.responses.input_items import chat_tools, input_messages

SAMPLING_KEYS = ("top_p", "top_k", "stop", "stop_sequences", "stop_strings")
TOOL_KEYS = ("tools", "tool_choice", "parallel_tool_calls")


def replay_body(dialect: str, body: dict[str, Any], max_tokens: int, drop_tools: bool) -> dict:
    """`body` in its own dialect, streaming, greedy, `max_tokens` long."""
    out = copy.deepcopy(body)
    for key in SAMPLING_KEYS + (TOOL_KEYS if drop_tools else ()):
        out.pop(key, None)
    out |= {"stream": True, "temperature": 0}
    if dialect == "responses":
        out["max_output_tokens"] = max_tokens
    elif dialect == "messages":
        out["max_tokens"] = max_tokens
    else:
        out.pop("max_completion_tokens", None)
        out |= {"max_tokens": max_tokens, "stream_options": {"include_usage": True}}
    return out


def chat_body(dialect: str, body: dict[str, Any], model: str, max_tokens: int,
              drop_tools: bool) -> dict[str, Any]:  # fmt: skip
    """The chat completions request that says what `body` says (see the module doc)."""
    if dialect == "chat":
        return replay_body("chat", body | {"model": model}, max_tokens, drop_tools)
    if dialect == "responses":
        messages, tools = responses_messages(body), chat_tools(body.get("tools"))[0]
    elif dialect == "messages":
        messages, tools = messages_messages(body), messages_tools(body.get("tools"))
    else:
        raise ValueError(f"no chat form for dialect {dialect!r}")
    chat: dict[str, Any] = {"model": model, "messages": messages}
    if tools and not drop_tools:
        chat["tools"] = tools
    return replay_body("chat", chat, max_tokens, drop_tools)


def responses_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = input_messages(body.get("input"))
    if body.get("instructions"):
        messages = [{"role": "system", "content": body["instructions"]}, *messages]
    return messages


def messages_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    system = body.get("system")
    messages: list[dict[str, Any]] = []
    if system:
        text = system if isinstance(system, str) else "\n".join(b["text"] for b in system)
        messages.append({"role": "system", "content": text})
    for message in body.get("messages") or []:
        messages += _messages_turn(message)
    return messages


def _messages_turn(message: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    texts: list[str] = []
    results: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": arguments}})  # fmt: skip
        elif kind == "tool_result":
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _result_text(block.get("content"))})  # fmt: skip
    if not texts and (results or calls):
        assistant = [{"role": "assistant", "content": "", "tool_calls": calls}] if calls else []
        return [*results, *assistant]
    turn: dict[str, Any] = {"role": role, "content": "\n".join(texts)}
    if calls:
        turn["tool_calls"] = calls
    return [*results, turn]


def _result_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "\n".join(block.get("text", "") for block in content if block.get("type") == "text")


def messages_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": tool["name"],
         "description": tool.get("description", ""), "parameters": tool.get("input_schema", {})}}
        for tool in tools or [] if tool.get("name") and "input_schema" in tool
    ]  # fmt: skip
