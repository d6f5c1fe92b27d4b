"""Waiting out a source's rate limits and failures, within a budget of seconds per call.

Every connector retries the same way: HTTP 429 waits the ``Retry-After`` the
source asked for (or backs off), 5xx and dropped connections back off 0.5 s,
1 s, 2 s... and all the waiting of one call fits in one budget. Past it the
run fails with :class:`SourceFailed`, whose ``retry_after`` says when the
source may be asked again. The wait itself is injectable: tests record it on
a clock of their own instead of sleeping.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from index.sources.contract import SourceFailed

__all__ = [
    "DEFAULT_BUDGET_SECONDS",
    "FIRST_BACKOFF_SECONDS",
    "RetryBudget",
    "retry_after_seconds",
]

log = logging.getLogger(__name__)

DEFAULT_BUDGET_SECONDS = 120.0
FIRST_BACKOFF_SECONDS = 0.5


@dataclass
class RetryBudget:
    """The seconds of waiting one call to ``source`` may still spend on retries.

    Attributes:
        source: what people call the source in messages ("Confluence").
        seconds: the budget.
        sleep: how a wait is waited.
        spent: seconds waited so far.
        tries: waits so far (the back-off doubles with each).
    """

    source: str
    seconds: float
    sleep: Callable[[float], None]
    spent: float = 0.0
    tries: int = 0

    def wait(self, asked: float | None, why: str) -> None:
        """Wait ``asked`` seconds (the source's ``Retry-After``), or back off.

        Raises:
            SourceFailed: the wait would pass the budget; its ``retry_after`` is that wait.
        """
        wait = asked if asked is not None else FIRST_BACKOFF_SECONDS * 2**self.tries
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


def retry_after_seconds(value: str | None) -> float | None:
    """An HTTP ``Retry-After`` in seconds; ``None`` when absent or not a number of seconds."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
