"""One run of a source: prune what is gone, refresh permissions, then fetch what changed.

The order is the one that shows least for least long:

1. the slim listing: an item the knowledge base has and the source no longer
   lists (deleted, or moved where the connector cannot see it) is removed now;
   a listing that fails, or lists nothing while items are known, removes
   nothing (a revoked token must not empty the knowledge base) and the run
   fails, saying so;
2. the permissions of every known item, and the members of every group they
   name, replace the recorded ones: a page restricted since the last run is
   hidden before anything else happens (a connector that can tell whose
   changed since its checkpoint, ``contract.ChangedPermissions``, is asked
   only about those);
3. a load (first run) or a poll from the checkpoint: each changed document's
   permissions are written before its new version is indexed, and the new
   version goes through the upload path (``KnowledgeBase.add_bytes`` then
   ``index_document``: extraction, chunking, exact offsets, one transaction
   replacing the older version); a document whose bytes come later
   (``SourceDocument.fetch``) and whose version is the one indexed is not
   fetched again; an item listed twice is taken once; an item
   the listing has and the knowledge base has not, which the poll did not
   bring (a page moved in from elsewhere, or restored from the trash, keeps its
   old date), makes the run load in full, so that it is not missed for good;
4. the checkpoint is saved last: a run killed before that polls the same
   changes again, and an unchanged version is not indexed twice.

Each document is filed under a scope of its own (``contract.source_scope``)
whose permissions ``store.sources`` keeps; who they admit is ``bot.access``'s
to decide. Two runs of one source never overlap: the store's lock
``source-<name>`` holds across processes and, on Postgres, machines.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from index.errors import DocumentNotFound, KBError
from index.knowledge_base import KnowledgeBase
from index.models import DocState, Publish, source_uploader
from index.sources.contract import (
    Acl,
    Batch,
    ChangedPermissions,
    Connector,
    SourceDocument,
    SourceFailed,
    source_scope,
)
from index.sources.downloads import DownloadLimits
from index.sources.kinds import open_connector, opened_with
from index.storage import SourceItem, SourceRecords, SourceRow, UnknownSource

log = logging.getLogger(__name__)

__all__ = [
    "SourceSyncReport",
    "acl_of_scope",
    "document_source",
    "remove_source_documents",
    "source_health",
    "sync_due_sources",
    "sync_source",
]

_LIVE = (DocState.INDEXED, DocState.AWAITING_APPROVAL)


@dataclass
class SourceSyncReport:
    """What one run of a source did (``mode`` ``busy``: another process was syncing it)."""

    source: str
    mode: str = ""
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    permissions: int = 0
    repeated: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        """The run ended without an error (an item may still have failed)."""
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        """As JSON."""
        return {
            "source": self.source,
            "mode": self.mode,
            "added": self.added,
            "changed": self.changed,
            "unchanged": len(self.unchanged),
            "removed": self.removed,
            "permissions": self.permissions,
            "repeated": self.repeated,
            "failed": [{"item": i, "reason": r} for i, r in self.failed],
            "error": self.error,
            "retry_after": self.retry_after,
        }


def acl_of_scope(records: SourceRecords, scope: str) -> Acl:
    """The recorded permissions of the synced document filed under ``scope`` (unknown if
    none) that admit now, by the store's clock: a grant past its expiry admits nobody, the
    document's other entries still do."""
    return Acl.from_entries(records.acl_rows(scope)).at(records.clock())


