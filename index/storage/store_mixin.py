"""What the parts mixed into ``Store`` rely on: this thread's connection and a write transaction."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from index.storage.database import Connection

__all__ = ["StoreMixin"]


class StoreMixin:
    """Base of ``Store``'s mixins (query log, audit log); ``Store`` provides both members."""

    if TYPE_CHECKING:

        @property
        def db(self) -> Connection: ...

        def transaction(self) -> AbstractContextManager[Connection]: ...
