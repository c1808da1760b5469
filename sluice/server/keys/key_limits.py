"""Per-key limits: requests in flight, requests per minute, tokens per minute.

`KeyLimiter.admit(key)` either refuses with a `RateLimitError` (429 with
Retry-After: the seconds until the limit that refused frees up) or returns a
`KeyLease`, which the request holds until its response is sent. The route
then tells the lease what the request asks for, before any engine work:
`seat_choices` (its choices: `n` times its prompts) and `reserve` (its
tokens); either may refuse too. Windows are sliding: a minute is the 60
seconds before now by the limiter's clock (injected, so tests move time by hand).

What counts:
- max_concurrent: choices in flight (a request of `n` choices holds `n`
  seats; streams hold theirs to the last byte). A request whose choices would
  pass the limit is refused whole, its message naming the limit;
- rpm: choices admitted in the window (refused requests do not count);
- tpm: a request reserves its prompt tokens plus `max_tokens` for each
  choice once it is tokenized, before it runs; when it ends it is charged
  what it delivered (the request's one count, its usage's:
  sluice/server/in_flight/request_context.py) and refunded the rest of the
  reservation (tokens beyond it, none while max_tokens holds, are added). A request is refused
  once the window already holds `tpm` tokens, reservations included, so
  requests running at once cannot pass the limit by more than the one that
  crosses it (its size is known only once it is tokenized).

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
from sluice.server.keys.api_keys import ApiKey, KeyLimits

WINDOW_S = 60.0


@dataclass(slots=True)
class TokenCharge:
    """Tokens counted against a key at one time; a reservation shrinks when refunded."""

    time_s: float
    num_tokens: int
    # Left the window (its tokens no longer counted): a refund then changes nothing.
    is_expired: bool = False


@dataclass(slots=True)
class KeyUsage:
    """What one key used: seats in flight now, and starts and tokens in the window."""

    num_in_flight: int = 0
    # Admission times (one per choice), oldest first.
    request_times_s: deque[float] = field(default_factory=deque)
    # Token charges, oldest first, and their sum.
    token_charges: deque[TokenCharge] = field(default_factory=deque)
    num_window_tokens: int = 0

    def forget_before(self, start_s: float) -> None:
        while self.request_times_s and self.request_times_s[0] <= start_s:
            self.request_times_s.popleft()
        while self.token_charges and self.token_charges[0].time_s <= start_s:
            charge = self.token_charges.popleft()
            charge.is_expired = True
            self.num_window_tokens -= charge.num_tokens

    def add_charge(self, time_s: float, num_tokens: int) -> TokenCharge:
        charge = TokenCharge(time_s, num_tokens)
        self.token_charges.append(charge)
        self.num_window_tokens += num_tokens
        return charge


class KeyLease:
    """One admitted request of a key: its seats, its reservation, released once."""

    __slots__ = ("key_name", "_limits", "_usage", "_clock", "_start_times_s", "_num_seats",
                 "_reservation", "_num_reserved_left", "_is_released")  # fmt: skip

    def __init__(self, key: ApiKey, usage: KeyUsage, clock: Callable[[], float], admitted_s: float):
        self.key_name = key.name
        self._limits: KeyLimits = key.limits
        self._usage = usage
        self._clock = clock
        # When each of its seats started (what rpm counted for it).
        self._start_times_s = [admitted_s]
        self._num_seats = 1
        self._reservation: TokenCharge | None = None
        # Reserved tokens not yet used (generated tokens draw on them first).
        self._num_reserved_left = 0
        self._is_released = False

    def seat_choices(self, num_choices: int) -> None:
        """Hold one seat (and one start per minute) for each of `num_choices`
        choices; RateLimitError, the request withdrawn, if that passes a limit."""
        num_extra = num_choices - self._num_seats
        if num_extra <= 0:
            return
        usage, limits = self._usage, self._limits
        now_s = self._clock()
        usage.forget_before(now_s - WINDOW_S)
        try:
            _check_seats(self.key_name, limits, usage, num_choices, num_extra)
            _check_starts(self.key_name, limits, usage, num_choices, num_extra, now_s)
        except RateLimitError:
            self._withdraw()
            raise
        usage.request_times_s.extend([now_s] * num_extra)
        self._start_times_s += [now_s] * num_extra
        usage.num_in_flight += num_extra
        self._num_seats = num_choices

    def reserve(self, num_prompt_tokens: int, num_max_new_tokens: int) -> None:
        """Count the prompt and reserve `num_max_new_tokens` against tokens per
        minute; RateLimitError, the request withdrawn, if the window is full."""
        assert self._reservation is None, "a request reserves its tokens once"
        now_s = self._clock()
        self._usage.forget_before(now_s - WINDOW_S)
        try:
            _check_tokens(self.key_name, self._limits, self._usage, now_s)
        except RateLimitError:
            self._withdraw()
            raise
        total = num_prompt_tokens + num_max_new_tokens
        self._reservation = self._usage.add_charge(now_s, total)
        self._num_reserved_left = num_max_new_tokens

    def charge(self, num_tokens: int) -> None:
        """Count `num_tokens` delivered (once, when the request ends): from the
        reservation first, then anew."""
        from_reservation = min(num_tokens, self._num_reserved_left)
        self._num_reserved_left -= from_reservation
        if num_tokens > from_reservation:
            self._usage.add_charge(self._clock(), num_tokens - from_reservation)

    def release(self) -> None:
        """Free the seats and refund the unused reservation; once only."""
        if self._is_released:
            return
        self._is_released = True
        self._usage.num_in_flight -= self._num_seats
        reservation, unused = self._reservation, self._num_reserved_left
        self._num_reserved_left = 0
        if reservation is not None and unused and not reservation.is_expired:
            reservation.num_tokens -= unused
            self._usage.num_window_tokens -= unused

    def _withdraw(self) -> None:
        """A refused request does not count against requests per minute."""
        times = self._usage.request_times_s
        for start_s in self._start_times_s:
            if start_s in times:  # else it already left the window
                times.remove(start_s)
        self._start_times_s = []


class KeyLimiter:
    """Admits or refuses each request of each key by the key's limits."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._usage: dict[str, KeyUsage] = {}

    def usage(self, key_name: str) -> KeyUsage:
        return self._usage.setdefault(key_name, KeyUsage())

    def admit(self, key: ApiKey) -> KeyLease:
        """A lease for one request of `key` (one seat); RateLimitError if a limit is reached."""
        now_s = self._clock()
        usage = self.usage(key.name)
        usage.forget_before(now_s - WINDOW_S)
        _check_seats(key.name, key.limits, usage, 1, 1)
        _check_starts(key.name, key.limits, usage, 1, 1, now_s)
        _check_tokens(key.name, key.limits, usage, now_s)
        usage.request_times_s.append(now_s)
        usage.num_in_flight += 1
        return KeyLease(key, usage, self._clock, now_s)


