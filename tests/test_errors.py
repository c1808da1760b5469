"""The error tree and the one OpenAI error object every error becomes."""

from __future__ import annotations

import pytest

from sluice.errors import (
    AuthenticationError,
    EngineDeadError,
    InvalidRequestError,
    QueueFullError,
    RequestTooLargeError,
    openai_error,
    openai_error_of,
)


def test_the_error_object_has_exactly_the_openai_keys():
    assert openai_error("bad", "invalid_request_error", "n", "code") == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": "code"}
    }


@pytest.mark.parametrize(
    ("error", "error_type", "param", "code"),
    [
        (InvalidRequestError("x", param="n"), "invalid_request_error", "n", None),
        (RequestTooLargeError("x"), "invalid_request_error", None, None),
        (AuthenticationError("x", code="invalid_api_key"), "authentication_error", None,
         "invalid_api_key"),
        (QueueFullError("x"), "service_unavailable", None, None),
        (EngineDeadError("x"), "service_unavailable", None, None),
    ],
)  # fmt: skip
def test_a_typed_error_keeps_its_message_type_param_and_code(error, error_type, param, code):
    assert openai_error_of(error) == openai_error("x", error_type, param, code)


def test_any_other_error_says_nothing_about_its_cause():
    error = openai_error_of(RuntimeError("secret detail"))["error"]
    assert error["type"] == "internal_server_error"
    assert error["message"].startswith("internal server error")
    assert "secret" not in error["message"]