def sync_source(
    kb: KnowledgeBase,
    name: str,
    connector: Connector,
    *,
    clock: Callable[[], float] = time.time,
) -> SourceSyncReport:
    """Run source ``name`` once through ``connector`` (see the module's docstring).

    Never raises for the source's failures, nor for an error its run did not expect: the
    report and the source's record say them (``/readyz``, ``kb source list``), and the
    other sources of a round still run.
    """
    report = SourceSyncReport(name)
    with kb.store.exclusive(f"source-{name}") as acquired:
        if not acquired:
            # Another process (a replica, a shell) is syncing it: nothing failed.
            report.mode = "busy"
            return report
        if not _still_current(kb, name, connector):
            # Its settings (its readers: `kb source readers`) changed after it was opened,
            # and a run would write the old readers back: the next run opens it anew.
            log.info(
                "source %s: its settings changed since this run began; it runs next time", name
            )
            report.mode = "busy"
            return report
        try:
            _Run(kb, name, connector, report, clock).run()
        except SourceFailed as exc:
            report.error = str(exc)
            report.retry_after = exc.retry_after
        except RecursionError:
            # An answer nested deeper than a parser goes (JSON, markup): the source's, and
            # only this source's run fails; the other sources of the round still run.
            report.error = (
                f"The {connector.kind} source answered something nested too deeply to read; "
                "the run stopped there, and the next run tries again."
            )
        except Exception as exc:
            # What no connector expected (an SDK's error it does not translate, a bug): this
            # source's run fails, recorded and logged with where it happened; the other
            # sources of the round still run. Only the type is recorded: a message may hold
            # what the source sent.
            log.error("source %s: its run stopped on an unexpected error", name, exc_info=True)
            report.error = (
                f"The {connector.kind} source's run stopped on an unexpected error "
                f"({type(exc).__name__}); the next run tries again, and the server's log "
                "says where it happened."
            )
        finally:
            kb.refresh_search()
    now = clock()
    retry_at = now + report.retry_after if report.retry_after is not None else None
    kb.store.sources.record_run(name, report.error, retry_at=retry_at, at=now)
    if report.error:
        log.warning("source %s: %s", name, report.error)
    return report


def _still_current(kb: KnowledgeBase, name: str, connector: Connector) -> bool:
    try:
        return opened_with(connector, kb.store.sources.get(name))
    except UnknownSource:  # removed meanwhile: nothing to sync
        return False


def remove_source_documents(kb: KnowledgeBase, name: str, *, actor: str = "cli") -> int:
    """Remove every document of source ``name`` and its records; how many were removed."""
    removed = 0
    for item in kb.store.sources.items(name).values():
        removed += _remove_document(kb, item.document_id, actor=actor)
    kb.store.sources.delete(name)
    kb.refresh_search()
    return removed


def _remove_document(kb: KnowledgeBase, doc_id: int | None, *, actor: str) -> int:
    if doc_id is None:
        return 0
    try:
        row = kb.store.document(doc_id)
    except DocumentNotFound:
        return 0
    if row.state == DocState.REPLACED:
        return 0
    kb.remove(row.id, actor=actor, refresh=False)
    return 1


