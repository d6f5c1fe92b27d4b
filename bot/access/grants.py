"""The synced documents' permissions, as the access rule reads them from the store.

A synced document (Confluence...) is filed under a scope of its own
(``index.sources.source_scope``); the store keeps its permissions
(``store.sources``) and the members of the source groups they name. This reads
them for the rule: which synced documents an email may read (public in the
organisation, a user entry, a domain entry, a group it is a member of), and
one document's permissions, for ``kb access explain``. Calls run in a thread:
``index`` is synchronous.
"""

from __future__ import annotations

import asyncio

from index.sources import Acl
from index.storage import Store

__all__ = [
    "SourceGrants",
]


class SourceGrants:
    """The permissions of the documents synced into ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def readable(self, email: str | None) -> frozenset[str]:
        """The scopes of the synced documents ``email`` may read; ``None``: the public ones."""
        return await asyncio.to_thread(self.store.sources.readable_scopes, email)

    async def acl(self, scope: str) -> Acl:
        """The permissions of the synced document filed under ``scope`` (unknown if none)."""
        return await asyncio.to_thread(lambda: Acl.from_entries(self.store.sources.acl_rows(scope)))

    async def groups_of(self, email: str) -> list[tuple[str, str]]:
        """The ``(source, group)`` pairs ``email`` is a member of."""
        return await asyncio.to_thread(self.store.sources.groups_of, email)
