"""Notion as a source, through ``notion-client`` (the Python SDK of Notion's public API).

One source per integration: everything its workspace shares with the
integration. What is read (API version ``2025-09-03``, the SDK's):

* the pages: ``search`` with ``filter: {property: object, value: page}``, page
  after page by ``start_cursor``/``next_cursor``; and the rows of every shared
  database, since Notion's search index lags behind new pages: each data source
  ``search`` finds (``value: data_source``) is read with ``data_sources.query``
  (the 2025-09-03 name of ``databases.query``; a database holds data sources);
* a page's content: ``blocks.children.list``, page after page, and again for
  each block that ``has_children`` (a sub-page or a database inside it is a
  document of its own), rendered by :func:`render_page` into HTML for the
  product's own extractor: headings, paragraphs, lists, to-dos, code, quotes,
  callouts, toggles, tables, and a row's properties;
* the changes: ``search`` sorted by ``last_edited_time`` descending, read down
  to the checkpoint less an overlap (Notion rounds the time to the minute and
  indexes with a lag), plus each data source's rows edited since;
* the listing: every page id it sees, archived and trashed ones left out, so a
  page deleted, trashed or no longer shared is removed.

Who may read: Notion's API gives an integration no page's permissions, so the
admin says it for the whole source when adding it: everyone in the
organisation, users, domains, or ``workspace`` (the workspace's members as
``users.list`` gives them, by email). None said: unknown, nobody reads it. A
page's ``people`` properties are not permissions and are not read as such.

Failures: ``rate_limited`` (429) waits ``Retry-After`` (Notion asks for about
three requests a second), 5xx and dropped connections back off, all within
one budget per call (``index.sources.retry``). ``unauthorized`` and
``restricted_resource`` are the credentials or the integration's capabilities:
no retry. ``object_not_found`` for a page read after it was listed skips it
(the next listing prunes it). The SDK's own retries are off and its log stays
at WARNING (it never logs the secret; its DEBUG lines hold whole bodies).
"""

from __future__ import annotations

import functools
import html
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx
from notion_client import Client
from notion_client.errors import HTTPResponseError, RequestTimeoutError

from index.sources.contract import (
    UNKNOWN_ACL,
    Acl,
    Batch,
    GroupMembers,
    SourceCredentialsRejected,
    SourceDocument,
    SourceError,
    SourceFailed,
)
from index.sources.fields import Listing, checkpoint_of, checkpoint_time, file_name, timestamp
from index.sources.retry import DEFAULT_BUDGET_SECONDS, Retry, RetryBudget, retry_after

__all__ = ["WORKSPACE_GROUP", "NotionConnector", "NotionSettings", "render_page"]

log = logging.getLogger(__name__)
_SDK_LOG = logging.getLogger("notion_client")

API_URL = "https://api.notion.com"
# Notion's own cap on page_size for every paginated endpoint.
PAGE_SIZE = 100
# Nesting followed inside one page; Notion's editor nests far less deep.
MAX_DEPTH = 24
# Blocks read of one page at most (a block is a paragraph, a list item, a table row...):
# past it the page is skipped and said, rather than a run spent on one page.
MAX_BLOCKS = 20_000
# last_edited_time is rounded to the minute and search indexes with a lag: an hour's overlap.
POLL_OVERLAP = timedelta(hours=1)
# The one group Notion's API can expand: the workspace's members (users.list).
WORKSPACE_GROUP = "workspace"
_NOTION_HOSTS = ("notion.so", "notion.site")
_NOTION_ID = re.compile(r"[0-9a-fA-F]{32}")


