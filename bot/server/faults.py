"""Clients' faults in the log: one line each, without a traceback, counted once they repeat.

A client that sends its request too slowly, goes away halfway, sends a
malformed one, or arrives while every connection is taken is an everyday event
on a public port, and an attacker can cause thousands a second: each is one line
at most, never a stack trace (nothing in the server failed), and past the first
few of a kind in a window (a minute) they are only counted, and the count is
logged as one line when the window ends ("412 more ... in the last 60 s").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

log = logging.getLogger(__name__)

__all__ = ["ClientFaults", "Fault"]

WINDOW_SECONDS = 60.0
# Lines of one kind logged one by one in a window; the rest are counted.
SHOWN_PER_WINDOW = 3


class Fault(Enum):
    """A kind of client fault: what happened, and the level it is logged at."""

    HEAD_TIMEOUT = ("request head not complete in time: answered 408, closed", logging.INFO)
    BODY_TIMEOUT = ("request body not complete in time: answered 408, closed", logging.INFO)
    SENT_NOTHING = ("connection that sent no request in time: closed", logging.DEBUG)
    MADE_ROOM = ("connection waiting on its client closed to make room for a new one", logging.INFO)
    TOO_LARGE = ("request body over the route's limit: answered 413", logging.INFO)
    MALFORMED = ("malformed request: answered 400", logging.INFO)
    GONE = ("client went away before its request was read", logging.INFO)
    REFUSED = (
        "connection past the cap while every connection was busy: answered 503",
        logging.WARNING,
    )
    ACCEPT_FAILED = ("could not accept a connection", logging.WARNING)

    def __init__(self, sentence: str, level: int) -> None:
        self.sentence = sentence
        self.level = level


@dataclass
class _Window:
    started: float
    shown: int = 0
    counted: int = 0


@dataclass
class ClientFaults:
    """Logs clients' faults, at most ``shown`` lines of a kind per ``window`` seconds.

    Args:
        logger: where the lines go.
        window: seconds of one counting window.
        shown: lines of one kind logged one by one in a window.
        clock: monotonic seconds (tests inject their own).
    """

    logger: logging.Logger = log
    window: float = WINDOW_SECONDS
    shown: int = SHOWN_PER_WINDOW
    clock: Callable[[], float] = time.monotonic
    _windows: dict[Fault, _Window] = field(default_factory=dict)
    _flush: asyncio.TimerHandle | None = None

    def report(self, fault: Fault, detail: str = "") -> None:
        """Note one fault; log it on a line of its own unless its kind is already repeating."""
        now = self.clock()
        current = self._windows.get(fault)
        if current is None or now - current.started >= self.window:
            if current is not None:
                self._log_counted(fault, current)
            current = self._windows[fault] = _Window(started=now)
        if current.shown < self.shown:
            current.shown += 1
            more = (
                f" (more within {self.window:.0f} s are counted, not logged)"
                if current.shown == self.shown
                else ""
            )
            self.logger.log(
                fault.level, "%s%s%s", fault.sentence, f": {detail}" if detail else "", more
            )
            return
        current.counted += 1
        self._flush_later()

    def seen(self, fault: Fault) -> int:
        """How many of ``fault`` were reported in its current window."""
        window = self._windows.get(fault)
        return 0 if window is None else window.shown + window.counted

    def flush(self) -> None:
        """Log the counts of every window that has ended (and, at shutdown, of every window)."""
        self._flush = None
        now = self.clock()
        for fault, window in list(self._windows.items()):
            if now - window.started >= self.window:
                self._log_counted(fault, window)
                del self._windows[fault]
        if any(w.counted for w in self._windows.values()):
            self._flush_later()

    def close(self) -> None:
        """Log what is still counted (the server is stopping)."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        for fault, window in self._windows.items():
            self._log_counted(fault, window)
        self._windows.clear()

    def _log_counted(self, fault: Fault, window: _Window) -> None:
        if window.counted:
            seconds = min(self.clock() - window.started, self.window)
            self.logger.log(
                fault.level,
                "%s: %d more in the last %.0f s",
                fault.sentence,
                window.counted,
                seconds,
            )
            window.counted = 0

    def _flush_later(self) -> None:
        """Log the counts when the oldest counting window ends, even if nothing more comes."""
        if self._flush is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): the next report flushes
            return
        due = min(w.started for w in self._windows.values()) + self.window - self.clock()
        self._flush = loop.call_later(max(due, 0.0), self.flush)