class _Run:
    """One run of one source."""

    def __init__(
        self,
        kb: KnowledgeBase,
        name: str,
        connector: Connector,
        report: SourceSyncReport,
        clock: Callable[[], float],
    ) -> None:
        self.kb = kb
        self.name = name
        self.connector = connector
        self.report = report
        self.clock = clock
        self.records = kb.store.sources
        self.actor = source_uploader(name)

    def run(self) -> None:
        items = self.records.items(self.name)
        checkpoint = self.records.checkpoint(self.name)
        listed = self._prune(items) if items or checkpoint else None
        self._refresh_permissions(checkpoint)
        # Before the poll too: someone who left a group loses its pages now, even if
        # the poll then fails (the connector lists each group once a run).
        self._refresh_groups()
        # None: never synced; empty: a full load was asked for (kb source sync --full).
        self.report.mode = "poll" if checkpoint else "load"
        batch = self.connector.poll(checkpoint) if checkpoint else self.connector.load()
        taken = self._take(batch, set())
        if checkpoint and listed is not None and self._missed(listed, taken, batch):
            # Listed, never synced and not in the poll: moved in from another place or
            # restored from the trash with its old date, which no poll from a checkpoint
            # finds. A full load brings it; what is unchanged is not indexed again.
            self.report.mode = "load"
            batch = self.connector.load()
            self._take(batch, taken)
        self._refresh_groups()  # and those the new documents name
        self.records.set_checkpoint(self.name, batch.checkpoint)

    def _take(self, batch: Batch, taken: set[str]) -> set[str]:
        """Put each document of ``batch`` not ``taken`` already; the items it gave."""
        seen: set[str] = set()
        for doc in batch.documents:
            if doc.item in seen:
                self.report.repeated.append(doc.item)
                continue
            seen.add(doc.item)
            if doc.item not in taken:
                self._put(doc)
        self.report.failed.extend(batch.failed)
        return seen | taken

    def _missed(self, listed: frozenset[str], taken: set[str], batch: Batch) -> bool:
        failed = {item for item, _ in batch.failed}
        return bool(listed - set(self.records.items(self.name)) - taken - failed)

    # ------------------------------------------------------------ gone

    def _prune(self, items: dict[str, SourceItem]) -> frozenset[str]:
        """Remove what the source no longer lists; the listing."""
        listed = self.connector.listing()
        if not items:
            return listed
        if not listed:
            raise SourceFailed(
                f"The source lists nothing now; none of its {len(items)} documents were removed "
                "(credentials that lost their access?). kb source remove removes them if intended."
            )
        for item in sorted(set(items) - listed):
            _remove_document(self.kb, items[item].document_id, actor=self.actor)
            self.records.drop_item(self.name, item)
            self.report.removed.append(item)
        return listed

    # ------------------------------------------------------------ permissions

    def _refresh_permissions(self, checkpoint: str | None) -> None:
        items = self.records.items(self.name)
        if not items:
            return
        recorded: dict[str, Acl] = {}
        acls = None
        read = all(k.acl_synced_at is not None for k in items.values())
        if checkpoint and read and isinstance(self.connector, ChangedPermissions):
            # Only those the source says may have changed are asked about; the rest are
            # confirmed as recorded. Permissions the admin's readers wrote, not read from
            # the source (kb source readers), are all read again first.
            recorded = {
                i: Acl.from_entries(self.records.acl_rows(k.scope)) for i, k in items.items()
            }
            acls = self.connector.permissions_changed(checkpoint, recorded)
        if acls is None:
            recorded, acls = {}, self.connector.permissions(sorted(items))
        for item, known in items.items():
            acl = acls.get(item) or recorded.get(item) or Acl(known=False)
            self.records.set_acl(known.scope, acl.entries)
            self.report.permissions += 1

    def _refresh_groups(self) -> None:
        names: set[str] = set()
        for item in self.records.items(self.name).values():
            names.update(p for k, p, _ in self.records.acl_rows(item.scope) if k == "group")
        if not names:
            return
        for group in self.connector.groups(sorted(names)):
            if group.complete:
                self.records.set_group_members(self.name, group.group, group.emails)
            else:
                # Only some members could be read: nobody is added, and those recorded stay
                # only as far as the new list confirms them (fail closed, never wider).
                kept = self.records.group_members(self.name, group.group) & group.emails
                self.records.set_group_members(self.name, group.group, kept)

    # ------------------------------------------------------------ documents

    def _put(self, doc: SourceDocument) -> None:
        scope = source_scope(self.name, doc.item)
        known = self.records.items(self.name).get(doc.item)
        now = self.clock()
        # The permissions first: an older version still searchable is restricted at once.
        item = SourceItem(
            source=self.name,
            item=doc.item,
            scope=scope,
            document_id=known.document_id if known else None,
            url=doc.url,
            title=doc.title,
            version=known.version if known else "",
            sha256=known.sha256 if known else "",
            synced_at=known.synced_at if known else now,
            acl_synced_at=now,
        )
        self.records.put_item(item, doc.acl.entries)
        fetched_later = doc.fetch is not None and bool(doc.version)
        if (
            fetched_later
            and known
            and known.version == doc.version
            and self._live(known.document_id)
        ):
            # A version already indexed: its bytes are not fetched again.
            self.records.put_item(_with(item, synced_at=now), doc.acl.entries)
            self.report.unchanged.append(doc.item)
            return
        data = self._data(doc)
        if data is None:
            return
        digest = hashlib.sha256(data).hexdigest()
        if known and known.sha256 == digest and self._live(known.document_id):
            self.records.put_item(_with(item, version=doc.version, synced_at=now), doc.acl.entries)
            self.report.unchanged.append(doc.item)
            return
        row = self._index(doc, data, scope)
        if row is None:
            return
        if known and known.document_id not in (None, row.id):
            # Renamed: the older version has another name, so nothing replaced it.
            _remove_document(self.kb, known.document_id, actor=self.actor)
        done = _with(item, document_id=row.id, version=doc.version, sha256=digest, synced_at=now)
        self.records.put_item(done, doc.acl.entries)
        (self.report.changed if known else self.report.added).append(doc.item)

    def _data(self, doc: SourceDocument) -> bytes | None:
        """The document's bytes (fetched now if they come later); ``None``: not to be indexed."""
        if doc.fetch is None:
            return doc.data
        try:
            return doc.fetch()  # None: gone since it was listed; the next listing prunes it
        except SourceFailed:
            raise
        except KBError as exc:
            self.report.failed.append((doc.item, getattr(exc, "reason", None) or str(exc)))
            return None

    def _index(self, doc: SourceDocument, data: bytes, scope: str) -> Any:
        try:
            added = self.kb.add_bytes(
                data,
                doc.filename,
                uploader=self.actor,
                scope=scope,
                title=doc.title,
                publish=Publish.DIRECT,
            )
        except KBError as exc:
            self.report.failed.append((doc.item, getattr(exc, "reason", None) or str(exc)))
            return None
        row = added.document
        if not (added.duplicate and row.state in _LIVE):
            row = self.kb.index_document(row.id, refresh=False)
        if row.state not in _LIVE:
            self.report.failed.append((doc.item, row.failure_reason or f"ended {row.state}"))
            return None
        return row

    def _live(self, doc_id: int | None) -> bool:
        if doc_id is None:
            return False
        try:
            return self.kb.store.document(doc_id).state in _LIVE
        except DocumentNotFound:
            return False


