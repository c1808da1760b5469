"""The access log's line of one request (`RequestLog`) and `log_safe`, which
keeps what a client sent on one line of it.

Invariant: what a client sent (the decoded path, the method) and the key's
name are written `log_safe`, so no request can end a log line or forge a
field of it. The middleware writes the line (sluice/server/http/middleware.py);
the completion tokens are the projection's count (sluice/frontend/usage.py),
the same the client's usage says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestLog:
    """What the access log line says about one request; routes fill in the tokens."""

    request_id: str
    method: str
    path: str
    start_s: float = field(default_factory=time.perf_counter)
    status: int | None = None
    first_byte_s: float | None = None
    num_prompt_tokens: int | None = None
    # Delivered over all its choices, as its usage counts them (RequestContext.delivered).
    num_completion_tokens: int | None = None
    # The API key's name (never the key); None without keys.
    key_name: str | None = None
    # Seconds the request waited for its model to start (None: it was running).
    model_wait_s: float | None = None

    def line(self) -> str:
        now_s = time.perf_counter()
        first_byte = "-" if self.first_byte_s is None else _ms(self.first_byte_s - self.start_s)
        return (
            f'{self.request_id} "{log_safe(self.method)} {log_safe(self.path)}" '
            f"{self.status or '-'} "
            f"prompt_tokens={_or_dash(self.num_prompt_tokens)} "
            f"completion_tokens={_or_dash(self.num_completion_tokens)} "
            f"first_byte_ms={first_byte} total_ms={_ms(now_s - self.start_s)}"
            + ("" if self.key_name is None else f" key={log_safe(self.key_name)}")
            + ("" if self.model_wait_s is None else f" model_wait_ms={_ms(self.model_wait_s)}")
        )


def log_safe(text: str) -> str:
    """`text` with every character that is not printable (C0 and C1 controls,
    DEL, line and paragraph separators, format characters), every backslash and
    every double quote escaped as Python writes them: one line, fields intact."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return "".join(_LOG_ESCAPES.get(char) or _escaped(char) for char in text)


_LOG_ESCAPES = {"\\": "\\\\", '"': '\\"'}


def _escaped(char: str) -> str:
    return char if char.isprintable() else ascii(char)[1:-1]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)
