"""Every error sluice raises on purpose, typed once.

    SluiceError
    ├── ModelLoadError            bad model path, unsupported architecture, missing file
    ├── RequestError              something the client sent (HTTP 4xx)
    │   ├── InvalidRequestError   400, names the offending `param`
    │   ├── RequestTooLargeError  413, the body is longer than the server reads
    │   ├── AuthenticationError   401
    │   ├── PermissionDeniedError 403, the API key may not call an admin route
    │   ├── NotFoundError         404, a stored object (a response) that is not there
    │   │   └── ModelNotFoundError    the model asked for is not the one served
    │   ├── ContextLengthError    400, prompt + max_tokens beyond the context
    │   │   └── PromptTooLongError    the prompt alone leaves no room (or passes the prompt limit)
    │   ├── UnsupportedMediaTypeError 415, a body that is not declared JSON
    │   └── RateLimitError        429 with Retry-After, an API key's limit reached
    └── ServiceUnavailableError   503 (with Retry-After)
        ├── QueueFullError        the waiting queue is full
        ├── EngineDeadError       the engine process died or stopped answering
        └── ModelUnavailableError a model of several did not load, or is still loading

`openai_error_of` turns any of them (or any other exception) into the
OpenAI error object, the one place that object's shape is spelled: the HTTP
edge (`sluice.server.http.errors`) sends it with the error's status, a stream that
already started sends it as its last event (`sluice.frontend.serving`).
`anthropic_error` spells Anthropic's (the Messages API's routes),
`ollama_error` Ollama's (`{"error": message}`, its /api routes); which an
API speaks is its `ErrorShape` (its entry in `sluice.apis.surface`).
Cancellation is not an error: it is `asyncio.CancelledError` and the normal
abort path.
"""

from __future__ import annotations

import enum
from typing import Any

# What a client learns of an error sluice did not raise on purpose (a bug):
# nothing of its cause, which the server logs.
INTERNAL_ERROR_MESSAGE = "internal server error; the server logged the details"
INTERNAL_ERROR_TYPE = "internal_server_error"


class ErrorShape(enum.Enum):
    """Which error object an API answers with: OpenAI's, Anthropic's or Ollama's."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    OLLAMA = "ollama"


class SluiceError(Exception):
    """Base of every error sluice raises on purpose."""


class ModelLoadError(SluiceError):
    """A model could not be loaded; the message is one line naming what is wrong."""


class RequestError(SluiceError):
    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequestError(RequestError):
    pass


class RequestTooLargeError(RequestError):
    status_code = 413


class AuthenticationError(RequestError):
    status_code = 401
    error_type = "authentication_error"


class PermissionDeniedError(RequestError):
    status_code = 403
    error_type = "permission_error"


class NotFoundError(RequestError):
    status_code = 404
    error_type = "not_found_error"


class ModelNotFoundError(NotFoundError):
    pass


class ContextLengthError(RequestError):
    pass


class PromptTooLongError(ContextLengthError):
    """The prompt alone is too long: it leaves no room to generate, or passes
    the server's prompt limit. Anthropic's API says so in its own words,
    which clients key on (Claude Code compacts its conversation)."""

    def __init__(self, message: str, *, num_prompt_tokens: int, max_prompt_tokens: int, param: str):
        super().__init__(message, param=param, code="context_length_exceeded")
        self.num_prompt_tokens = num_prompt_tokens
        # The most tokens a prompt may have.
        self.max_prompt_tokens = max_prompt_tokens

    @property
    def anthropic_message(self) -> str:
        return (
            f"prompt is too long: {self.num_prompt_tokens} tokens > "
            f"{self.max_prompt_tokens} maximum"
        )


class UnsupportedMediaTypeError(RequestError):
    status_code = 415


class RateLimitError(RequestError):
    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: int):
        super().__init__(message, code="rate_limit_exceeded")
        # Whole seconds until the limit that refused frees up.
        self.retry_after_s = retry_after_s


class ServiceUnavailableError(SluiceError):
    status_code = 503
    error_type = "service_unavailable"
    retry_after_s = 1

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ModelUnavailableError(ServiceUnavailableError):
    """The model a request names failed to load (the message names it and the
    cause), or was still loading when the request's queue timeout ran out."""


class QueueFullError(ServiceUnavailableError):
    pass


class EngineDeadError(ServiceUnavailableError):
    pass


def openai_error(
    message: str, error_type: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    """The OpenAI error object: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def openai_error_of(error: BaseException) -> dict[str, Any]:
    """`error` as a client may see it: a typed error's message, type, param
    and code; anything else the generic internal error."""
    if isinstance(error, RequestError):
        return openai_error(error.message, error.error_type, error.param, error.code)
    if isinstance(error, ServiceUnavailableError):
        return openai_error(error.message, error.error_type)
    return openai_error(INTERNAL_ERROR_MESSAGE, INTERNAL_ERROR_TYPE)


# Anthropic's error types by HTTP status; any other status is an "api_error".
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error(status_code: int, message: str, param: str | None = None) -> dict[str, Any]:
    """Anthropic's error object: {"type": "error", "error": {"type", "message"}}.
    It has no `param`: the message names the field, as Anthropic's do."""
    error_type = ANTHROPIC_ERROR_TYPES.get(status_code, "api_error")
    if param is not None and param not in message:
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": error_type, "message": message}}


def ollama_error(message: str, param: str | None = None) -> dict[str, Any]:
    """Ollama's error object: {"error": message}, the field named in the message."""
    if param is not None and param not in message:
        message = f"{param}: {message}"
    return {"error": message}


def anthropic_error_of(error: BaseException) -> dict[str, Any]:
    """`error` in Anthropic's shape, told as much as `openai_error_of` tells."""
    if isinstance(error, PromptTooLongError):
        return anthropic_error(error.status_code, error.anthropic_message)
    told = openai_error_of(error)["error"]
    if isinstance(error, (RequestError, ServiceUnavailableError)):
        return anthropic_error(error.status_code, told["message"], told["param"])
    return anthropic_error(500, told["message"])
