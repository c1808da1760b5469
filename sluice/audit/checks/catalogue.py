"""Every check id the audit can report, with its severity and one line saying
what broke. Ids are stable: tools parse them from the JSON report.

Five classes (`records.Severity`): "break", the OpenAI API's contract;
"extension", a vLLM extension the server supports (preflight probed it) that
misbehaved; "strict", rules sluice holds itself to beyond the API (reported
with --strict only); "unverified", a check the audit could not exercise on
this server (exit 3 when nothing broke: not a pass); "note", reported but
never failed: a correct server may produce them. Breaks, extensions and
strict rules make the audit exit with status 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.audit.records import Severity


@dataclass(frozen=True, slots=True)
class CheckInfo:
    severity: Severity
    summary: str


_BREAK = {
    # The wire.
    "content_type": "a stream's Content-Type is not text/event-stream",
    "framing": "an event is not `data: ` + JSON + a blank line, or its data is not one JSON value",
    "data_null": "a `data: null` event (openai-python yields None and user code crashes)",
    "done_missing": "the stream does not end with `data: [DONE]`",
    "done_not_last": "bytes or events follow `data: [DONE]`",
    "error_event": "an error event that is not one OpenAI error object followed by [DONE]",
    "connection_error": "the connection failed or was reset mid-request",
    "stream_stalled": "no byte for the request timeout after the stream's first token",
    # Errors.
    "bad_error_shape": 'a 4xx body is not {"error": {"message", "type", "code", ...}}',
    "server_error_5xx": "a 5xx answer (other than 503 with Retry-After)",
    "status_422": "a 422 answer (validation errors must be 400)",
    "retry_after_missing": "a 429/503 answer without Retry-After",
    "bad_input_accepted": "an invalid request was answered 2xx",
    "stream_options_without_stream": "stream_options with stream=false was not a 400",
    "unhealthy_after_bad_input": "the server stopped answering after the invalid requests",
    # Shape.
    "id_changed": "id, created or model differ between chunks of one response",
    "object_wrong": "`object` is not text_completion / chat.completion.chunk",
    "role_not_first": "a chat index's first chunk is not the role chunk",
    "role_repeated": "`role` appears again after an index's first chunk",
    "finish_reason_count": "an index has zero or several non-null finish reasons",
    "finish_reason_not_last": "chunks of an index follow its finish chunk",
    "finish_reason_empty_string": 'finish_reason is "" instead of null',
    "finish_reason_key_missing": "a choice omits the finish_reason key",
    "finish_reason_invalid": "finish_reason is not stop/length/tool_calls/content_filter",
    "index_unexpected": "a choice index outside 0..prompts*n-1",
    "index_missing": "an expected choice index never streamed",
    # Usage.
    "usage_unrequested": "usage arrived although stream_options.include_usage was not set",
    "usage_placement": "the usage chunk is missing, repeated, has choices, or is not last before [DONE]",
    "usage_inexact": "usage counts disagree with the tokens delivered (or total != prompt + completion)",
    # Logprobs.
    "logprob_count": "logprob entries missing, unrequested, fewer than the tokens generated, "
    "or the wrong number of alternatives",
    "logprob_shape": "a logprobs object in the other API's shape (chat `content` on completions)",
    "logprob_alignment": "the entries' tokens do not concatenate to the chunk text",
    "logprob_copied": "identical logprobs and alternatives at positions holding different tokens",
    "logprob_nonfinite": "a logprob is NaN, Infinity or not a number",
    "logprob_greedy_head": "under greedy decoding a sampled token does not head its own "
    "top_logprobs with its own logprob",
    "logprob_own_entry": "a token listed among its own top_logprobs at another logprob than "
    "its own (any sampling; under greedy reported as logprob_greedy_head)",
    "logprob_text_offset": "completions text_offset does not continue across chunks",
    # Structured outputs (the structured scenario).
    "structured_invalid_json": "a json_schema answer that finished with stop is not JSON",
    "structured_schema_mismatch": "a json_schema answer does not match its schema",
    "structured_stream_mismatch": "a json_schema stream differs from the same request non-streamed",
    # Tool calls (the tools scenario).
    "tools_stream_mismatch": "streamed tool calls differ from the same request non-streamed "
    "(name or arguments, byte for byte)",
    "tools_delta_malformed": "a tool call's first delta lacks id, type or name, or a later one "
    "repeats the name, or indices skip",
    "tools_invalid_arguments": "a tool call names no given tool or its arguments are not a JSON object",
    "tools_no_call": "a request forcing a tool call finished without one",
    # The agent APIs (the responses and messages scenarios).
    "agent_framing": "an agent-API event is not `event: <type>` + `data: <JSON object>` of that "
    "type + a blank line (Messages needs the event line), or the stream ends mid-event",
    "responses_sequence": "sequence_number does not count 0, 1, 2, ... one per event",
    "responses_created_first": "the first event of a Responses stream is not response.created",
    "responses_terminal": "not exactly one terminal event (completed / incomplete / failed) last, "
    "or its response's status is not the one it names",
    "responses_item_order": "an output_item.added not closed by its output_item.done in order "
    "(output_index 0, 1, ...), content parts unpaired, or items open at the terminal event",
    "responses_index_mismatch": "an event's output_index, content_index or item_id names no open "
    "item or part",
    "responses_empty_delta": "a Responses delta event with an empty delta",
    "responses_delta_mismatch": "an item's deltas do not concatenate to its .done value, its "
    "output_item.done item, or the terminal response's item",
    "responses_truncation": "a response that used all of max_output_tokens is not incomplete "
    "with reason max_output_tokens (or one that did not claims it)",
    "responses_usage": "Responses usage missing, total != input + output, or output_tokens "
    "differ from the non-streamed twin's",
    "responses_invalid_arguments": "a function_call names no given tool, or its arguments are not "
    'a JSON object ("{}" for a tool without parameters)',
    "responses_logprobs": "include message.output_text.logprobs: text without entries, deltas' "
    "entries unlike the response's, or tokens unlike the twin's",
    "messages_start_first": "the first event of a Messages stream is not message_start with "
    "usage.input_tokens",
    "messages_block_order": "content blocks not started at index 0, 1, ..., a delta or stop on a "
    "block not open, or a block open at message_delta",
    "messages_delta_type": "a delta that does not fit its block (text_delta on tool_use, "
    "input_json_delta on text, ...)",
    "messages_empty_delta": "a Messages text or thinking delta without text",
    "messages_end": "a Messages stream does not end with one message_delta then message_stop",
    "messages_stop_reason": "stop_reason invalid or unlike what happened (max_tokens used -> "
    "max_tokens; a tool_use block -> tool_use)",
    "messages_usage": "Messages usage lacks input/output tokens (message_delta without "
    "output_tokens), or output_tokens differ from the non-streamed twin's",
    "messages_invalid_input": "a tool_use block names no given tool, or its input is not a JSON "
    "object ({} for a tool without parameters)",
    "ollama_framing": "an Ollama stream is not application/x-ndjson of one JSON object a "
    "line, each ended by a newline (or a body is not one JSON object)",
    "ollama_done": "an Ollama stream's lines are not `done: false` then one last `done: true` "
    "with a done_reason",
    "ollama_eval_count": "an Ollama answer's final line lacks prompt_eval_count/eval_count, or "
    "eval_count disagrees with num_predict (above it, or not it when done_reason is length)",
    "ollama_error_shape": 'an Ollama 4xx body is not {"error": "message"}',
    "messages_error_shape": 'a Messages 4xx body is not {"type": "error", "error": {"type", '
    '"message"}}, or an invalid request is not a 400 invalid_request_error',
    # Text.
    "replacement_char": "U+FFFD in a delta that the non-streamed text does not have",
    "stop_leak": "a stop string, or a prefix of one later retracted, reached the client",
    "duplicate_delta": "a delta was delivered twice",
    "skipped_delta": "a piece of the output was never delivered",
    # Scenario-level.
    "disconnect_keeps_generating": "abandoned streams kept the server busy",
    "health_stalled": "/health (or /v1/models) answered slowly while streams were lagging",
}

_EXTENSION = {
    "usage_continuous_missing": "content chunks without usage under continuous_usage_stats",
    "usage_continuous_inexact": "continuous completion_tokens disagree with the tokens delivered",
    "usage_frozen": "continuous completion_tokens did not grow on a chunk that carried new text",
    "stop_str_not_included": "include_stop_str_in_output: the matched stop string is not at "
    "the end of the text",
}

_STRICT = {
    "empty_chunk": "a chunk carries nothing (no text, role, finish reason or logprobs)",
    "comment_line": "an SSE comment line (`: ping`): legal SSE, which clients skip",
    "error_param_missing": "an error object without the `param` key",
    "ollama_empty_line": "an Ollama `done: false` line carries nothing (no content, thinking "
    "or tool calls)",
}

_UNVERIFIED = {
    "backpressure_not_exercised": "no paused stream merged deltas beyond the same request read "
    "at once: the checks of merged chunks read nothing",
    "abort_not_verifiable": "whether abandoned streams stopped could not be seen (no "
    "running-requests gauge in /metrics, or the streams would have ended by then anyway)",
}

_NOTE = {
    "extension_unsupported": "a vLLM extension the server does not support (no scenario sends it)",
    "model_name_ignored": "the server answers any model name, so the unknown-model case is skipped",
    "connection_closed_after_response": "the server closes kept-alive connections after a "
    "response; requests sent on one were retried once on a fresh connection",
    "request_refused": "a valid request was refused (4xx, or 429/503 with Retry-After)",
    "stream_ended_by_error": "a stream ended with an error event and [DONE] (the request failed, "
    "as the contract prescribes)",
    "structured_cut_by_length": "max_tokens cut a json_schema answer before the JSON ended",
    "tools_cut_by_length": "max_tokens cut a tool call before it ended",
    "text_mismatch_nonstream": "streamed text differs from the non-streamed greedy text (determinism)",
    # As chat's: a server whose numerics change with the batch answers its
    # greedy twin differently; each stream's own events are checked as breaks.
    "responses_stream_mismatch": "a Responses stream's final object differs from the same greedy "
    "request non-streamed (status, text, tool names, arguments: determinism)",
    "messages_stream_mismatch": "a Messages stream's accumulated message differs from the same "
    "greedy request non-streamed (text, tool names and inputs, stop reason: determinism)",
    "ollama_stream_mismatch": "an Ollama stream's lines differ from the same greedy request "
    "non-streamed (content, thinking, tool calls, done_reason, eval_count: determinism)",
    "api_not_served": "the server does not serve an agent API (POST answered 404/405): its "
    "scenario is skipped",
    "timeout_before_response": "no token arrived within the request timeout (capacity under "
    "this load, not a broken stream)",
}

CHECKS: dict[str, CheckInfo] = {
    **{check_id: CheckInfo("break", summary) for check_id, summary in _BREAK.items()},
    **{check_id: CheckInfo("extension", summary) for check_id, summary in _EXTENSION.items()},
    **{check_id: CheckInfo("strict", summary) for check_id, summary in _STRICT.items()},
    **{check_id: CheckInfo("unverified", summary) for check_id, summary in _UNVERIFIED.items()},
    **{check_id: CheckInfo("note", summary) for check_id, summary in _NOTE.items()},
}


# A stream the server ended with an error event lacks its finish and usage.
_ENDED_BY_ERROR = frozenset({"stream_ended_by_error", "error_event"})

# A finding that is only a consequence of another on the same response is
# dropped: one anomaly, one id. (A duplicated chunk also breaks the cumulative
# logprob alignment and makes the text differ from the twin.)
SUBSUMED_BY: dict[str, frozenset[str]] = {
    "usage_placement": _ENDED_BY_ERROR,
    "usage_continuous_missing": _ENDED_BY_ERROR,
    "finish_reason_count": _ENDED_BY_ERROR,
    "index_missing": _ENDED_BY_ERROR,
    # Responses deltas whose entries went missing no longer spell their text.
    "logprob_alignment": frozenset({"duplicate_delta", "skipped_delta", "responses_logprobs"}),
    # Alternatives copied from another position do not head the token they sit on.
    "logprob_greedy_head": frozenset({"logprob_copied"}),
    # message_start without input_tokens leaves the message's usage without them.
    "messages_usage": frozenset({"messages_start_first"}),
    "text_mismatch_nonstream": frozenset(
        {"duplicate_delta", "skipped_delta", "replacement_char", "stop_leak"}
    ),
}


def severity_of(check_id: str) -> Severity:
    assert check_id in CHECKS, f"unknown check id {check_id}"
    return CHECKS[check_id].severity
