"""What each part of the store is built on: the store's database, and a clock.

The store (``index.storage.store.Store``) holds its parts — the query log,
feedback, event deliveries, the audit log and hand-offs — each over the one
``Database`` it opened, so a part's write joins a transaction the store or
another part has open on this thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from index.storage.database import Connection, Database

__all__ = ["BESIDE_AN_ANSWER_SECONDS", "Clock", "StorePart"]

# Seconds since the epoch, as ``time.time`` gives them; tests pass their own.
Clock = Callable[[], float]

# The longest a record written on a question's way (its delivery's claim, its log)
# waits for another process's write lock: the asker is answered without it after that.
BESIDE_AN_ANSWER_SECONDS = 5.0


class StorePart:
    """One concern of the store over its database.

    Args:
        database: the store's database.
        clock: the time every row this part writes is stamped with.
    """

    def __init__(self, database: Database, clock: Clock = time.time) -> None:
        self.database = database
        self.clock = clock

    @property
    def db(self) -> Connection:
        """This thread's connection."""
        return self.database.connection()

    def transaction(self, *, wait: float | None = None) -> AbstractContextManager[Connection]:
        """One atomic write (joined by any part's write inside it); ``wait``: see
        ``Database.transaction``."""
        return self.database.transaction(wait=wait)