@dataclass(frozen=True)
class NotionSettings:
    """What ``kb source add notion`` records (never the secret): who reads the source.

    Attributes:
        public: everyone in the organisation reads it.
        users: emails of people who read it.
        groups: groups whose members read it; only :data:`WORKSPACE_GROUP`, which
            Notion's ``users.list`` expands.
        domains: email domains whose people read it.
        api_url: the API's base URL (Notion's own, or a proxy in front of it).
    """

    public: bool = False
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    api_url: str = API_URL

    # The settings that say who reads the source, which ``kb source readers`` changes.
    READERS: ClassVar[tuple[str, ...]] = ("public", "users", "groups", "domains")

    def __post_init__(self) -> None:
        if not re.match(r"https?://[^/\s]+", self.api_url):
            raise SourceError(f"{self.api_url!r} is not an address of Notion's API (https://...).")
        for user in self.users:
            if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", user.strip()):
                raise SourceError(f"{user!r} is not an email address (--user).")
        for domain in self.domains:
            if not re.fullmatch(r"@?[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+", domain.strip()):
                raise SourceError(f"{domain!r} is not an email domain (--domain example.com).")
        for group in self.groups:
            if group != WORKSPACE_GROUP:
                raise SourceError(
                    f"Notion's API has no group {group!r}: the only group it can list the "
                    f"members of is {WORKSPACE_GROUP!r} (the workspace's members). Name people "
                    "with --user or --domain, or everyone with --public."
                )

    @property
    def acl(self) -> Acl:
        """Who reads every page of the source; none said: unknown (nobody)."""
        if not (self.public or self.users or self.groups or self.domains):
            return UNKNOWN_ACL
        return Acl.of(self.users, self.groups, self.domains, public=self.public)

    def as_dict(self) -> dict[str, Any]:
        """As recorded in the store."""
        return {
            "public": self.public,
            "users": list(self.users),
            "groups": list(self.groups),
            "domains": list(self.domains),
            "api_url": self.api_url,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NotionSettings:
        """From :meth:`as_dict`."""
        return cls(
            public=bool(data.get("public")),
            users=tuple(data.get("users") or ()),
            groups=tuple(data.get("groups") or ()),
            domains=tuple(data.get("domains") or ()),
            api_url=str(data.get("api_url") or API_URL),
        )

    def acl_now(self, before: NotionSettings, acl: Acl) -> Acl:
        """A synced page's permissions once the readers are these: the readers themselves,
        since they are every page's (the workspace's members come with the next sync)."""
        return self.acl


class NotionConnector:
    """The pages shared with a Notion integration, as a :class:`index.sources.contract.Connector`.

    Args:
        settings: who reads the source, and the API's address.
        token: the internal integration secret.
        sleep: how a wait is waited (tests record it).
        budget_seconds: the most one call waits for retries before the run fails.
        timeout: seconds for one HTTP request.
        max_blocks: the most blocks of one page read; a larger page is skipped and reported.
    """

    kind = "notion"

    def __init__(
        self,
        settings: NotionSettings,
        token: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        timeout: int = 30,
        max_blocks: int = MAX_BLOCKS,
    ) -> None:
        if not token:
            raise SourceError(
                "No Notion secret: set KB_NOTION_TOKEN (or the secret file the source names)."
            )
        self.settings = settings
        self.sleep = sleep
        self.budget_seconds = budget_seconds
        self.max_blocks = max_blocks
        # The SDK's own retries are off: ours wait within a budget and say why they stopped.
        self.client = Client(
            auth=token,
            base_url=settings.api_url.rstrip("/"),
            timeout_ms=timeout * 1000,
            retry=False,
            logger=_SDK_LOG,
            log_level=logging.WARNING,
        )

    # ------------------------------------------------------------ the contract

    def load(self) -> Batch:
        """Every page shared with the integration."""
        return self._changes(self._pages(), None)

    def poll(self, checkpoint: str) -> Batch:
        """The pages edited since ``checkpoint`` less :data:`POLL_OVERLAP`; the same bytes
        fetched again are not indexed again."""
        since = checkpoint_time(checkpoint)
        return self._changes(self._pages(since - POLL_OVERLAP), since)

    def listing(self) -> frozenset[str]:
        """The ids of every page the integration sees now, archived and trashed ones left out."""
        return frozenset(str(p["id"]) for p in self._pages() if _live(p))

    def permissions(self, items: Iterable[str]) -> dict[str, Acl]:
        """The source's Acl for each page: Notion shows an integration no page's own."""
        acl = self.settings.acl
        return {item: acl for item in items}

    def groups(self, names: Iterable[str]) -> list[GroupMembers]:
        """``workspace``: the workspace's members by email; any other name: nobody."""
        return [self._group(name) for name in names]

    # ------------------------------------------------------------ pages

    def _changes(self, pages: list[dict[str, Any]], since: datetime | None) -> Batch:
        stamps = [w for p in pages if (w := timestamp(p.get("last_edited_time"))) is not None]
        latest = max([*stamps, *([since] if since else [])], default=None)
        checkpoint = checkpoint_of(latest)
        failed: list[tuple[str, str]] = []
        live = [p for p in pages if _live(p)]
        return Batch(self._documents(live, failed), checkpoint, failed)

    def _documents(
        self, pages: list[dict[str, Any]], failed: list[tuple[str, str]]
    ) -> Iterator[SourceDocument]:
        for page in pages:
            item = str(page["id"])
            try:
                _notion_id(item, "this page")
                title = _title(page)
                blocks = self._blocks(item, 0, [0], {item})
            except _Malformed as exc:
                failed.append((item, str(exc)))
                continue
            if blocks is None:
                continue  # unshared or deleted since it was listed: the next listing prunes it
            data = render_page(title, _properties(page), blocks).encode()
            yield SourceDocument(
                item=item,
                title=title,
                url=_url_of(page),
                data=data,
                filename=f"{file_name(title, 'page')}.html",
                media_type="text/html",
                acl=self.settings.acl,
                version=str(page.get("last_edited_time") or ""),
            )

    def _pages(self, since: datetime | None = None) -> list[dict[str, Any]]:
        """The pages search finds (down to ``since``, newest first, when given), then the rows
        of every shared data source search did not give; one search lists twice stays twice
        (the sync takes it once and says so)."""
        body: dict[str, Any] = {"filter": {"property": "object", "value": "page"}}
        if since is not None:
            body["sort"] = {"timestamp": "last_edited_time", "direction": "descending"}
        found: list[dict[str, Any]] = []
        for page in self._list(lambda cursor: self.client.search(**body, **cursor)):
            _check_page(page)
            edited = timestamp(page.get("last_edited_time"))
            if since is not None and edited is not None and edited < since:
                break  # sorted newest first: the rest are older still
            found.append(page)
        seen = {str(p["id"]) for p in found}
        for source in self._data_sources():
            for row in self._rows(source, since):
                if str(row["id"]) not in seen:
                    seen.add(str(row["id"]))
                    found.append(row)
        return found

    def _data_sources(self) -> list[str]:
        body = {"filter": {"property": "object", "value": "data_source"}}
        ids = []
        for found in self._list(lambda cursor: self.client.search(**body, **cursor)):
            if not isinstance(found, dict) or not _is_notion_id(found.get("id")):
                raise SourceFailed("Notion's search answered a result that is not a data source.")
            ids.append(found["id"])
        return ids

    def _rows(self, source: str, since: datetime | None) -> list[dict[str, Any]]:
        body: dict[str, Any] = {}
        if since is not None:
            stamp = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
            body["filter"] = {
                "timestamp": "last_edited_time",
                "last_edited_time": {"on_or_after": stamp},
            }
        rows = []
        query = self.client.data_sources.query
        try:
            for row in self._list(lambda cursor: query(source, **body, **cursor), missing=True):
                if isinstance(row, dict) and row.get("object") == "page":
                    _check_page(row)
                    rows.append(row)
        except _Missing:
            return []  # no longer shared since search listed it
        return rows

    def _blocks(
        self, block_id: str, depth: int, read: list[int], opened: set[str]
    ) -> list[dict[str, Any]] | None:
        """The children of ``block_id``, each with its own under ``_children``; ``None``: the
        page is not there (deleted or unshared since it was listed). ``read[0]`` counts the
        page's blocks read so far; ``opened`` holds the blocks whose children were read (the
        page's own id first), so that a block inside itself is opened once."""
        children = self.client.blocks.children.list
        found: list[dict[str, Any]] = []
        rows = []
        try:
            for row in self._list(lambda cursor: children(block_id, **cursor), missing=True):
                # Counted as they come: a list that pages on for ever stops at the limit.
                read[0] += 1
                if read[0] > self.max_blocks:
                    raise _Malformed(
                        f"This page has more than {self.max_blocks} blocks; it was skipped."
                    )
                rows.append(row)
        except _Missing:
            return None
        for row in rows:
            if not isinstance(row, dict) or not isinstance(row.get("type"), str):
                raise _Malformed("Notion gave a block of this page that is not a block; skipped.")
            nested = row.get("has_children") and row["type"] not in _OWN_DOCUMENTS
            inside: list[dict[str, Any]] = []
            inner = str(row.get("id"))
            if nested and depth < MAX_DEPTH and inner not in opened:
                _notion_id(inner, "a block of this page")
                opened.add(inner)
                inside = self._blocks(inner, depth + 1, read, opened) or []
            # Always ours: a "_children" Notion sent is not read as blocks.
            found.append({**row, "_children": inside})
        return found

    def _list(
        self,
        call: Callable[[dict[str, Any]], Any],
        *,
        missing: bool = False,
        restricted: bool = False,
    ) -> Iterator[Any]:
        """Every result of a paginated answer, following ``next_cursor`` while ``has_more``.

        ``missing``: ``object_not_found`` raises :class:`_Missing` (the object is gone);
        ``restricted``: ``restricted_resource`` raises :class:`_Restricted`.
        """
        cursor: dict[str, Any] = {"page_size": PAGE_SIZE}
        listing = Listing("Notion")
        while True:
            answer = self._call(
                functools.partial(call, cursor), missing=missing, restricted=restricted
            )
            if answer is None:
                raise _Missing()
            results = answer.get("results")
            if not isinstance(results, list):
                raise SourceFailed("Notion answered a list without results.")
            yield from results
            if not answer.get("has_more"):
                return
            following = answer.get("next_cursor")
            if not isinstance(following, str) or not following:
                raise SourceFailed("Notion said more results follow but gave no next_cursor.")
            following = listing.next_page(following, empty=not results)
            cursor = {"page_size": PAGE_SIZE, "start_cursor": following}

    # ------------------------------------------------------------ people

    def _group(self, name: str) -> GroupMembers:
        if name != WORKSPACE_GROUP:
            return GroupMembers(name, frozenset(), complete=False)
        emails: set[str] = set()
        complete = True
        try:
            for user in self._list(self._users, restricted=True):
                if not isinstance(user, dict) or user.get("type") != "person":
                    continue  # bots read nothing here
                email = (user.get("person") or {}).get("email")
                if isinstance(email, str) and "@" in email:
                    emails.add(email.strip().lower())
                else:
                    complete = False
        except _Restricted:
            log.warning(
                "Notion will not list the workspace's users to this integration (it needs the "
                "'Read user information including email addresses' capability); %s admits nobody",
                WORKSPACE_GROUP,
            )
            complete = False
        return GroupMembers(name, frozenset(emails), complete)

    def _users(self, cursor: dict[str, Any]) -> Any:
        return self.client.users.list(**cursor)

    # ------------------------------------------------------------ calls

    def _call(
        self, call: Callable[[], Any], *, missing: bool = False, restricted: bool = False
    ) -> dict[str, Any] | None:
        """``call()``, waiting out 429s, 5xx and dropped connections within the budget.

        ``missing``: ``object_not_found`` is ``None`` (gone, or no longer shared);
        ``restricted``: ``restricted_resource`` raises :class:`_Restricted` (a capability
        the integration was not given, for a call it can do without).

        Raises:
            SourceCredentialsRejected: ``unauthorized``, or ``restricted_resource``.
            SourceFailed: the budget is spent, an answer that is not JSON, or any other error.
        """
        budget = RetryBudget("Notion", self.budget_seconds, self.sleep)
        try:
            answer = budget.run(call, _transient)
        except HTTPResponseError as exc:
            code = _code(exc)
            if code == "object_not_found" and missing:
                return None
            if code == "restricted_resource" and restricted:
                raise _Restricted() from None
            raise _refused(code, exc.status) from None
        except ValueError:
            raise SourceFailed("Notion answered something that is not JSON.") from None
        if not isinstance(answer, dict):
            raise SourceFailed("Notion answered something that is not a JSON object.")
        return answer


# Error codes no wait helps, whatever the status they come with.
_PERMANENT = frozenset({"object_not_found", "restricted_resource", "unauthorized"})

# Blocks that are documents of their own: their content is not read into the page's.
_OWN_DOCUMENTS = frozenset({"child_page", "child_database"})


class _Malformed(Exception):
    """A page Notion gave in a shape it should not have."""


class _Missing(Exception):
    """An object gone since it was listed (``object_not_found``)."""


class _Restricted(Exception):  # noqa: N818 (what Notion calls it)
    """``restricted_resource`` where the call is optional: the integration lacks a capability."""


def _transient(exc: Exception) -> Retry | None:
    """A 429 (its ``Retry-After``), a 5xx or a dropped connection: worth asking again."""
    if isinstance(exc, HTTPResponseError):
        code, status = _code(exc), exc.status
        if code in _PERMANENT or (status != 429 and status < 500):
            return None
        asked = retry_after(exc.headers.get("retry-after")) if status == 429 else None
        return Retry(f"HTTP {status}", asked)
    if isinstance(exc, (RequestTimeoutError, httpx.TransportError)):
        return Retry("unreachable")
    return None


def _code(exc: HTTPResponseError) -> str:
    """Notion's error code (``object_not_found``...), as text."""
    return str(getattr(exc.code, "value", exc.code))


def _refused(code: str, status: int) -> SourceFailed:
    """What an error no wait helps means."""
    if code == "unauthorized" or status == 401:
        return SourceCredentialsRejected(
            "Notion refused the integration's secret (unauthorized): it was revoked or "
            "regenerated, or is not an internal integration secret. Set the current one."
        )
    if code == "restricted_resource" or status == 403:
        return SourceCredentialsRejected(
            "Notion says the integration may not do this (restricted_resource): give it the "
            "'Read content' capability in its settings (notion.so/profile/integrations)."
        )
    return SourceFailed(f"Notion answered HTTP {status} ({code}).")


def _check_page(page: object) -> None:
    if (
        not isinstance(page, dict)
        or page.get("object") != "page"
        or not isinstance(page.get("id"), str)
    ):
        raise SourceFailed("Notion's search answered a result that is not a page.")


def _is_notion_id(value: object) -> bool:
    """Whether ``value`` is a Notion id (a UUID, dashes or none): a path in an address it never is."""
    return isinstance(value, str) and bool(_NOTION_ID.fullmatch(value.replace("-", "")))


def _notion_id(value: str, what: str) -> None:
    """Raises :class:`_Malformed` unless ``value`` is a Notion id (``what`` has it)."""
    if not _is_notion_id(value):
        raise _Malformed(f"Notion gave {what} an id that is no Notion id; skipped.")


def _live(page: dict[str, Any]) -> bool:
    """Not archived nor trashed: only ``true`` says so (a "false" sent as text is not a
    deletion, and removing what is still there loses it)."""
    return not (page.get("archived") is True or page.get("in_trash") is True)


def _title(page: dict[str, Any]) -> str:
    properties = page.get("properties")
    if isinstance(properties, dict):
        for value in properties.values():
            if isinstance(value, dict) and value.get("type") == "title":
                title = _plain(value.get("title")).strip()
                if title:
                    return title
    raise _Malformed("Notion gave this page without a title; it was skipped.")


def _url_of(page: dict[str, Any]) -> str:
    """The page's address on Notion (its ``url`` when it is Notion's, else one made of its id)."""
    url = page.get("url")
    if isinstance(url, str):
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme == "https" and any(
            host == h or host.endswith("." + h) for h in _NOTION_HOSTS
        ):
            return url
    return "https://www.notion.so/" + re.sub(r"[^0-9a-f]", "", str(page["id"]).lower())


def _plain(rich: object) -> str:
    """Rich text's words (each run's ``plain_text``)."""
    if not isinstance(rich, list):
        return ""
    return "".join(str(r.get("plain_text") or "") for r in rich if isinstance(r, dict))


def _properties(page: dict[str, Any]) -> list[tuple[str, str]]:
    """A row's properties other than its title, as words (people are left out: not content
    the row was written with, and never a permission)."""
    found = []
    properties = page.get("properties")
    for name, value in properties.items() if isinstance(properties, dict) else []:
        words = _property_words(value) if isinstance(value, dict) else ""
        if words:
            found.append((str(name), words))
    return found


def _property_words(value: dict[str, Any]) -> str:
    kind = value.get("type")
    data = value.get(kind) if isinstance(kind, str) else None
    if kind in ("rich_text",):
        return _plain(data)
    if kind in ("number", "url", "email", "phone_number") and data is not None:
        return str(data)
    if kind in ("select", "status") and isinstance(data, dict):
        return str(data.get("name") or "")
    if kind == "multi_select" and isinstance(data, list):
        return ", ".join(str(o.get("name")) for o in data if isinstance(o, dict))
    if kind == "checkbox":
        return "yes" if data else "no"
    if kind == "date" and isinstance(data, dict):
        return " – ".join(str(d) for d in (data.get("start"), data.get("end")) if d)
    if kind == "formula" and isinstance(data, dict):
        shown = data.get(str(data.get("type")))
        return "" if shown is None else str(shown)
    return ""


# ------------------------------------------------------------------ rendering


_LISTS = {"bulleted_list_item": "ul", "numbered_list_item": "ol", "to_do": "ul"}
_HEADINGS = {"heading_1": "h2", "heading_2": "h3", "heading_3": "h4"}


def render_page(title: str, properties: list[tuple[str, str]], blocks: list[dict[str, Any]]) -> str:
    """A page as an HTML document: its title, a row's properties, then its blocks."""
    head = f'<!doctype html><html><head><meta charset="utf-8"><title>{_e(title)}</title></head>'
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in properties)
    table = f"<table>{rows}</table>" if rows else ""
    return f"{head}<body><h1>{_e(title)}</h1>{table}{_render(blocks)}</body></html>"


