"""The synced sources' records: each source, its checkpoint, its items, their permissions.

``store.sources`` holds them (tables ``sources``, ``source_checkpoints``,
``source_items``, ``source_acl``, ``source_group_members``:
``index.storage.schema``). A source's settings never hold a credential. A
document's permissions are rows ``(scope, kind, principal, until)``: what they
mean is ``index.sources.contract.Acl``'s to say, and who they admit
``bot.access``'s; here they are kept and looked up. A row whose ``until`` (epoch
seconds) has passed by the store's clock admits nobody, whenever it is read:
a grant stops admitting when it expires, not when the next sync reads it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from index.errors import KBError
from index.storage.part import StorePart

__all__ = [
    "AclRow",
    "SourceItem",
    "SourceRecords",
    "SourceRow",
    "UnknownSource",
]


# One permission of a synced document: kind, principal, and when it stops admitting
# (epoch seconds; ``None``: it lasts).
AclRow = tuple[str, str, float | None]


class UnknownSource(KBError):
    """No source of that name is configured."""

    status = 404


@dataclass(frozen=True)
class SourceRow:
    """One configured source.

    Attributes:
        name: what the admin called it.
        kind: the connector (``confluence``...).
        settings: the connector's settings (no credential).
        last_run_at: when a sync of it last ended; ``None``: never.
        last_good_at: when one last ended without an error; ``None``: never.
        last_error: why the last run failed; ``None``: it did not.
        retry_at: not to be asked before this (a ``Retry-After``, a back-off).
    """

    name: str
    kind: str
    settings: dict[str, Any]
    created_at: float
    last_run_at: float | None = None
    last_good_at: float | None = None
    last_error: str | None = None
    retry_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {
            "name": self.name,
            "kind": self.kind,
            "settings": self.settings,
            "last_run_at": self.last_run_at,
            "last_good_at": self.last_good_at,
            "last_error": self.last_error,
            "retry_at": self.retry_at,
        }


@dataclass(frozen=True)
class SourceItem:
    """One item a source gave, and the document it is now."""

    source: str
    item: str
    scope: str
    document_id: int | None
    url: str
    title: str
    version: str
    sha256: str
    synced_at: float
    acl_synced_at: float | None


class SourceRecords(StorePart):
    """The sources, their checkpoints, items, permissions and groups."""

    # ------------------------------------------------------------ sources

    def add(self, name: str, kind: str, settings: dict[str, Any]) -> SourceRow:
        """Record a new source.

        Raises:
            KBError: a source of that name exists.
        """
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM sources WHERE name = ?", [name]).fetchone():
                raise KBError(f"A source named {name!r} exists; remove it first or pick a name.")
            db.execute(
                "INSERT INTO sources (name, kind, settings, created_at) VALUES (?, ?, ?, ?)",
                [name, kind, json.dumps(settings, sort_keys=True), self.clock()],
            )
        return self.get(name)

    def get(self, name: str) -> SourceRow:
        """The source ``name``.

        Raises:
            UnknownSource: there is none.
        """
        rows = self._rows("WHERE name = ?", [name])
        if not rows:
            raise UnknownSource(f"No source is named {name!r}; kb source list shows them.")
        return rows[0]

    def all(self) -> list[SourceRow]:
        """Every source, by name."""
        return self._rows("ORDER BY name", [])

    def _rows(self, where: str, params: Sequence[object]) -> list[SourceRow]:
        cursor = self.db.execute(
            "SELECT name, kind, settings, created_at, last_run_at, last_good_at, last_error, "
            f"retry_at FROM sources {where}",
            list(params),
        )
        return [
            SourceRow(r[0], r[1], json.loads(r[2]), r[3], r[4], r[5], r[6], r[7])
            for r in cursor.fetchall()
        ]

    def set_settings(self, name: str, settings: dict[str, Any]) -> None:
        """Replace the settings of source ``name`` (already checked for its kind).

        Raises:
            UnknownSource: there is none.
        """
        with self.transaction() as db:
            cursor = db.execute(
                "UPDATE sources SET settings = ? WHERE name = ?",
                [json.dumps(settings, sort_keys=True), name],
            )
            if cursor.rowcount == 0:
                raise UnknownSource(f"No source is named {name!r}; kb source list shows them.")

    def record_run(
        self,
        name: str,
        error: str | None,
        *,
        retry_at: float | None = None,
        at: float | None = None,
    ) -> None:
        """How a run of ``name`` ended (``at``, by default now): ``error`` ``None`` is a good run."""
        now = self.clock() if at is None else at
        with self.transaction() as db:
            if error is None:
                db.execute(
                    "UPDATE sources SET last_run_at = ?, last_good_at = ?, last_error = NULL, "
                    "retry_at = NULL WHERE name = ?",
                    [now, now, name],
                )
            else:
                db.execute(
                    "UPDATE sources SET last_run_at = ?, last_error = ?, retry_at = ? WHERE name = ?",
                    [now, error, retry_at, name],
                )

    def delete(self, name: str) -> None:
        """Forget ``name`` and everything recorded of it (its documents are the caller's)."""
        with self.transaction() as db:
            scopes = [
                r[0]
                for r in db.execute(
                    "SELECT scope FROM source_items WHERE source = ?", [name]
                ).fetchall()
            ]
            for scope in scopes:
                db.execute("DELETE FROM source_acl WHERE scope = ?", [scope])
            for table in ("source_items", "source_checkpoints", "source_group_members"):
                db.execute(f"DELETE FROM {table} WHERE source = ?", [name])
            db.execute("DELETE FROM sources WHERE name = ?", [name])

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self, name: str) -> str | None:
        """Where ``name``'s next poll resumes; ``None``: it loads from scratch."""
        row = self.db.execute(
            "SELECT checkpoint FROM source_checkpoints WHERE source = ?", [name]
        ).fetchone()
        return None if row is None else str(row[0])

    def set_checkpoint(self, name: str, checkpoint: str) -> None:
        """Save where ``name``'s next poll resumes."""
        with self.transaction() as db:
            db.execute("DELETE FROM source_checkpoints WHERE source = ?", [name])
            db.execute(
                "INSERT INTO source_checkpoints (source, checkpoint, updated_at) VALUES (?, ?, ?)",
                [name, checkpoint, self.clock()],
            )

    # ------------------------------------------------------------ items

    def items(self, name: str) -> dict[str, SourceItem]:
        """``name``'s items by their id."""
        return {i.item: i for i in self._items("WHERE source = ?", [name])}

    def item_of_scope(self, scope: str) -> SourceItem | None:
        """The item filed under ``scope``, if any."""
        found = self._items("WHERE scope = ?", [scope])
        return found[0] if found else None

    def _items(self, where: str, params: Sequence[object]) -> list[SourceItem]:
        cursor = self.db.execute(
            "SELECT source, item, scope, document_id, url, title, version, sha256, synced_at, "
            f"acl_synced_at FROM source_items {where}",
            list(params),
        )
        return [SourceItem(*r) for r in cursor.fetchall()]

    def put_item(self, item: SourceItem, acl: Iterable[AclRow]) -> None:
        """Record ``item`` and its permissions, in one transaction."""
        with self.transaction() as db:
            db.execute(
                "DELETE FROM source_items WHERE source = ? AND item = ?", [item.source, item.item]
            )
            db.execute(
                """INSERT INTO source_items (source, item, scope, document_id, url, title,
                       version, sha256, synced_at, acl_synced_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [
                    item.source,
                    item.item,
                    item.scope,
                    item.document_id,
                    item.url,
                    item.title,
                    item.version,
                    item.sha256,
                    item.synced_at,
                    item.acl_synced_at,
                ],
            )
            self._write_acl(item.scope, acl)

    def set_acl(self, scope: str, acl: Iterable[AclRow], *, read: bool = True) -> None:
        """Replace the permissions of the document filed under ``scope``.

        ``read`` false: they were not read from the source (the admin changed who
        reads it): they count as never synced until the source's are read again.
        """
        with self.transaction() as db:
            self._write_acl(scope, acl)
            db.execute(
                "UPDATE source_items SET acl_synced_at = ? WHERE scope = ?",
                [self.clock() if read else None, scope],
            )

    def _write_acl(self, scope: str, acl: Iterable[AclRow]) -> None:
        self.db.execute("DELETE FROM source_acl WHERE scope = ?", [scope])
        for kind, principal, until in acl:  # an Acl's entries: one row an entry
            self.db.execute(
                "INSERT INTO source_acl (scope, kind, principal, until) VALUES (?, ?, ?, ?)",
                [scope, kind, principal, until],
            )

    def drop_item(self, name: str, item: str) -> None:
        """Forget ``name``'s ``item`` and its permissions."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT scope FROM source_items WHERE source = ? AND item = ?", [name, item]
            ).fetchone()
            if row is not None:
                db.execute("DELETE FROM source_acl WHERE scope = ?", [row[0]])
            db.execute("DELETE FROM source_items WHERE source = ? AND item = ?", [name, item])

    # ------------------------------------------------------------ permissions

    def acl_rows(self, scope: str) -> list[AclRow]:
        """The ``(kind, principal, until)`` rows of ``scope``'s permissions (none: unknown),
        expired or not: ``Acl.from_entries(rows).at(clock())`` are those admitting now."""
        cursor = self.db.execute(
            "SELECT kind, principal, until FROM source_acl WHERE scope = ? "
            "ORDER BY kind, principal",
            [scope],
        )
        return [
            (str(r[0]), str(r[1]), None if r[2] is None else float(r[2])) for r in cursor.fetchall()
        ]

    def set_group_members(self, name: str, group: str, emails: Iterable[str]) -> None:
        """Replace the members of ``name``'s group ``group``."""
        with self.transaction() as db:
            db.execute(
                "DELETE FROM source_group_members WHERE source = ? AND group_name = ?",
                [name, group],
            )
            for email in sorted(set(emails)):
                db.execute(
                    "INSERT INTO source_group_members (source, group_name, email) VALUES (?, ?, ?)",
                    [name, group, email],
                )

    def groups_of(self, email: str) -> list[tuple[str, str]]:
        """The ``(source, group)`` pairs ``email`` is a member of."""
        cursor = self.db.execute(
            "SELECT source, group_name FROM source_group_members WHERE email = ? "
            "ORDER BY source, group_name",
            [email],
        )
        return [(str(r[0]), str(r[1])) for r in cursor.fetchall()]

    def group_members(self, name: str, group: str) -> frozenset[str]:
        """The emails of ``name``'s group ``group``."""
        cursor = self.db.execute(
            "SELECT email FROM source_group_members WHERE source = ? AND group_name = ?",
            [name, group],
        )
        return frozenset(str(r[0]) for r in cursor.fetchall())

    def readable_scopes(self, email: str | None, *, public: bool = True) -> frozenset[str]:
        """The scopes of the synced documents ``email`` may read (``None``: the public ones).

        Public in the organisation (unless ``public`` is false: for someone the
        organisation does not count in); ``email`` a user entry; ``email``'s domain a
        domain entry; a group entry of the item's own source with ``email`` a member.
        An entry whose ``until`` has passed by the store's clock admits nobody.
        """
        now = self.clock()
        lasting = "(a.until IS NULL OR a.until > ?)"
        sql = (
            "SELECT a.scope FROM source_acl a JOIN source_items i ON i.scope = a.scope "
            f"WHERE a.kind = 'public' AND {lasting} AND NOT EXISTS "
            "(SELECT 1 FROM source_acl u WHERE u.scope = a.scope AND u.kind = 'unknown')"
        )
        params: list[object] = [now]
        if not public:
            sql, params = "", []
        if email:
            domain = email.rsplit("@", 1)[-1]
            sql += (
                " UNION SELECT a.scope FROM source_acl a JOIN source_items i ON i.scope = a.scope "
                "WHERE ((a.kind = 'user' AND a.principal = ?) "
                "OR (a.kind = 'domain' AND a.principal = ?) "
                "OR (a.kind = 'group' AND EXISTS (SELECT 1 FROM source_group_members g "
                "WHERE g.source = i.source AND g.group_name = a.principal AND g.email = ?))) "
                f"AND {lasting} AND NOT EXISTS (SELECT 1 FROM source_acl u "
                "WHERE u.scope = a.scope AND u.kind = 'unknown')"
            )
            params += [email, domain, email, now]
        sql = sql.removeprefix(" UNION ")
        if not sql:
            return frozenset()
        return frozenset(str(r[0]) for r in self.db.execute(sql, params).fetchall())
