"""Per-key limits: requests in flight, requests per minute, tokens per minute.

`KeyLimiter.admit(key)` either refuses with a `RateLimitError` (429 with
Retry-After: the seconds until the limit that refused frees up) or returns a
`KeyLease`, which the request holds until its response is sent. Windows are
sliding: a minute is the 60 seconds before now by the limiter's clock
(injected, so tests move time by hand).

What counts:
- max_concurrent: leases not yet released (streams hold theirs to the last byte);
- rpm: requests admitted in the window (refused ones do not count);
- tpm: the prompt tokens of each request when it is admitted to the engine,
  then its generated tokens as they are delivered. A request is refused once
  the window already holds `tpm` tokens; the one that crosses the limit runs
  to its end (its size is not known before it runs, as with OpenAI's limits).

Usage is kept per key name, so a reload that changes a key's limits keeps
what the key used; the state lives on the event loop (no locks).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.errors import RateLimitError
from sluice.server.api_keys import ApiKey

WINDOW_S = 60.0


@dataclass(slots=True)
class KeyUsage:
    """What one key used: in flight now, and starts and tokens in the window."""

    num_in_flight: int = 0
    # Admission times, oldest first.
    request_times_s: deque[float] = field(default_factory=deque)
    # (time, tokens) charges, oldest first, and their sum.
    token_charges: deque[tuple[float, int]] = field(default_factory=deque)
    num_window_tokens: int = 0

    def forget_before(self, start_s: float) -> None:
        while self.request_times_s and self.request_times_s[0] <= start_s:
            self.request_times_s.popleft()
        while self.token_charges and self.token_charges[0][0] <= start_s:
            self.num_window_tokens -= self.token_charges.popleft()[1]


class KeyLease:
    """One admitted request of a key: charges its tokens, released once."""

    __slots__ = ("key_name", "_usage", "_clock", "_is_released")

    def __init__(self, key_name: str, usage: KeyUsage, clock: Callable[[], float]):
        self.key_name = key_name
        self._usage = usage
        self._clock = clock
        self._is_released = False

    def charge(self, num_tokens: int) -> None:
        """Count `num_tokens` against the key's tokens per minute."""
        if num_tokens > 0:
            self._usage.token_charges.append((self._clock(), num_tokens))
            self._usage.num_window_tokens += num_tokens

    def release(self) -> None:
        if not self._is_released:
            self._is_released = True
            self._usage.num_in_flight -= 1


class KeyLimiter:
    """Admits or refuses each request of each key by the key's limits."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._usage: dict[str, KeyUsage] = {}

    def usage(self, key_name: str) -> KeyUsage:
        return self._usage.setdefault(key_name, KeyUsage())

    def admit(self, key: ApiKey) -> KeyLease:
        """A lease for one request of `key`; RateLimitError if a limit is reached."""
        now_s = self._clock()
        usage = self.usage(key.name)
        usage.forget_before(now_s - WINDOW_S)
        limits = key.limits
        if limits.max_concurrent is not None and usage.num_in_flight >= limits.max_concurrent:
            raise RateLimitError(
                f"key {key.name!r} has {usage.num_in_flight} requests in flight, its limit "
                f"(max_concurrent {limits.max_concurrent}); retry when one finishes",
                retry_after_s=1,
            )
        if limits.rpm is not None and len(usage.request_times_s) >= limits.rpm:
            oldest_s = usage.request_times_s[-limits.rpm]
            raise RateLimitError(
                f"key {key.name!r} reached its limit of {limits.rpm} requests per minute",
                retry_after_s=_seconds_until(oldest_s + WINDOW_S, now_s),
            )
        if limits.tpm is not None and usage.num_window_tokens >= limits.tpm:
            raise RateLimitError(
                f"key {key.name!r} used {usage.num_window_tokens} tokens in the last minute, "
                f"its limit is {limits.tpm} tokens per minute",
                retry_after_s=_seconds_until(_tokens_free_at(usage, limits.tpm), now_s),
            )
        usage.request_times_s.append(now_s)
        usage.num_in_flight += 1
        return KeyLease(key.name, usage, self._clock)


def _tokens_free_at(usage: KeyUsage, tpm: int) -> float:
    """When enough charges leave the window to bring it under `tpm` (their time + a minute)."""
    remaining = usage.num_window_tokens
    for charged_s, num_tokens in usage.token_charges:
        remaining -= num_tokens
        if remaining < tpm:
            return charged_s + WINDOW_S
    raise AssertionError("the window holds at least tpm tokens, so some charge frees it")


def _seconds_until(when_s: float, now_s: float) -> int:
    """Whole seconds (at least 1) a client waits until `when_s`: Retry-After's unit."""
    return max(1, math.ceil(when_s - now_s))
