"""How often one person may call the MCP server: at most N calls in any minute.

A sliding window per caller key (``bot.mcp.auth.Caller.key``: the person's
user id, shared by all their tokens and the Slack-signed calls naming them),
kept in this process: each replica counts its own calls, so behind a load
balancer spreading calls over R replicas a person gets up to R times the limit.
Memory is bounded by the limit per caller, and callers silent for a minute are
forgotten.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

__all__ = ["WINDOW_SECONDS", "CallLimiter"]

WINDOW_SECONDS = 60.0
# Past this many callers remembered, those silent for a whole window are dropped.
_SWEEP_AT = 10_000


class CallLimiter:
    """Admits at most ``per_minute`` calls of each caller in any 60 seconds.

    Args:
        per_minute: the calls one caller may make in a window.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._calls: dict[str, deque[float]] = {}

    def admit(self, caller: str) -> int | None:
        """Count a call of ``caller``; ``None`` if admitted, else the seconds to wait (at least 1)."""
        now = self.clock()
        calls = self._calls.get(caller)
        if calls is None:
            self._sweep(now)
            calls = self._calls.setdefault(caller, deque(maxlen=self.per_minute))
        while calls and calls[0] <= now - WINDOW_SECONDS:
            calls.popleft()
        if len(calls) >= self.per_minute:
            return max(1, math.ceil(calls[0] + WINDOW_SECONDS - now))
        calls.append(now)
        return None

    def _sweep(self, now: float) -> None:
        if len(self._calls) < _SWEEP_AT:
            return
        for caller in [c for c, q in self._calls.items() if not q or q[-1] <= now - WINDOW_SECONDS]:
            del self._calls[caller]
