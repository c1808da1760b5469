"""benchmarks/_agent_convert.py: replayed bodies keep the prompt, change only length
and sampling, and read as the same chat messages where a peer speaks only chat."""

from __future__ import annotations

import copy
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the modules import their siblings
convert = importlib.import_module("_agent_convert")

TOOL = {"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}
RESPONSES = {
    "model": "m", "instructions": "You are Codex.", "stream": True, "store": False,
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "env"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                         {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ],
    "tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": False,
    "top_p": 0.9, "max_output_tokens": 4000,
}  # fmt: skip
MESSAGES = {
    "model": "claude", "max_tokens": 128000, "stream": True, "temperature": 1,
    "stop_sequences": ["."], "thinking": {"type": "adaptive"},
    "system": [{"type": "text", "text": "You are Claude Code."},
               {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "I will look."},
            {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1",
             "content": [{"type": "text", "text": "print(1)"}]},
            {"type": "text", "text": "go on"}]},
    ],
    "tools": [{"name": "Read", "description": "read", "input_schema": {"type": "object"}}],
}  # fmt: skip


def test_a_responses_body_keeps_its_prompt_and_changes_only_length_and_sampling():
    original = copy.deepcopy(RESPONSES)
    body = convert.replay_body("responses", RESPONSES, 8, drop_tools=True)
    assert original == RESPONSES, "the recording is not changed"
    assert (body["max_output_tokens"], body["temperature"], body["stream"]) == (8, 0, True)
    assert "top_p" not in body and "tools" not in body and "tool_choice" not in body
    assert (body["input"], body["instructions"], body["store"]) == (
        RESPONSES["input"],
        RESPONSES["instructions"],
        False,
    )


def test_a_messages_body_loses_its_stop_sequences_and_keeps_the_rest():
    body = convert.replay_body("messages", MESSAGES, 8, drop_tools=False)
    assert (body["max_tokens"], body["temperature"]) == (8, 0)
    assert "stop_sequences" not in body
    assert body["tools"] == MESSAGES["tools"]
    assert (body["system"], body["messages"], body["thinking"]) == (
        MESSAGES["system"],
        MESSAGES["messages"],
        MESSAGES["thinking"],
    )


def test_responses_as_chat_reads_as_sluice_reads_it():
    chat = convert.chat_body("responses", RESPONSES, "served", 8, drop_tools=True)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Codex."},
        {"role": "system", "content": "env"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "assistant", "content": "done"},
    ]  # fmt: skip
    assert chat["model"] == "served" and "tools" not in chat
    assert (chat["max_tokens"], chat["temperature"], chat["stream"]) == (8, 0, True)
    assert chat["stream_options"] == {"include_usage": True}


def test_messages_as_chat_joins_system_blocks_and_turns_tool_blocks_into_chat_shapes():
    chat = convert.chat_body("messages", MESSAGES, "served", 8, drop_tools=False)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code.\nBe brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "I will look.", "tool_calls": [
            {"id": "t1", "type": "function",
             "function": {"name": "Read", "arguments": '{"path": "a.py"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "print(1)"},
        {"role": "user", "content": "go on"},
    ]  # fmt: skip
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "Read", "description": "read", "parameters": {"type": "object"}}}]  # fmt: skip
    assert "stop_sequences" not in chat and "thinking" not in chat


def test_a_turn_of_only_tool_results_becomes_tool_messages_alone():
    body = {"messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]}  # fmt: skip
    chat = convert.chat_body("messages", body, "m", 4, drop_tools=True)
    assert chat["messages"] == [{"role": "tool", "tool_call_id": "t1", "content": "ok"}]


def test_chat_completions_bodies_go_as_they_are_but_for_length_and_sampling():
    body = {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 99,
            "stop": ["."], "model": "agent-model"}  # fmt: skip
    chat = convert.chat_body("chat", body, "served", 8, drop_tools=True)
    assert chat == {"messages": body["messages"], "model": "served", "max_tokens": 8,
                    "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
