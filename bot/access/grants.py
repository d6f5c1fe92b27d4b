"""The synced documents' permissions, as the access rule reads them from the store.

A synced document (Confluence...) is filed under a scope of its own
(``index.sources.source_scope``); the store keeps its permissions
(``store.sources``) and the members of the source groups they name. This reads
them for the rule: which synced documents an email may read (public in the
organisation, a user entry, a domain entry, a group it is a member of), and
one document's permissions, for ``kb access explain``; both as they stand at
the store's clock's now (an entry past its expiry admits nobody). Calls run in a thread:
``index`` is synchronous.
"""

from __future__ import annotations

import asyncio

from index.sources import Acl, acl_of_scope
from index.storage import Store

__all__ = [
    "SourceGrants",
]


class SourceGrants:
    """The permissions of the documents synced into ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def readable(self, email: str | None, *, public: bool = True) -> frozenset[str]:
        """The scopes of the synced documents ``email`` may read; ``None``: the public ones.
        ``public`` false: not those public in the organisation (for a guest)."""
        return await asyncio.to_thread(
            lambda: self.store.sources.readable_scopes(email, public=public)
        )

    async def acl(self, scope: str) -> Acl:
        """The permissions of the synced document filed under ``scope`` (unknown if none) that
        admit now, by the store's clock: a grant past its expiry admits nobody, the
        document's other entries still do."""
        return await asyncio.to_thread(acl_of_scope, self.store.sources, scope)

    async def groups_of(self, email: str, scope: str) -> frozenset[str]:
        """The groups ``email`` is a member of in the source the document of ``scope`` was
        synced from: a group of another source with the same name is another group (two
        Confluence sites each have their own ``developers``)."""

        def read() -> frozenset[str]:
            item = self.store.sources.item_of_scope(scope)
            if item is None:
                return frozenset()
            pairs = self.store.sources.groups_of(email)
            return frozenset(group for source, group in pairs if source == item.source)

        return await asyncio.to_thread(read)
