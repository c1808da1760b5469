"""Both APIs read into one shape: per chunk and per choice index."""

from __future__ import annotations

import ast
import gc
import json
from pathlib import Path

import sluice.audit.records as records_module
from sluice.audit import stream_view
from sluice.audit.records import CHAT, COMPLETIONS
from sluice.audit.stream_view import request_shape, view_exchange, view_of
from tests.broken_servers import chat_chunk, completion_chunk, recorded, sse


def test_the_request_shape_reads_what_a_body_asked_for():
    shape = request_shape(
        COMPLETIONS,
        {
            "prompt": ["a", "b", "c"],
            "n": 2,
            "stream": True,
            "logprobs": 3,
            "stop": "x",
            "include_stop_str_in_output": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    assert (shape.num_choices, shape.top_logprobs, shape.stops, shape.include_stop_str) == (
        6,
        3,
        ("x",),
        True,
    )
    assert shape.is_stream and shape.include_usage and shape.continuous_usage and not shape.is_chat
    chat = request_shape(CHAT, {"messages": [], "logprobs": True, "top_logprobs": 4, "n": 3})
    assert (chat.is_chat, chat.num_choices, chat.top_logprobs, chat.include_usage) == (
        True,
        3,
        4,
        False,
    )


def test_continuous_usage_needs_include_usage_and_token_id_prompts_count_once():
    assert not request_shape(
        COMPLETIONS, {"stream_options": {"continuous_usage_stats": True}}
    ).continuous_usage
    assert request_shape(COMPLETIONS, {"prompt": [1, 2, 3]}).num_choices == 1


def test_fields_of_the_wrong_type_read_as_not_asked():
    shape = request_shape(
        CHAT, {"n": "two", "stop": 5, "logprobs": "yes", "stream_options": [1], "stream": "true"}
    )
    assert (
        shape.num_choices,
        shape.stops,
        shape.top_logprobs,
        shape.include_usage,
        shape.is_stream,
    ) == (1, (), None, False, False)


def test_a_stream_is_split_per_index_with_chunk_numbers_and_usage_of_single_choice_chunks():
    body = {"prompt": ["a", "b"], "stream": True}
    raw = sse(
        completion_chunk(0, "x", usage={"completion_tokens": 1}),
        completion_chunk(1, "y"),
        completion_chunk(0, "z", "length"),
        completion_chunk(1, "w", "stop"),
    )
    view = view_exchange(recorded(COMPLETIONS, body, raw))
    assert view.texts() == {0: "xz", 1: "yw"}
    assert [c.number for c in view.choices[1]] == [1, 3]
    assert view.choices[0][0].usage == {"completion_tokens": 1}
    assert [c.finish_reason for c in view.choices[0]] == [None, "length"]
    assert view.sse is not None and view.sse.events[-1].is_done


def test_chat_deltas_and_messages_read_as_text_and_role():
    raw = sse(
        chat_chunk(0, {"role": "assistant", "content": ""}),
        chat_chunk(0, {"content": "hi"}, "stop"),
    )
    view = view_exchange(recorded(CHAT, {"messages": [], "stream": True}, raw))
    assert [(c.role, c.text) for c in view.choices[0]] == [("assistant", ""), (None, "hi")]
    message = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hello"},
                "finish_reason": "stop",
            }
        ]
    }
    nonstream = view_exchange(recorded(CHAT, {"messages": []}, json.dumps(message).encode()))
    assert nonstream.texts() == {0: "hello"} and nonstream.sse is None


def test_a_failed_response_has_an_empty_view():
    view = view_exchange(
        recorded(CHAT, {"messages": [], "stream": True}, b'{"error": {}}', status=400)
    )
    assert view.chunks == [] and view.choices == {}


def test_records_imports_nothing_of_the_audit_so_views_depend_on_records_only():
    tree = ast.parse(Path(records_module.__file__).read_text())
    imported = [
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    ] + [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert not [name for name in imported if name.startswith("sluice")]


def test_a_view_is_computed_once_per_exchange_and_forgotten_with_it():
    raw = sse(completion_chunk(0, "hi", "stop"))
    exchange = recorded(COMPLETIONS, {"prompt": "x", "stream": True}, raw)
    first = view_of(exchange)
    assert view_of(exchange) is first
    key = id(exchange)
    del exchange
    gc.collect()
    assert key not in stream_view._VIEWS
