"""A Responses API request's input items and tools, read as a chat request's
messages and tools.

The Responses API is served as a chat request underneath (one prompt rendered
by the chat template, the same tool-call parsers and grammars), so this
module's one job is the translation, naming the Responses field of anything
malformed:
- `instructions` -> a leading system message (not carried to a follow-up
  through `previous_response_id`, as OpenAI does);
- `message` items (roles user, system, developer -> system, assistant) with
  `input_text` / `output_text` / `refusal` parts -> their text;
- `function_call` items -> the calls of an assistant turn (consecutive calls
  share one turn), `function_call_output` -> a tool turn; `custom_tool_call`
  and its output the same, with the input as the `input` argument;
- `reasoning` items, `item_reference`s and the calls of tools the server
  cannot run (web search, file search, computer use, ...) are skipped: the
  chat template has no place for them (docs/API.md lists them).
Tools: `function` tools as chat tools; `custom` tools (freeform text, such as
Codex's `apply_patch`) as functions with one string argument `input`;
`namespace` tools flattened; hosted tools (web_search, local_shell, mcp, ...)
skipped, never a 400 that stops an agent.
"""

from __future__ import annotations

from typing import Any

import orjson

from sluice.errors import InvalidRequestError
from sluice.server.body.limits import check_json_depth

_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_CALL_ITEMS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
_OUTPUT_ITEMS = frozenset(
    {"function_call_output", "custom_tool_call_output", "local_shell_call_output"}
)


def input_messages(value: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The chat messages (protocol.ChatMessage dicts) of a request's `input`."""
    if value is None:
        raise InvalidRequestError("'input' is required", param="input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        _add_item(messages, item, f"input[{index}]")
    return messages


def _add_item(messages: list[dict[str, Any]], item: Any, param: str) -> None:
    if not isinstance(item, dict):
        raise InvalidRequestError("an input item must be an object", param=param)
    kind = item.get("type", "message")
    if kind == "message":
        messages.append(_message(item, param))
    elif kind in _CALL_ITEMS:
        _add_call(messages, item, param)
    elif kind in _OUTPUT_ITEMS:
        call_id = _string(item, "call_id", param, default=item.get("id"))
        messages.append({"role": "tool", "tool_call_id": call_id,
                         "content": _output_text(item.get("output"), f"{param}.output")})  # fmt: skip
    elif not isinstance(kind, str):
        raise InvalidRequestError("an item's 'type' must be a string", param=f"{param}.type")
    # Any other type (reasoning, item_reference, hosted tools' calls, types
    # newer than this code) is one the chat template cannot show: skipped.


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise InvalidRequestError(
            f"role must be one of {sorted(_ROLES)}, got {str(role)[:40]!r}", param=f"{param}.role"
        )
    return {"role": _ROLES[role], "content": _content_text(item.get("content"), param)}


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError("content must be a string or a list of parts",
                                  param=f"{param}.content")  # fmt: skip
    texts = []
    for index, part in enumerate(content):
        part_param = f"{param}.content[{index}]"
        if not isinstance(part, dict):
            raise InvalidRequestError("a content part must be an object", param=part_param)
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            texts.append(_string(part, "text", part_param))
        elif kind == "refusal":
            texts.append(_string(part, "refusal", part_param))
        else:
            raise InvalidRequestError(
                f"content part type {str(kind)[:40]!r} is not supported; only text is",
                param=f"{part_param}.type",
            )
    return "\n".join(texts)


def _add_call(messages: list[dict[str, Any]], item: dict[str, Any], param: str) -> None:
    """The call as a tool call of the assistant turn just before, or of a new one."""
    call_id = _string(item, "call_id", param, default=item.get("id"))
    if item["type"] == "function_call":
        name = _string(item, "name", param)
        arguments = _string(item, "arguments", param)
    elif item["type"] == "custom_tool_call":
        name = _string(item, "name", param)
        arguments = orjson.dumps({"input": _string(item, "input", param)}).decode()
    else:  # local_shell_call: its action as the arguments
        check_json_depth(item.get("action"), f"{param}.action")
        name, arguments = "local_shell", orjson.dumps(item.get("action") or {}).decode()
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _output_text(output: Any, param: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _content_text(output, param.rsplit(".", 1)[0])
    raise InvalidRequestError("output must be a string or a list of parts", param=param)


def _string(item: dict[str, Any], key: str, param: str, default: Any = None) -> str:
    value = item.get(key, default)
    if not isinstance(value, str):
        raise InvalidRequestError(f"'{key}' must be a string", param=f"{param}.{key}")
    return value


# -- tools ---------------------------------------------------------------------------


def chat_tools(tools: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], frozenset[str]]:
    """The chat tools of a request's `tools`, and the names of its custom tools."""
    chat: dict[str, dict[str, Any]] = {}
    custom: set[str] = set()
    for index, tool in enumerate(_flattened(tools or [])):
        param = f"tools[{index}]"
        kind = tool.get("type")
        if kind not in ("function", "custom"):
            continue  # a hosted tool the server cannot run: skipped
        name = _string(tool, "name", param)
        if name in chat:
            continue  # the same name twice (a namespace repeating one): the first wins
        description = tool.get("description")
        if kind == "custom":
            custom.add(name)
            parameters: Any = {
                "type": "object",
                "properties": {"input": {"type": "string", "description": "The tool's input."}},
                "required": ["input"],
            }
        else:
            parameters = tool.get("parameters")
        function = {"name": name, "parameters": parameters}
        if isinstance(description, str):
            function["description"] = description
        chat[name] = {"type": "function", "function": function}
    return list(chat.values()), frozenset(custom)


def _flattened(tools: list[Any]) -> list[dict[str, Any]]:
    flat: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise InvalidRequestError("a tool must be an object", param=f"tools[{index}]")
        if tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            flat += [inner for inner in tool["tools"] if isinstance(inner, dict)]
        else:
            flat.append(tool)
    return flat


def chat_tool_choice(choice: str | dict[str, Any] | None, tool_names: set[str]) -> Any:
    """The chat `tool_choice` of a Responses one; None for the default."""
    if choice is None or not tool_names:
        return None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise InvalidRequestError(
                f"tool_choice must be 'none', 'auto', 'required' or an object, got {choice[:40]!r}",
                param="tool_choice",
            )
        return choice
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = choice.get("name")
        if name not in tool_names:
            raise InvalidRequestError(
                f"tool_choice names {str(name)[:64]!r}, which is not in tools",
                param="tool_choice.name",
            )
        return {"type": "function", "function": {"name": name}}
    if kind == "allowed_tools":
        mode = choice.get("mode")
        return mode if mode in ("auto", "required") else "auto"
    return "auto"  # a hosted tool's choice: the server cannot run it
