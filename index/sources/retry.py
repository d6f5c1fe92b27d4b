"""Waiting out a source's rate limits and failures within a budget, the same way for every source.

A call that meets HTTP 429, a 5xx or a dropped connection waits — the
``Retry-After`` the source asked for, else 0.5 s doubling; from the second wait on
at least the back-off before it, so that ``Retry-After: 0`` for ever ends too — and asks again, as
long as the waits of that one call stay within a budget of seconds; past it the
run fails saying when the source may be asked again (:class:`SourceFailed`'s
``retry_after``). The wait itself is injectable, so tests record it on a clock.

Every source runs its calls through :meth:`RetryBudget.run`; what differs between
sources is only how their SDK's error tells a failure worth asking again
(:class:`Retry`) from one no wait helps, which ``run`` lets through unchanged.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from index.sources.contract import SourceFailed

__all__ = [
    "DEFAULT_BUDGET_SECONDS",
    "FIRST_BACKOFF_SECONDS",
    "Retry",
    "RetryBudget",
    "origin",
    "retry_after",
]

log = logging.getLogger(__name__)

# Seconds of waiting one call to a source may spend on retries, by default.
DEFAULT_BUDGET_SECONDS = 120.0
FIRST_BACKOFF_SECONDS = 0.5
# The longest a source's Retry-After puts its next run off: one asking for years is asked again in a day.
MAX_RETRY_AFTER_SECONDS = 24 * 3600.0

T = TypeVar("T")


@dataclass(frozen=True)
class Retry:
    """A failure worth asking again after a wait.

    Attributes:
        why: what failed, for the log and the message ("HTTP 429", "unreachable").
        asked: the seconds the source asked to wait (its ``Retry-After``); ``None``: back off.
    """

    why: str
    asked: float | None = None


@dataclass
class RetryBudget:
    """The seconds of waiting one call may still spend on retries.

    Attributes:
        source: what people call the source ("Confluence"), for the messages.
        seconds: the budget.
        sleep: how a wait is waited (tests record it).
    """

    source: str
    seconds: float
    sleep: Callable[[float], None]
    spent: float = 0.0
    tries: int = 0

    def run(self, call: Callable[[], T], transient: Callable[[Exception], Retry | None]) -> T:
        """``call()``'s answer, asking again after each failure ``transient`` names a :class:`Retry`.

        A failure it answers ``None`` for is raised unchanged: the source says what it means.

        Raises:
            SourceFailed: the waits would pass the budget; ``retry_after`` is the next wait.
        """
        while True:
            try:
                return call()
            except Exception as exc:
                retry = transient(exc)
                if retry is None:
                    raise
            self.wait(retry.asked, retry.why)

    def wait(self, asked: float | None, why: str) -> None:
        """Wait ``asked`` seconds (``None``: the next back-off) before the call is tried again.

        Raises:
            SourceFailed: the wait would pass the budget; ``retry_after`` is that wait.
        """
        step = FIRST_BACKOFF_SECONDS * 2**self.tries
        if asked is None:
            wait = step
        elif self.tries == 0:
            wait = asked
        else:
            # From the second wait on, at least the back-off before it: a source asking to
            # be asked again at once, for ever, still runs out of the budget.
            wait = max(asked, step / 2)
        if self.spent + wait > self.seconds:
            raise SourceFailed(
                f"{self.source} kept failing ({why}) past the {self.seconds:g} s retry budget; "
                f"the next sync retries in {wait:g} s.",
                retry_after=wait,
            )
        self.tries += 1
        self.spent += wait
        log.info("%s %s: waiting %.1f s before asking again", self.source, why, wait)
        self.sleep(wait)


def retry_after(value: str | None) -> float | None:
    """An HTTP ``Retry-After`` in seconds, at most a day; ``None`` when absent or not a number
    of seconds (``inf`` and ``nan`` are none: the source's next run is never put off for ever)."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_SECONDS)


def origin(url: str) -> tuple[str, str]:
    """``url``'s scheme and host (with port), lower-cased: where credentials may be sent."""
    parts = urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()
