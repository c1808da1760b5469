"""Server-sent events on the wire: each event is exactly b"data: " + compact JSON
+ b"\\n\\n", serialized once with orjson; the last is `DONE_EVENT`.
"""

from __future__ import annotations

from typing import Any

import orjson

from sluice.errors import RequestError, ServiceUnavailableError

DONE_EVENT = b"data: [DONE]\n\n"
_INTERNAL_MESSAGE = "internal server error; the server logged the details"


def encode_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def error_payload(error: BaseException) -> dict[str, Any]:
    """The OpenAI error object of an error raised after the stream started,
    shaped as `sluice.server.errors` shapes HTTP errors (no internals leak)."""
    if isinstance(error, RequestError | ServiceUnavailableError):
        message, error_type = error.message, error.error_type
    else:
        message, error_type = _INTERNAL_MESSAGE, "internal_server_error"
    return {
        "error": {
            "message": message,
            "type": error_type,
            "param": getattr(error, "param", None),
            "code": getattr(error, "code", None),
        }
    }
