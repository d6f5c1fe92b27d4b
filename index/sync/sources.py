"""``kb sync``: keep a folder, a list of URLs or a sitemap in the knowledge base, incrementally.

Each source has an id, a scope and the person its documents are credited to.
One run of a source:

* lists its items (a folder's files, the URLs, the sitemap's URLs);
* skips an item whose bytes have the sha256 recorded for it by the last run
  (and whose document is still there);
* adds a new or changed item through the upload path (``KnowledgeBase.add_bytes``
  then ``index_document``), so a new version replaces the old one in one
  transaction, and a version that fails leaves the old one searchable;
* removes the documents of items gone since the last run (a file deleted, a
  URL no longer in the sitemap, a page answering 404 or 410), and only those
  this source created: a document is this source's when the source's record
  names it and its name and scope are still the ones the source gave it (the
  record keeps the scope each was given);
* moves the documents of a source whose scope changed: each is added in the
  new scope, then its copy in the old scope is removed.

Documents are named ``<source id> › <relative path or URL, '/' shown as ' › '>``,
so two sources or two folders never share a name. What each source created
is recorded in the store's ``meta`` table (key ``sync:<id>``) as JSON: no
schema change, and the record moves with the database.

A source that cannot be listed (a folder that is missing, a sitemap that cannot
be fetched) or lists nothing while it had documents removes nothing: a share
that failed to mount must not empty the knowledge base.

A sitemap is read with ``defusedxml`` (no DTD, no entities, whatever its
encoding), one element at a time, and a sitemap index's children one after
the other, only as far as they are needed: one run reads at most
``MAX_SYNC_URLS`` entries (child sitemaps and pages, across the whole index).
A listing the budget cut short is reported (``truncated``) and removes
nothing, like a listing that failed: the items past the budget are not gone.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tomllib
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from dataclasses import replace as with_changes
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import defusedxml
import defusedxml.ElementTree as SafeElementTree

from index.errors import DocumentNotFound, KBError
from index.ingest import FOLDER_SUFFIXES
from index.knowledge_base import KnowledgeBase, Progress
from index.models import EVERYONE, DocState, Publish, is_source_uploader
from index.names import document_name
from index.sync.addresses import is_ip_address
from index.sync.fetch import Fetcher, FetchFailed, FetchPolicy, ascii_host, check_url

__all__ = [
    "DEFAULT_SYNC_UPLOADER",
    "MAX_SYNC_URLS",
    "SourceReport",
    "SyncConfigError",
    "SyncSource",
    "load_sources",
    "source_from_argument",
    "sync_sources",
]

DEFAULT_SYNC_UPLOADER = "sync"
# The sitemap protocol's own limit of URLs per file.
MAX_SITEMAP_URLS = 50_000
# Entries (child sitemaps and pages) one run of a sitemap source reads, across a whole
# sitemap index: one sitemap file's worth. A run fetches each page, so 50,000 is already
# many hours of work, and it keeps a run's memory bounded (the listing holds every URL
# at once) where an index of 50,000 children of 50,000 URLs each would not be. A larger
# site is split into sources, one sitemap each.
MAX_SYNC_URLS = 50_000
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SOURCE_KEYS = frozenset({"id", "folder", "urls", "sitemap", "scope", "uploader", "allow_hosts"})
_LIVE = (DocState.INDEXED, DocState.AWAITING_APPROVAL)
_SEPARATOR = " › "


class SyncConfigError(KBError):
    """A sync source, on the command line or in its config file, is malformed."""


@dataclass(frozen=True)
class SyncSource:
    """One thing kept in sync.

    Attributes:
        id: names its documents and its record; stable between runs.
        folder: a folder, synced recursively (hidden files passed over).
        urls: pages or files fetched one by one.
        sitemap: a sitemap.xml (or a sitemap index) listing the pages.
        scope: ``*`` for everyone, or a Slack channel id.
        uploader: who the documents are credited to (a Slack user id, or a name).
        allow_hosts: hosts besides the source's own that redirects and
            sitemap entries may lead to.
        origin: where the items come from when another part of the product lists
            and reads them (``index.sync.listed``); none of folder, urls, sitemap then.
    """

    id: str
    folder: Path | None = None
    urls: tuple[str, ...] = ()
    sitemap: str | None = None
    scope: str = EVERYONE
    uploader: str = DEFAULT_SYNC_UPLOADER
    allow_hosts: frozenset[str] = field(default_factory=frozenset)
    origin: str | None = None

    @property
    def location(self) -> str:
        """Where the source is, as recorded with what it created."""
        if self.origin is not None:
            return self.origin
        if self.folder is not None:
            return str(self.folder.resolve())
        # A list of URLs is the same source when URLs are added to it or dropped.
        return self.sitemap or "a list of URLs"


@dataclass
class SourceReport:
    """What one run did to one source (item keys: relative paths or URLs)."""

    source: str
    location: str
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    error: str | None = None
    # Why the listing stopped before its end (the URL budget); nothing was removed then.
    truncated: str | None = None

    @property
    def ok(self) -> bool:
        """Whether every item (and the source itself) went through, the whole listing read."""
        return self.error is None and not self.failed and self.truncated is None

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data, counts included."""
        return {
            "source": self.source,
            "location": self.location,
            "counts": {
                "added": len(self.added),
                "changed": len(self.changed),
                "unchanged": len(self.unchanged),
                "removed": len(self.removed),
                "failed": len(self.failed),
                "skipped": len(self.skipped),
            },
            "added": self.added,
            "changed": self.changed,
            "removed": self.removed,
            "failed": [{"item": item, "reason": reason} for item, reason in self.failed],
            "skipped": self.skipped,
            "error": self.error,
            "truncated": self.truncated,
        }