def _render(blocks: list[dict[str, Any]]) -> str:
    """Blocks as HTML, consecutive list items of one kind in one list."""
    out: list[str] = []
    open_list: str | None = None
    for b in blocks:
        kind = str(b.get("type"))
        wanted = kind if kind in _LISTS else None
        if open_list != wanted:
            if open_list is not None:
                out.append(f"</{_LISTS[open_list]}>")
            if wanted is not None:
                out.append(f"<{_LISTS[wanted]}>")
            open_list = wanted
        out.append(_block(kind, b))
    if open_list is not None:
        out.append(f"</{_LISTS[open_list]}>")
    return "".join(out)


def _block(kind: str, b: dict[str, Any]) -> str:
    found = b.get(kind)
    body: dict[str, Any] = found if isinstance(found, dict) else {}
    words = _e(_plain(body.get("rich_text")))
    inner = _render(b.get("_children") or [])
    if kind in _HEADINGS:
        return f"<{_HEADINGS[kind]}>{words}</{_HEADINGS[kind]}>{inner}"
    if kind == "to_do":
        mark = "[x]" if body.get("checked") else "[ ]"
        return f"<li>{mark} {words}{inner}</li>"
    if kind in _LISTS:
        return f"<li>{words}{inner}</li>"
    if kind == "paragraph":
        return f"<p>{words}</p>{inner}" if words else inner
    if kind == "quote":
        return f"<blockquote><p>{words}</p>{inner}</blockquote>"
    if kind == "callout":
        return f"<div><p>{words}</p>{inner}</div>"
    if kind == "toggle":
        return f"<details open><summary>{words}</summary>{inner}</details>"
    if kind == "code":
        caption = _plain(body.get("caption"))
        shown = f"<pre><code>{words}</code></pre>"
        return shown + (f"<p>{_e(caption)}</p>" if caption else "")
    if kind == "table":
        return _table(b, body)
    if kind in _OWN_DOCUMENTS:
        return f"<p>{_e(str(body.get('title') or ''))}</p>"
    if kind == "equation":
        return f"<p>{_e(str(body.get('expression') or ''))}</p>"
    if kind == "divider":
        return "<hr>"
    caption = _plain(body.get("caption"))
    return (f"<p>{_e(caption)}</p>" if caption else "") + inner


def _table(b: dict[str, Any], body: dict[str, Any]) -> str:
    rows = []
    for n, row in enumerate(b.get("_children") or []):
        found = row.get("table_row") if isinstance(row, dict) else None
        cells = found.get("cells") if isinstance(found, dict) else None
        tag = "th" if n == 0 and body.get("has_column_header") else "td"
        cells = cells if isinstance(cells, list) else []
        shown = "".join(f"<{tag}>{_e(_plain(c))}</{tag}>" for c in cells)
        rows.append(f"<tr>{shown}</tr>")
    return f"<table>{''.join(rows)}</table>"


def _e(words: str) -> str:
    return html.escape(words, quote=False)
