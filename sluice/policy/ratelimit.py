"""Per-tenant token bucket: `rate` tokens per second up to `burst`; one request, one token."""

from __future__ import annotations

__all__ = ["TokenBucket"]


class TokenBucket:
    __slots__ = ("_tokens", "_updated", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        """pre: rate > 0, burst >= 1. Starts full."""
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._updated = now

    def try_take(self, now: float) -> float:
        """0.0 if a token was taken; else the seconds until one will be there (Retry-After)."""
        elapsed = now - self._updated
        if elapsed > 0:
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
            self._updated = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate

    def retune(self, rate: float, burst: float, now: float) -> None:
        """Change rate and burst, keeping the tokens earned so far (at most the new burst):
        a gateway's share of a tenant's rate changes every second or so
        (`sluice.policy.rate_shares`), and a bucket that started full at each change would
        let a burst through each time. pre: rate > 0, burst >= 1."""
        elapsed = now - self._updated
        if elapsed > 0:
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
            self._updated = now
        self.rate = rate
        self.burst = burst
        self._tokens = min(self._tokens, burst)