def _with(item: SourceItem, **changes: Any) -> SourceItem:
    return replace(item, **changes)


def document_source(kb: KnowledgeBase, scope: str) -> dict[str, Any] | None:
    """Where a synced document comes from, who may read it and when it was synced; ``None``
    for a document not synced from a source (``kb show``, ``kb docs``)."""
    item = kb.store.sources.item_of_scope(scope)
    if item is None:
        return None
    acl = acl_of_scope(kb.store.sources, scope)
    return {
        "source": item.source,
        "item": item.item,
        "url": item.url,
        "title": item.title,
        "version": item.version,
        "synced_at": item.synced_at,
        "acl_synced_at": item.acl_synced_at,
        "acl": {"entries": [list(e) for e in acl.entries], "readers": acl.describe()},
    }


def source_health(kb: KnowledgeBase) -> list[dict[str, Any]]:
    """Each source: whether its last run failed and why, and when one last succeeded
    (``kb status``, ``/readyz``)."""
    return [
        {
            "name": row.name,
            "kind": row.kind,
            "ok": row.last_error is None,
            "last_error": row.last_error,
            "last_good_at": row.last_good_at,
            "last_run_at": row.last_run_at,
        }
        for row in kb.store.sources.all()
    ]


def sync_due_sources(
    kb: KnowledgeBase,
    tokens: Mapping[str, str],
    every_seconds: float,
    *,
    clock: Callable[[], float] = time.time,
    download_seconds: float | None = None,
    **options: Any,
) -> list[SourceSyncReport]:
    """Sync each source whose last run is ``every_seconds`` old and whose retry time has come.

    What ``kb serve`` runs on its schedule, on every replica: a source synced
    by another replica a moment ago is not due (its run is in the shared
    store), and one another replica is syncing now is left to it (the lock).
    A source that cannot be opened (no credential) is recorded as failing.
    A file a source downloads may be as large as an upload (``kb``'s limit) and
    take ``download_seconds`` (none: the default). ``options`` go to each
    connector (``sleep``, ``budget_seconds``).
    """
    limits = DownloadLimits(kb.config.max_upload_bytes)
    if download_seconds is not None:
        limits = replace(limits, seconds=download_seconds)
    reports = []
    for row in kb.store.sources.all():
        now = clock()
        if row.last_run_at is not None and now - row.last_run_at < every_seconds:
            continue
        if row.retry_at is not None and now < row.retry_at:
            continue
        reports.append(open_and_sync(kb, row, tokens, limits, clock=clock, **options))
    return reports


def open_and_sync(
    kb: KnowledgeBase,
    row: SourceRow,
    tokens: Mapping[str, str],
    limits: DownloadLimits,
    *,
    clock: Callable[[], float] = time.time,
    **options: Any,
) -> SourceSyncReport:
    """Open source ``row``'s connector and sync it; one that cannot be opened (no
    credential) is recorded as failing, and the caller goes on to the next source."""
    try:
        connector = open_connector(row, tokens, limits, **options)
    except KBError as exc:
        kb.store.sources.record_run(row.name, str(exc), at=clock())
        return SourceSyncReport(row.name, error=str(exc))
    return sync_source(kb, row.name, connector, clock=clock)
