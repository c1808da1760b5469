"""One tools request in each API's own shape (chat completions, Responses,
Messages), and its calls and text read back from each API's response: the
tests that hold every API to the same tool rules share these."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx2

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
QUESTION = "What is the weather in Oslo?"


@dataclass(frozen=True, slots=True)
class ToolApi:
    name: str
    path: str

    def body(self, tool_choice: str | None = None, answer_schema: dict | None = None) -> dict:
        """A question with the get_weather and get_time tools; `tool_choice`:
        None (the default), "auto", "required", "none" or a function's name."""
        build = {"chat": _chat_body, "responses": _responses_body, "messages": _messages_body}
        return build[self.name](tool_choice, answer_schema)

    def post(self, url: str, body: dict) -> httpx2.Response:
        return httpx2.post(url + self.path, json=body, timeout=60)

    def calls(self, response: dict) -> list[tuple[str, dict]]:
        """The calls made, each (name, arguments)."""
        if self.name == "chat":
            calls = response["choices"][0]["message"].get("tool_calls") or []
            return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
        if self.name == "responses":
            items = [i for i in response["output"] if i["type"] == "function_call"]
            return [(item["name"], json.loads(item["arguments"])) for item in items]
        blocks = [b for b in response["content"] if b["type"] == "tool_use"]
        return [(block["name"], block["input"]) for block in blocks]

    def text(self, response: dict) -> str:
        """The answer's text."""
        if self.name == "chat":
            return response["choices"][0]["message"]["content"] or ""
        if self.name == "responses":
            messages = [i for i in response["output"] if i["type"] == "message"]
            return "".join(part["text"] for item in messages for part in item["content"])
        return "".join(b["text"] for b in response["content"] if b["type"] == "text")


APIS = [
    ToolApi("chat", "/v1/chat/completions"),
    ToolApi("responses", "/v1/responses"),
    ToolApi("messages", "/v1/messages"),
]


def _chat_body(tool_choice: str | None, answer_schema: dict | None) -> dict[str, Any]:
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}},
        {"type": "function", "function": {"name": "get_time"}},
    ]
    body: dict[str, Any] = {"messages": [{"role": "user", "content": QUESTION}], "tools": tools}
    if tool_choice in ("auto", "required", "none"):
        body["tool_choice"] = tool_choice
    elif tool_choice is not None:
        body["tool_choice"] = {"type": "function", "function": {"name": tool_choice}}
    if answer_schema is not None:
        json_schema = {"name": "answer", "schema": answer_schema}
        body["response_format"] = {"type": "json_schema", "json_schema": json_schema}
    return body


def _responses_body(tool_choice: str | None, answer_schema: dict | None) -> dict[str, Any]:
    tools = [
        {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS},
        {"type": "function", "name": "get_time"},
    ]
    body: dict[str, Any] = {"model": "fake-model", "input": QUESTION, "tools": tools}
    if tool_choice in ("auto", "required", "none"):
        body["tool_choice"] = tool_choice
    elif tool_choice is not None:
        body["tool_choice"] = {"type": "function", "name": tool_choice}
    if answer_schema is not None:
        body["text"] = {
            "format": {"type": "json_schema", "name": "answer", "schema": answer_schema}
        }
    return body


def _messages_body(tool_choice: str | None, answer_schema: dict | None) -> dict[str, Any]:
    tools = [
        {"name": "get_weather", "input_schema": WEATHER_PARAMETERS},
        {"name": "get_time", "input_schema": {"type": "object"}},
    ]
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": tools,
    }
    kinds = {"auto": "auto", "required": "any", "none": "none"}
    if tool_choice in kinds:
        body["tool_choice"] = {"type": kinds[tool_choice]}
    elif tool_choice is not None:
        body["tool_choice"] = {"type": "tool", "name": tool_choice}
    if answer_schema is not None:
        body["output_config"] = {"format": {"type": "json_schema", "schema": answer_schema}}
    return body