# ---------------------------------------------------------------- sources


def load_sources(path: Path) -> list[SyncSource]:
    """The sources of a TOML config file (``[[source]]`` tables).

    Raises:
        SyncConfigError: unreadable, not TOML, or a source that is malformed.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SyncConfigError(f"The sync config {path} cannot be read ({exc.strerror}).") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SyncConfigError(f"The sync config {path} is not valid TOML: {exc}.") from exc
    tables = data.get("source")
    if not isinstance(tables, list) or not tables:
        raise SyncConfigError(f"The sync config {path} has no [[source]] table.")
    sources = [_source(table, f"{path}, source {i + 1}") for i, table in enumerate(tables)]
    _refuse_duplicate_ids(sources)
    return sources


def source_from_argument(
    arg: str, *, source_id: str | None, scope: str, uploader: str, allow_hosts: Iterable[str]
) -> SyncSource:
    """A source given on the command line: a folder, a sitemap (``.xml``) or a page URL."""
    table: dict[str, Any] = {"scope": scope, "uploader": uploader, "allow_hosts": list(allow_hosts)}
    if "://" in arg:
        try:
            check_url(arg)
        except FetchFailed as exc:
            raise SyncConfigError(f"the command line: {exc}.") from exc
        parts = urlsplit(arg)
        table["id"] = source_id or _id_of_host(parts.hostname or "")
        key = "sitemap" if parts.path.lower().endswith(".xml") else "urls"
        table[key] = arg if key == "sitemap" else [arg]
    elif is_ip_address(arg.strip()) and not Path(arg).exists():
        raise SyncConfigError(
            f"{arg} is an IP address, not a folder or a URL: give a URL such as "
            f"http://{_literal(arg)}/sitemap.xml (an IPv6 address in [ ])."
        )
    else:
        table["id"] = source_id or _id_of_folder(Path(arg))
        table["folder"] = arg
    return _source(table, "the command line")


def _id_of_host(host: str) -> str:
    """An id for a host: an internationalised name in punycode, an IPv6 address with '-'."""
    ascii_name = ascii_host(host, host)  # check_url has encoded it once already
    return re.sub(r"[^A-Za-z0-9._-]+", "-", ascii_name).strip("-.")[:64] or "web"


def _literal(arg: str) -> str:
    address = arg.strip().strip("[]")
    return f"[{address}]" if ":" in address else address


def _id_of_folder(folder: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", folder.resolve().name).strip("-.")
    return name[:64] or "folder"


def _source(table: object, where: str) -> SyncSource:
    if not isinstance(table, dict):
        raise SyncConfigError(f"{where}: a source must be a table of settings.")
    unknown = sorted(set(table) - _SOURCE_KEYS)
    if unknown:
        raise SyncConfigError(
            f"{where}: unknown setting(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_SOURCE_KEYS))}."
        )
    kinds = [k for k in ("folder", "urls", "sitemap") if table.get(k)]
    if len(kinds) != 1:
        raise SyncConfigError(f"{where}: give exactly one of folder, urls or sitemap.")
    source_id = _text(table, "id", where)
    if not _ID.fullmatch(source_id):
        raise SyncConfigError(
            f"{where}: id {source_id!r} must be 1-64 letters, digits, '.', '_' or '-'."
        )
    urls = table.get("urls") or []
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise SyncConfigError(f"{where}: urls must be a list of URLs.")
    hosts = table.get("allow_hosts") or []
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise SyncConfigError(f"{where}: allow_hosts must be a list of host names.")
    try:
        for url in [*urls, *([table["sitemap"]] if kinds == ["sitemap"] else [])]:
            check_url(url)
    except FetchFailed as exc:
        raise SyncConfigError(f"{where}: {exc}.") from exc
    return SyncSource(
        id=source_id,
        folder=Path(_text(table, "folder", where)) if kinds == ["folder"] else None,
        urls=tuple(urls),
        sitemap=_text(table, "sitemap", where) if kinds == ["sitemap"] else None,
        scope=_text(table, "scope", where, EVERYONE),
        uploader=_uploader(table, where),
        allow_hosts=frozenset(h.lower() for h in hosts),
    )


def _uploader(table: dict[str, Any], where: str) -> str:
    """Who a source's documents are credited to: a person or a name, never a synced source's."""
    uploader = _text(table, "uploader", where, DEFAULT_SYNC_UPLOADER)
    if is_source_uploader(uploader):
        raise SyncConfigError(
            f"{where}: uploader {uploader!r} is reserved for the sources kb source add keeps; "
            "give a Slack user id or a name."
        )
    return uploader


def _text(table: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = table.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise SyncConfigError(f"{where}: {key} must be a non-empty string.")
    return value.strip()


def _refuse_duplicate_ids(sources: list[SyncSource]) -> None:
    seen: set[str] = set()
    for s in sources:
        if s.id in seen:
            raise SyncConfigError(f"Two sync sources have the id {s.id!r}; give each its own.")
        seen.add(s.id)


def _sitemap_entries(sitemap: str, body: bytes) -> Iterator[tuple[str, bool]]:
    """Each ``<loc>`` of a sitemap, and whether the sitemap is an index, as it is parsed.

    ``defusedxml`` refuses a DTD or an entity in any encoding (UTF-16, a DOCTYPE
    after a long comment); each element is dropped once read, so a file of
    millions of elements is never held as a tree (20 MB of ``<a/>``: 450 MB more
    as one, nothing measurable this way).

    Raises:
        SyncConfigError: a DTD or entities, or XML that does not parse.
    """
    stack: list[ElementTree.Element] = []
    index = False
    try:
        events = SafeElementTree.iterparse(
            io.BytesIO(body), events=("start", "end"), forbid_dtd=True
        )
        for event, element in events:
            if event == "start":
                if not stack:
                    index = element.tag.endswith("sitemapindex")
                stack.append(element)
                continue
            stack.pop()
            if element.tag.endswith("loc") and (element.text or "").strip():
                yield (element.text or "").strip(), index
            if stack:
                stack[-1].remove(element)  # read: dropped, and the parent keeps no list
    except defusedxml.DefusedXmlException as exc:
        raise SyncConfigError(
            f"The sitemap {sitemap} declares a DTD or entities; not read ({exc})."
        ) from exc
    except ElementTree.ParseError as exc:
        raise SyncConfigError(f"The sitemap {sitemap} is not valid XML ({exc}).") from exc


# ---------------------------------------------------------------- syncing

Reader = Callable[[], tuple[bytes, str]]


def sync_sources(
    kb: KnowledgeBase,
    sources: list[SyncSource],
    *,
    policy: FetchPolicy,
    dry_run: bool = False,
    progress: Progress | None = None,
    max_urls: int = MAX_SYNC_URLS,
) -> list[SourceReport]:
    """Sync each source in turn; one that fails never stops the others.

    ``progress`` receives ``("item", {"source", "item", "index", "total"})``
    before each item. ``max_urls``: entries one run of a sitemap source reads.
    """
    _refuse_duplicate_ids(sources)
    reports = []
    for source in sources:
        # Two runs of one source (the timer and a shell) would each remove what
        # the other just added to its record; the lock holds across processes
        # and, on Postgres, across machines.
        with kb.store.exclusive(f"sync-{source.id}") as acquired:
            if not acquired:
                busy = "another kb sync of this source is running; this one left it alone"
                reports.append(SourceReport(source.id, source.location, error=busy))
                continue
            fetcher = Fetcher(_policy_of(source, policy))
            try:
                reports.append(_Run(kb, source, fetcher, dry_run, progress, max_urls).sync())
            finally:
                fetcher.close()
    kb.refresh_search()
    return reports


def _policy_of(source: SyncSource, policy: FetchPolicy) -> FetchPolicy:
    return with_changes(policy, allow_hosts=policy.allow_hosts | source.allow_hosts)


class _Run:
    """One run of one source."""

    # Whether a listing of nothing means every item is gone. Not for a folder or a
    # site (a share that failed to mount lists nothing too); a subclass whose
    # listing comes from an answer that cannot be empty by accident says so.
    empty_listing_is_final = False

    def __init__(
        self,
        kb: KnowledgeBase,
        source: SyncSource,
        fetcher: Fetcher | None,
        dry_run: bool,
        progress: Progress | None,
        max_urls: int = MAX_SYNC_URLS,
    ) -> None:
        self.kb = kb
        self.source = source
        self.fetcher = fetcher
        self.dry_run = dry_run
        self.progress = progress
        self.report = SourceReport(source.id, source.location)
        self.items: dict[str, dict[str, Any]] = {}
        self.max_urls = max_urls
        self.entries_read = 0

    def sync(self) -> SourceReport:
        try:
            self.items = self._load_record()
            listing = self._listing()
        except (KBError, OSError) as exc:
            self.report.error = getattr(exc, "reason", None) or str(exc)
            return self.report
        if not listing and self.items and not self.empty_listing_is_final:
            self.report.error = (
                f"{self.source.location} lists nothing now; none of its {len(self.items)} "
                "documents were removed (a share that failed to mount?). Remove them with kb rm "
                "if that is intended."
            )
            return self.report
        # Gone first: a renamed file's bytes must not find its old document still live.
        # A listing cut short says nothing about what is past its end: nothing is gone.
        gone = set() if self.report.truncated else set(self.items) - set(listing)
        for key in sorted(gone):
            self._remove(key)
        for i, (key, read) in enumerate(listing.items()):
            if self.progress:
                self.progress(
                    "item",
                    {"source": self.source.id, "item": key, "index": i, "total": len(listing)},
                )
            self._one(key, read)
        if not self.dry_run:
            self._save_record()
        return self.report

    # ------------------------------------------------------------ listing

    def _listing(self) -> dict[str, Reader]:
        if self.source.folder is not None:
            return self._folder_listing(self.source.folder)
        urls = self._sitemap_urls(self.source.sitemap) if self.source.sitemap else self.source.urls
        # A generator for a sitemap: a child is fetched only once the URLs before it are taken.
        return {url: self._url_reader(url) for url in urls}

    def _folder_listing(self, folder: Path) -> dict[str, Reader]:
        if not folder.is_dir():
            raise SyncConfigError(f"The folder {folder} of source {self.source.id} does not exist.")
        root = folder.resolve()
        found: dict[str, Reader] = {}
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if any(part.startswith(".") for part in rel.parts) or not path.is_file():
                continue
            if not path.resolve().is_relative_to(root):
                # A link out of the share could expose any file the server can read.
                self.report.skipped.append(f"{rel.as_posix()}: a link to outside the folder")
            elif path.suffix.lower() not in FOLDER_SUFFIXES:
                # Legacy Office files are taken: they fail with the advice to convert them.
                self.report.skipped.append(f"{rel.as_posix()}: not a supported type")
            else:
                found[rel.as_posix()] = self._file_reader(path)
        return found

    def _file_reader(self, path: Path) -> Reader:
        limit = self.kb.config.max_upload_bytes

        def read() -> tuple[bytes, str]:
            size = path.stat().st_size
            if size > limit:
                raise SyncConfigError(
                    f"it is {size:,} bytes, over the {limit:,}-byte upload limit (KB_MAX_UPLOAD_BYTES)"
                )
            return path.read_bytes(), path.name

        return read

    def _web(self) -> Fetcher:
        if self.fetcher is None:
            raise SyncConfigError(f"The source {self.source.id} fetches nothing from the web.")
        return self.fetcher

    def _url_reader(self, url: str) -> Reader:
        def read() -> tuple[bytes, str]:
            fetched = self._web().fetch(url)
            return fetched.body, fetched.filename

        return read

    def _sitemap_urls(self, sitemap: str, depth: int = 0) -> Iterator[str]:
        """The page URLs a sitemap (or a sitemap index's children) lists on the source's hosts.

        Every URL taken, a child sitemap of an index as much as a page, must be on
        the host of the source's own sitemap or on an allowed host: an index must
        not lead ``kb sync`` to index another site through a child sitemap there.
        Lazily, within the run's budget of entries (``truncated`` says when it ran out).
        """
        body = self._web().fetch(sitemap, xml=True).body
        for i, (loc, is_index) in enumerate(_sitemap_entries(sitemap, body)):
            index = is_index and depth == 0  # a nested index's entries are taken as pages
            if i >= MAX_SITEMAP_URLS:
                self.report.truncated = (
                    f"{sitemap} lists more than {MAX_SITEMAP_URLS:,} URLs, the protocol's limit "
                    f"for one file; the rest (from {loc[:200]}) were not read and nothing was "
                    "removed"
                )
                return
            if self.entries_read >= self.max_urls:
                self.report.truncated = (
                    f"the sitemap lists more than {self.max_urls:,} entries, the most one run "
                    f"reads; the rest (from {loc[:200]}) were not read and nothing was removed "
                    "(split the site into sources, one sitemap each)"
                )
                return
            self.entries_read += 1
            try:
                check_url(loc)
            except FetchFailed as exc:
                self.report.failed.append((exc.url, exc.reason))
                continue
            if not self._on_allowed_host(loc):
                other = "a sitemap on another host than the sitemap index" if index else ""
                other = other or "on another host than the sitemap"
                self.report.failed.append((loc, f"{other}; not fetched"))
            elif index:
                yield from self._sitemap_urls(loc, 1)
            else:
                yield loc
            if self.report.truncated:
                return

    def _on_allowed_host(self, url: str) -> bool:
        """Whether ``url`` is on the host of the source's sitemap or an allowed host."""
        own = (urlsplit(self.source.sitemap or "").hostname or "").lower()
        host = (urlsplit(url).hostname or "").lower()
        return host == own or host in self._web().policy.allow_hosts

    # ------------------------------------------------------------ items

    def _one(self, key: str, read: Reader) -> None:
        moved = self._leave_old_scope(key)
        try:
            data, filename = read()
        except FetchFailed as exc:
            if exc.gone and (key in self.items or moved) and not self.report.truncated:
                self._remove(key)
            elif exc.gone and key in self.items:
                why = "not removed while the sitemap is read only in part"
                self.report.failed.append((key, f"{exc.reason}; {why}"))
            else:
                self.report.failed.append((key, exc.reason))
            return
        except (KBError, OSError) as exc:
            self.report.failed.append((key, getattr(exc, "strerror", None) or str(exc)))
            return
        digest = hashlib.sha256(data).hexdigest()
        record = self.items.get(key)
        if record and record["sha256"] == digest and self._current(record):
            self.report.unchanged.append(key)
            return
        done = self.report.changed if record or moved else self.report.added
        if self.dry_run:
            done.append(key)
            return
        name = self._name(key, filename)
        try:
            added = self.kb.add_bytes(
                data,
                name,
                uploader=self.source.uploader,
                scope=self.source.scope,
                title=self._title(key),
                publish=Publish.DIRECT,
            )
        except KBError as exc:
            self.report.failed.append((key, getattr(exc, "reason", None) or str(exc)))
            return
        row = added.document
        if not (added.duplicate and row.state in _LIVE):
            row = self.kb.index_document(row.id, refresh=False)
        if row.state not in _LIVE:
            self.report.failed.append((key, row.failure_reason or f"ended {row.state.value}"))
            return
        self.items[key] = {
            "sha256": digest,
            "doc": row.id,
            "name": document_name(name),
            "scope": self.source.scope,
        }
        if record and int(record["doc"]) != row.id:
            # Replaced in its own scope, the old version is no longer live; moved to the
            # source's new scope, it still is, and nothing else would ever remove it.
            self._drop(record)
        done.append(key)

    def _title(self, key: str) -> str | None:
        """The title ``key``'s document is given; ``None``: the one its text holds."""
        return None

    def _name(self, key: str, filename: str) -> str:
        shown = key.split("://", 1)[-1].rstrip("/").replace("/", _SEPARATOR)
        if not shown.lower().endswith(Path(filename).suffix.lower()):
            shown += Path(filename).suffix
        return f"{self.source.id}{_SEPARATOR}{shown}"

    def _current(self, record: dict[str, Any]) -> bool:
        """Whether the recorded document is still live, in the scope the source now gives."""
        try:
            row = self.kb.store.document(int(record["doc"]))
        except DocumentNotFound:
            return False
        return row.state in _LIVE and row.scope == self.source.scope

    def _leave_old_scope(self, key: str) -> bool:
        """Take ``key``'s document out of the scope the source no longer gives; was it moved?

        Before anything is fetched: whatever happens to the new copy (a failed
        fetch, a file that no longer indexes), nothing stays visible where the
        source no longer publishes. The next run retries the new copy.
        """
        record = self.items.get(key)
        if record is None or self._recorded_scope(record) in (None, self.source.scope):
            return False
        if not self.dry_run:
            del self.items[key]
            self._drop(record)
        return True

    def _recorded_scope(self, record: dict[str, Any]) -> str | None:
        if "scope" in record:
            return str(record["scope"])
        try:  # records written before scopes were recorded
            return self.kb.store.document(int(record["doc"])).scope
        except DocumentNotFound:
            return None

    def _remove(self, key: str) -> None:
        record = self.items.pop(key, None)
        self.report.removed.append(key)
        if record is not None and not self.dry_run:
            self._drop(record)

    def _drop(self, record: dict[str, Any]) -> None:
        """Remove the document ``record`` names, if it is still the one this source created.

        It is when its name and scope are the ones the source gave it (the scope is
        recorded with it: the source's scope may have changed since), whatever
        scope the source has now; never while another item still names it.
        """
        if any(r["doc"] == record["doc"] for r in self.items.values()):
            return
        try:
            row = self.kb.store.document(int(record["doc"]))
        except DocumentNotFound:
            return  # removed by hand already
        # Records written before scopes were recorded name the document by id and name.
        scope = record.get("scope", row.scope)
        if row.name == record["name"] and row.scope == scope and row.state in _LIVE:
            # One snapshot refresh at the end of the run, not one per removal.
            self.kb.remove(row.id, actor=f"sync:{self.source.id}", refresh=False)

    # ------------------------------------------------------------ the record

    def _meta_key(self) -> str:
        return f"sync:{self.source.id}"

    def _load_record(self) -> dict[str, dict[str, Any]]:
        raw = self.kb.store.get_meta(self._meta_key())
        if raw is None:
            return {}
        record = json.loads(raw)
        if record.get("location") != self.source.location:
            raise SyncConfigError(
                f"The sync source id {self.source.id!r} was used for {record.get('location')}; "
                "give this source its own id (--id, or id in the config file)."
            )
        items: dict[str, dict[str, Any]] = record.get("items", {})
        return items

    def _save_record(self) -> None:
        record = {"location": self.source.location, "items": self.items}
        self.kb.store.set_meta(self._meta_key(), json.dumps(record, sort_keys=True))
