"""What the frontend reports about each API request, for metrics.

The HTTP edge implements `RequestObserver` (Prometheus histograms and counters);
the frontend calls it on the event loop, from the consumer side, i.e. when
tokens are handed to the client, not when the engine produced them. A
Frontend without an observer skips every call.

Call order for one API request: on_first_token once (the first take from the
mailbox that carries tokens), on_chunk for every take that carries tokens
(the first one included, its gap being the time to first token), on_finish
once per choice when its finish is handed over, or on_abort once if the
client went away first.
"""

from __future__ import annotations

from typing import Protocol


class RequestObserver(Protocol):
    def on_first_token(self, ttft_s: float) -> None:
        """Seconds from the request reaching the frontend to its first tokens."""

    def on_chunk(self, num_tokens: int, gap_s: float) -> None:
        """`num_tokens` (all choices together) handed over `gap_s` after the previous ones."""

    def on_finish(
        self,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        e2e_s: float,
        finish_reason: str,
    ) -> None:
        """One choice finished: its prompt and delivered tokens, seconds since arrival."""

    def on_abort(self) -> None:
        """The client went away (cancellation) before every choice finished."""