def _check_seats(
    name: str, limits: KeyLimits, usage: KeyUsage, num_choices: int, num_extra: int
) -> None:
    limit = limits.max_concurrent
    if limit is None or usage.num_in_flight + num_extra <= limit:
        return
    if num_choices > limit:
        raise RateLimitError(
            f"the request asks for {num_choices} choices at once (n times the prompts), more "
            f"than key {name!r} may have in flight (max_concurrent {limit})",
            retry_after_s=1,
        )
    num_others = usage.num_in_flight - (num_choices - num_extra)  # without this request's
    raise RateLimitError(
        f"key {name!r} has {num_others} requests in flight (choices counted), "
        + (f"and this one's {num_choices} choices pass " if num_choices > 1 else "")
        + f"its limit (max_concurrent {limit}); retry when one finishes",
        retry_after_s=1,
    )


def _check_starts(
    name: str, limits: KeyLimits, usage: KeyUsage, num_choices: int, num_extra: int, now_s: float
) -> None:
    limit = limits.rpm
    num_started = len(usage.request_times_s)
    if limit is None or num_started + num_extra <= limit:
        return
    what = f"its limit of {limit} requests per minute"
    if num_choices > 1:
        what += f" (choices counted: this request has {num_choices})"
    if num_choices > limit:
        raise RateLimitError(
            f"key {name!r}: {what}", retry_after_s=_seconds_until(now_s + WINDOW_S, now_s)
        )
    # Enough of the oldest starts must leave the window for num_extra more to fit.
    oldest_s = usage.request_times_s[num_started + num_extra - limit - 1]
    raise RateLimitError(
        f"key {name!r} reached {what}",
        retry_after_s=_seconds_until(oldest_s + WINDOW_S, now_s),
    )


def _check_tokens(name: str, limits: KeyLimits, usage: KeyUsage, now_s: float) -> None:
    if limits.tpm is None or usage.num_window_tokens < limits.tpm:
        return
    raise RateLimitError(
        f"key {name!r} used {usage.num_window_tokens} tokens in the last minute (running "
        f"requests' reservations included), its limit is {limits.tpm} tokens per minute",
        retry_after_s=_seconds_until(_tokens_free_at(usage, limits.tpm), now_s),
    )


def _tokens_free_at(usage: KeyUsage, tpm: int) -> float:
    """When enough charges leave the window to bring it under `tpm` (their time + a minute)."""
    remaining = usage.num_window_tokens
    for charge in usage.token_charges:
        remaining -= charge.num_tokens
        if remaining < tpm:
            return charge.time_s + WINDOW_S
    raise AssertionError("the window holds at least tpm tokens, so some charge frees it")


def _seconds_until(when_s: float, now_s: float) -> int:
    """Whole seconds (at least 1) a client waits until `when_s`: Retry-After's unit."""
    return max(1, math.ceil(when_s - now_s))
