"""What the parts mixed into ``Store`` rely on: this thread's connection and a write transaction."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import sqlite_utils

__all__ = ["StoreMixin"]


class StoreMixin:
    """Base of ``Store``'s mixins (query log, audit log); ``Store`` provides both members."""

    if TYPE_CHECKING:

        @property
        def db(self) -> sqlite_utils.Database: ...

        def transaction(self) -> AbstractContextManager[sqlite_utils.Database]: ...
