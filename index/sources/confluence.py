"""Confluence (Cloud and Data Center) as a source, through ``atlassian-python-api``'s REST client.

One space per source. What is read, all with the REST API v1 (``/rest/api``;
on Cloud under ``/wiki``), which both Cloud and Data Center serve:

* the listing and the changes: CQL ``space = "KEY" and type = page`` (plus
  ``lastmodified >= "date"`` for a poll) through ``/rest/api/search``,
  following ``_links.next`` page after page;
* a page: ``/rest/api/content/{id}?expand=body.export_view,...`` — its
  export view (the rendered HTML, macros expanded), else its storage format,
  given to the product's HTML extractor as a page of its own;
* a page's attachments: ``/rest/api/content/{id}/child/attachment?expand=version``,
  following ``_links.next``, when a page is loaded from scratch; the listing
  of every later run finds the attachments of the whole space with one CQL
  search, ``space = "KEY" and type = attachment`` through
  ``/rest/api/content/search`` (``expand=version,container``: the same rows,
  each with its page), its pages of results rather than one list per page;
  each one the product's extractor reads (PDF,
  Word, PowerPoint, Excel, CSV, Markdown, text, HTML: by its name's suffix,
  else its media type) is a document of its own, item ``att<id>``, its bytes
  from its ``_links.download`` on the configured site only, fetched again only
  when its version number changes. One over the upload limit
  (``extensions.fileSize``, and the bytes as they come) is skipped and
  reported. Its permissions are its page's: Confluence applies the page's
  restrictions to its attachments;
* who may read it: the space's read permission
  (``/rest/api/space/{key}?expand=permissions``) and the read restrictions of
  the page and of each of its ancestors
  (``/rest/api/content/{id}/restriction/byOperation``), which Confluence
  applies all together: a person reads a restricted page only when every
  level admits them. A page with no restriction anywhere gets the space's
  permission (its users, its groups; a group the admin names as the whole
  organisation, or anonymous access, is public-in-organisation). A restricted
  page gets the people every level admits, groups expanded to their members
  (``/rest/api/group/{name}/member``). A person is known by the email
  Confluence shows for them; one it hides (Cloud's profile visibility) admits
  nobody. On Cloud a person admits someone only while their Atlassian account
  is active: the v1 user objects say nothing of it, so each account named is
  looked up once a run with the REST API v2's bulk lookup (``POST
  /api/v2/users-bulk``, 100 ids a request), and one whose ``accountStatus`` is
  not ``active`` (deactivated, closed) or that the lookup does not find admits
  nobody. Data Center's user objects carry no status: a deactivated account
  there is still matched by its email. A level whose restrictions cannot be
  read makes the page unknown: nobody reads it until they can be.

Rate limits and failures: HTTP 429 waits ``Retry-After`` (or backs off), 5xx
and dropped connections back off, 0.5 s doubling, all within one budget of
seconds per call; past it the run fails saying when to retry (a group's member
listing too: it never ends a run "ok" with the group's people shut out). A group
Confluence will not list (gone, hidden) admits nobody. 401 and 403 are
the credentials (expired, revoked, or missing a permission): no retry.
The client logs at INFO at most (its DEBUG lines carry the Authorization header).
"""

from __future__ import annotations

import functools
import html
import itertools
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar
from urllib.parse import quote

import requests
from atlassian.confluence.server import Server
from atlassian.errors import ApiError

from index.config import DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_MAX_UPLOAD_BYTES
from index.sources.contract import (
    UNKNOWN_ACL,
    Acl,
    Batch,
    GroupMembers,
    SourceCredentialsRejected,
    SourceDocument,
    SourceError,
    SourceFailed,
    after_organisation_groups,
)
from index.sources.downloads import PLAIN, Deadline, read_capped, too_large
from index.sources.fields import (
    Listing,
    checkpoint_of,
    checkpoint_time,
    file_name,
    readable_name,
    readable_suffix,
    timestamp,
)
from index.sources.retry import DEFAULT_BUDGET_SECONDS, Retry, RetryBudget, origin, retry_after

__all__ = [
    "ConfluenceConnector",
    "ConfluenceSettings",
]

# The SDK's DEBUG lines hold each request's headers (a token) and whole bodies.
logging.getLogger("atlassian").setLevel(logging.INFO)
log = logging.getLogger(__name__)

# Results per search page: Confluence's own cap on CQL search pages with body expansions is
# 50 (developer.atlassian.com, "Pagination" of the REST API v1); ids only allow it too.
PAGE_SIZE = 50
MAX_ANCESTORS = 64
# Account ids asked about in one bulk lookup (Atlassian returns at most 100 users a request).
USERS_BULK = 100
_SPACE_KEY = re.compile(r"[A-Za-z0-9_~]{1,255}")
# An attachment's item: Confluence's own attachment ids already read "att<number>".
ATTACHMENT_PREFIX = "att"


@dataclass(frozen=True)
class ConfluenceSettings:
    """One Confluence space, as ``kb source add confluence`` records it (no credential).

    Attributes:
        url: the site: ``https://example.atlassian.net/wiki`` (Cloud) or the Data Center base.
        space: the space key.
        user: the account's email on Cloud (basic auth with an API token); empty: the
            token is a Data Center personal access token (bearer).
        organisation_groups: groups that stand for everyone in the organisation
            (``confluence-users``...): what they may read is public in the organisation.
    """

    url: str
    space: str
    user: str = ""
    organisation_groups: tuple[str, ...] = ()

    # The settings that say who reads the source, which ``kb source readers`` changes.
    READERS: ClassVar[tuple[str, ...]] = ("organisation_groups",)

    def __post_init__(self) -> None:
        if not re.match(r"https?://[^/\s]+", self.url):
            raise SourceError(f"{self.url!r} is not a Confluence address (https://...).")
        if not _SPACE_KEY.fullmatch(self.space):
            raise SourceError(f"{self.space!r} is not a Confluence space key.")

    def as_dict(self) -> dict[str, Any]:
        """As recorded in the store."""
        return {
            "url": self.url,
            "space": self.space,
            "user": self.user,
            "organisation_groups": list(self.organisation_groups),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConfluenceSettings:
        """From :meth:`as_dict`."""
        return cls(
            url=str(data["url"]),
            space=str(data["space"]),
            user=str(data.get("user") or ""),
            organisation_groups=tuple(data.get("organisation_groups") or ()),
        )

    def acl_now(self, before: ConfluenceSettings, acl: Acl) -> Acl:
        """A synced page's permissions once the organisation groups are these, not ``before``'s."""
        return after_organisation_groups(before.organisation_groups, self.organisation_groups, acl)


@dataclass(frozen=True)
class _Grant:
    """Who one level (the space, or a page's restrictions) admits."""

    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    public: bool = False


class ConfluenceConnector:
    """A Confluence space as a :class:`index.sources.contract.Connector`.

    Args:
        settings: the site and the space.
        token: the API token (Cloud) or personal access token (Data Center).
        sleep: how a wait is waited (tests record it).
        budget_seconds: the most one call waits for retries before the run fails.
        timeout: seconds for one HTTP request.
        max_bytes: the largest attachment downloaded (the knowledge base's default upload limit).
        download_seconds: the most one attachment's download may take, its retries included.
        clock: the time now, which that is measured on.
    """

    kind = "confluence"

    def __init__(
        self,
        settings: ConfluenceSettings,
        token: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        timeout: int = 30,
        max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
        download_seconds: float = DEFAULT_DOWNLOAD_TIMEOUT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not token:
            raise SourceError(
                "No Confluence token: set KB_CONFLUENCE_TOKEN (or the secret file the source names)."
            )
        self.settings = settings
        self.sleep = sleep
        self.budget_seconds = budget_seconds
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.download_seconds = download_seconds
        self.clock = clock
        # The SDK's own retries are off: ours wait within a budget and say why they stopped.
        common: dict[str, Any] = {
            "timeout": timeout,
            "backoff_and_retry": False,
            "retry_with_header": False,
        }
        if settings.user:
            self.client = Server(settings.url, username=settings.user, password=token, **common)
        else:
            self.client = Server(settings.url, token=token, **common)
        self._space_grant: _Grant | None = None
        self._members: dict[str, GroupMembers] = {}
        # accountStatus of each account this run looked up (Cloud); "" when not found.
        self._statuses: dict[str, str] = {}
        # This run's: each page's attachments as the listing found them, each page's Acl.
        self._listed: dict[str, list[dict[str, Any]]] | None = None
        self._page_of: dict[str, str] = {}
        self._page_acls: dict[str, Acl] = {}

    # ------------------------------------------------------------ the contract

    def load(self) -> Batch:
        """Every page of the space."""
        return self._changes(f'space = "{self.settings.space}" and type = page')

    def poll(self, checkpoint: str) -> Batch:
        """The pages changed since ``checkpoint``, with a day's overlap.

        CQL compares ``lastmodified`` in the account's own time zone, to the
        minute: a day earlier is sure to include every change; a page fetched
        again with the same bytes is not indexed again.
        """
        since = checkpoint_time(checkpoint)
        day = (since - timedelta(days=1)).strftime("%Y-%m-%d")
        cql = f'space = "{self.settings.space}" and type = page and lastmodified >= "{day}"'
        return self._changes(cql, since)

    def listing(self) -> frozenset[str]:
        """The ids of every page of the space now, and of each attachment of theirs it syncs
        (all pages of every list, or it raises)."""
        pages = [i for i, _ in self._search(f'space = "{self.settings.space}" and type = page')]
        self._listed = self._space_attachments(pages)
        self._page_of = {
            _attachment_item(a): page
            for page, rows in self._listed.items()
            for a in rows
            if self._fits(a)
        }
        return frozenset(pages) | frozenset(self._page_of)

    def permissions(self, items: Iterable[str]) -> dict[str, Acl]:
        """Each page's current Acl, an attachment's its page's (unknown where unreadable)."""
        self._space_grant = None
        self._page_acls = {}
        acls = {}
        for item in items:
            page_id: str | None = item
            if _is_attachment(item):
                # The listing just read which page each is on; else Confluence is asked.
                page_id = self._page_of.get(item) or self._container(item)
            acls[item] = UNKNOWN_ACL if page_id is None else self._page_acl(page_id)
        return acls

    def groups(self, names: Iterable[str]) -> list[GroupMembers]:
        """The members of each group, by email."""
        return [self._group(name) for name in names]

    # ------------------------------------------------------------ pages

    def _changes(self, cql: str, since: datetime | None = None) -> Batch:
        self._space_grant = None
        found = self._search(cql)
        latest = max((m for _, m in found if m is not None), default=since)
        checkpoint = checkpoint_of(latest)
        failed: list[tuple[str, str]] = []
        ids = [i for i, _ in found]
        documents = self._documents(ids, failed)
        if since is not None:
            # Attachments change without their page: those of the other pages come too (a
            # version already indexed is not fetched again).
            documents = itertools.chain(documents, self._other_attachments(set(ids), failed))
        return Batch(documents, checkpoint, failed)

    def _documents(self, ids: list[str], failed: list[tuple[str, str]]) -> Iterator[SourceDocument]:
        for item in ids:
            if not _is_content_id(item):
                # It goes into the page's address: "../" there would ask another endpoint.
                failed.append((item, "Confluence gave this page an id that is a path; skipped."))
                continue
            page = self._page(item, "body.export_view,body.storage,version,space,ancestors")
            if page is None:
                continue  # deleted since it was listed: the next listing prunes it
            try:
                document = self._document(item, page)
            except _Malformed as exc:
                failed.append((item, str(exc)))
                continue
            yield document
            # The listing of this run read them already (a load from scratch has none).
            rows = (self._listed or {}).get(item)
            rows = self._attachments(item) if rows is None else rows
            yield from self._attached(item, document.acl, rows, failed)

    def _document(self, item: str, page: dict[str, Any]) -> SourceDocument:
        title = page.get("title")
        body = page.get("body")
        if not isinstance(title, str) or not title.strip() or not isinstance(body, dict):
            raise _Malformed("Confluence gave this page without a title or a body; it was skipped.")
        space = _part(page, "space").get("key")
        if space != self.settings.space:
            raise _Malformed(f"This page is in space {space!r} now, not {self.settings.space!r}.")
        content = _body_html(body)
        if content is None:
            raise _Malformed("Confluence gave this page's body in no format it reads; skipped.")
        data = (
            '<!doctype html><html><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title></head><body>{content}</body></html>"
        ).encode()
        version = str(_part(page, "version").get("number", ""))
        return SourceDocument(
            item=item,
            title=title.strip(),
            url=self._url_of(page),
            data=data,
            filename=f"{file_name(title, 'page')}.html",
            media_type="text/html",
            acl=self._acl(page),
            version=version,
        )

    def _url_of(self, page: dict[str, Any], fallback: str = "") -> str:
        """The page's (or attachment's) address on the configured site (a path the source
        gives, never a host)."""
        webui = _site_path(_part(page, "_links").get("webui"))
        if webui is None:
            webui = (
                fallback or f"/pages/viewpage.action?pageId={quote(str(page.get('id')), safe='')}"
            )
        return self.settings.url.rstrip("/") + webui

    # ------------------------------------------------------------ attachments

    def _attachments(self, page_id: str) -> list[dict[str, Any]]:
        """The page's attachments the extractor reads (all pages of the list, or it raises)."""
        path = f"rest/api/content/{quote(page_id, safe='')}/child/attachment"
        rows = self._pages(path, {"limit": PAGE_SIZE, "expand": "version"})
        return [row for row in rows if _read_attachment(row)]

    def _space_attachments(self, pages: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The attachments the extractor reads of each of ``pages``, from one CQL search over
        the space's attachments: its pages of results, not a list per page.

        ``/rest/api/content/search`` gives each result as the content API does (a
        page's attachment list gives the same rows), its page as ``container``. An
        attachment on a page not listed (a blog post's, a page deleted since) is left out.
        """
        listed: dict[str, list[dict[str, Any]]] = {page: [] for page in pages}
        cql = f'space = "{self.settings.space}" and type = attachment'
        params = {"cql": cql, "limit": PAGE_SIZE, "expand": "version,container"}
        for row in self._pages("rest/api/content/search", params):
            if not _read_attachment(row):
                continue
            page = _part(row, "container").get("id")
            if not isinstance(page, str | int):
                # Its page unknown, it could not be told apart from a deleted one: stop,
                # removing nothing.
                raise SourceFailed("Confluence listed an attachment without its page.")
            listed.get(str(page), []).append(row)
        return listed

    def _other_attachments(
        self, done: set[str], failed: list[tuple[str, str]]
    ) -> Iterator[SourceDocument]:
        """The attachments of every page the listing found but ``done`` does not hold."""
        if self._listed is None:
            self.listing()
        for page_id, rows in (self._listed or {}).items():
            if page_id in done or not rows:
                continue
            acl = self._page_acl(page_id)
            if acl.known or self._page(page_id, "space") is not None:
                yield from self._attached(page_id, acl, rows, failed)

    def _page_acl(self, page_id: str) -> Acl:
        """The page's Acl, read once a run (unknown when it is gone or unreadable)."""
        if page_id not in self._page_acls:
            page = self._page(page_id, "ancestors,space")
            self._page_acls[page_id] = UNKNOWN_ACL if page is None else self._acl(page)
        return self._page_acls[page_id]

    def _attached(
        self,
        page_id: str,
        acl: Acl,
        rows: list[dict[str, Any]],
        failed: list[tuple[str, str]],
    ) -> Iterator[SourceDocument]:
        """The page's attachments as documents with the page's Acl; one too large fails alone."""
        for row in rows:
            item = _attachment_item(row)
            name = row["title"].strip() or item
            if not self._fits(row):
                failed.append((item, too_large(name, self.max_bytes).reason))
                continue
            download = self._download_url(row)
            if download is None:
                failed.append((item, "Confluence gave no download on its own site; skipped."))
                continue
            view = f"/pages/viewpageattachments.action?pageId={quote(page_id, safe='')}"
            yield SourceDocument(
                item=item,
                title=name,
                url=self._url_of(row, view),
                data=b"",
                filename=readable_name(name, _type(row)),
                media_type=_type(row),
                acl=acl,
                version=str(_part(row, "version").get("number", "")),
                fetch=functools.partial(self._download, download, name),
            )

    def _download_url(self, row: dict[str, Any]) -> str | None:
        """Where the attachment's bytes are, on the configured site only (the credentials
        go nowhere else)."""
        download = _part(row, "_links").get("download")
        if not isinstance(download, str) or not download:
            return None
        url = download if "://" in download else self.settings.url.rstrip("/") + download
        return url if origin(url) == origin(self.settings.url) else None

    def _download(self, url: str, name: str) -> bytes | None:
        """The attachment's bytes, read as they come; ``None``: deleted since it was listed.

        Raises:
            TooLarge: more bytes came than a document may have.
            ReadingLimit: the download took longer than ``download_seconds`` (its retries too).
        """
        deadline = Deadline.start(self.download_seconds, self.clock)
        response = self._call(lambda: self._stream(url, deadline, name), missing=True)
        if response is None:
            return None
        try:
            return read_capped(response, name, max_bytes=self.max_bytes, deadline=deadline)
        except requests.RequestException:
            raise SourceFailed(f"Confluence cut off the download of {name}.") from None

    def _stream(self, url: str, deadline: Deadline, name: str) -> requests.Response:
        """The download's response, its body not read yet (an error status raises)."""
        deadline.check(name)
        response = self.client.session.get(url, stream=True, timeout=self.timeout, headers=PLAIN)
        if response.status_code >= 400:
            response.close()
            response.raise_for_status()
        return response

    def _fits(self, row: dict[str, Any]) -> bool:
        """Whether the attachment's stated size is within the limit (none stated: yes, and
        the bytes are counted as they come)."""
        size = _part(row, "extensions").get("fileSize")
        return not (isinstance(size, int) and size > self.max_bytes)

    def _container(self, item: str) -> str | None:
        """The id of the page an attachment is on; ``None``: it is gone."""
        answer = self._call(
            lambda: self.client.get(
                f"rest/api/content/{quote(item, safe='')}", params={"expand": "container"}
            ),
            missing=True,
        )
        container = answer.get("container") if isinstance(answer, dict) else None
        page_id = container.get("id") if isinstance(container, dict) else None
        return str(page_id) if isinstance(page_id, str | int) else None

    def _search(self, cql: str) -> list[tuple[str, datetime | None]]:
        """``(page id, last modified)`` of every result, in the order given (one listed
        twice is given twice: the sync takes it once and says so)."""

        params = {"cql": cql, "limit": PAGE_SIZE, "expand": "content.version"}
        found: list[tuple[str, datetime | None]] = []
        for result in self._pages("rest/api/search", params):
            content = result.get("content") if isinstance(result, dict) else None
            if not isinstance(content, dict) or not isinstance(content.get("id"), str | int):
                raise SourceFailed("Confluence's search answered a result that is not a page.")
            found.append((str(content["id"]), timestamp(result.get("lastModified"))))
        return found

    def _pages(self, path: str, params: dict[str, Any]) -> Iterator[Any]:
        """Every result of a paged answer, following ``_links.next`` (relative to ``_links.base``).

        A next link to another site than the configured one is refused: the
        credentials go only where the admin pointed them.
        """
        url: str | None = path
        absolute = False
        listing = Listing("Confluence")
        while True:
            if url is None:
                return
            answer = self._call(
                functools.partial(self.client.get, url, params=params, absolute=absolute)
            )
            if not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
                raise SourceFailed("Confluence answered a list that is not JSON of results.")
            yield from answer["results"]
            url, params, absolute = self._next(answer.get("_links")), {}, True
            url = url and listing.next_page(url, empty=not answer["results"])

    def _next(self, links: object) -> str | None:
        if not isinstance(links, dict):
            return None
        following = links.get("next")
        if not isinstance(following, str) or not following:
            return None
        base = str(links.get("base") or self.settings.url).rstrip("/")
        url = following if "://" in following else base + "/" + following.lstrip("/")
        if origin(url) != origin(self.settings.url):
            raise SourceFailed("Confluence pointed the next page at another site; refused.")
        return url

    def _page(self, item: str, expand: str) -> dict[str, Any] | None:
        page = self._call(lambda: self.client.get_page_by_id(item, expand=expand), missing=True)
        if page is None:
            return None
        if not isinstance(page, dict):
            raise SourceFailed(f"Confluence answered page {item} with something that is not JSON.")
        return page

    # ------------------------------------------------------------ permissions

    def _acl(self, page: dict[str, Any]) -> Acl:
        try:
            space = self._space()
            if not _is_content_id(page.get("id")):
                raise _Unreadable("its id is a path")
            levels = [self._restrictions(str(page.get("id")))]
            ancestors = page.get("ancestors") or []
            if not isinstance(ancestors, list) or not all(
                isinstance(a, dict) and _is_content_id(a.get("id")) for a in ancestors
            ):
                raise _Unreadable("its ancestors are not a list of pages")
            if len(ancestors) > MAX_ANCESTORS:
                # Each ancestor's restrictions bind the page: none may go unread (the list
                # runs from the space's top, so the nearest would be the ones left out).
                raise _Unreadable(f"it has more than {MAX_ANCESTORS} ancestors")
            for ancestor in ancestors:
                levels.append(self._restrictions(str(ancestor.get("id"))))
        except _Unreadable as exc:
            log.warning("Confluence page %s: %s; nobody may read it", page.get("id"), exc)
            return UNKNOWN_ACL
        restricting = [level for level in levels if level is not None]
        if not restricting:
            return Acl(users=space.users, groups=space.groups, public=space.public)
        allowed = None if space.public else self._people(space)
        for level in restricting:
            people = self._people(level)
            allowed = people if allowed is None else allowed & people
        return Acl(users=frozenset(allowed or ()))

    def _space(self) -> _Grant:
        if self._space_grant is None:
            key = self.settings.space
            space = self._call(
                lambda: self.client.get_space(key, expand="permissions"), missing=True
            )
            if not isinstance(space, dict):
                raise SourceFailed(f"Confluence has no space {key} this token can read.")
            self._space_grant = self._space_read(space.get("permissions"))
        return self._space_grant

    def _space_read(self, permissions: object) -> _Grant:
        if not isinstance(permissions, list):
            raise _Unreadable("the space's permissions were not given")
        users: set[str] = set()
        groups: set[str] = set()
        public = False
        for permission in permissions:
            # A permission of another shape grants nothing ("false" is not false: only true is).
            if not isinstance(permission, dict):
                continue
            operation = _part(permission, "operation")
            if operation.get("operation") != "read" or operation.get("targetType") != "space":
                continue
            public = public or permission.get("anonymousAccess") is True
            subjects = _part(permission, "subjects")
            users.update(self._readers(_part(subjects, "user").get("results")))
            groups.update(_names(_part(subjects, "group").get("results")))
        organisation = set(self.settings.organisation_groups)
        public = public or bool(groups & organisation)
        return _Grant(frozenset(users), frozenset(groups - organisation), public)

    def _restrictions(self, content_id: str) -> _Grant | None:
        """The page's read restrictions; ``None``: it has none."""
        answer = self._call(
            lambda: self.client.get_all_restrictions_for_content(content_id),
            missing=True,
            hidden=True,
        )
        if not isinstance(answer, dict):
            raise _Unreadable(f"the restrictions of {content_id} could not be read")
        # Absent is none; of another shape ([] or 0 where an object or a list belongs) is
        # unread, never "no restrictions": the page would go to its whole space.
        read = _shaped(_shaped(answer, "read", content_id), "restrictions", content_id)
        user_rows = _results(_shaped(read, "user", content_id), content_id)
        group_rows = _results(_shaped(read, "group", content_id), content_id)
        if not user_rows and not group_rows:
            return None
        return _Grant(frozenset(self._readers(user_rows)), frozenset(_names(group_rows)))

    def _people(self, grant: _Grant) -> frozenset[str]:
        """The emails ``grant`` admits, its groups expanded (members hidden count as nobody)."""
        people = set(grant.users)
        for group in grant.groups:
            people |= self._group(group).emails
        return frozenset(people)

    def _group(self, name: str) -> GroupMembers:
        if name not in self._members:
            emails: set[str] = set()
            complete = True
            try:
                rows = list(
                    self._pages(
                        f"rest/api/group/{quote(name, safe='')}/member", {"limit": PAGE_SIZE}
                    )
                )
                # A member whose email is hidden is unknown: the list is not complete. One
                # whose account is not active is known, and reads nothing.
                complete = all(next(_emails([row]), None) is not None for row in rows)
                emails.update(self._readers(rows))
            except SourceFailed as exc:
                # Rate-limited or failing past the budget: the run fails and says when to
                # retry, rather than ending "ok" with the group's people shut out until the
                # next one. A group Confluence will not list (gone, hidden) admits nobody.
                if isinstance(exc, SourceCredentialsRejected) or exc.retry_after is not None:
                    raise
                log.warning("Confluence group %s: %s; its members count as nobody", name, exc)
                complete = False
            self._members[name] = GroupMembers(name, frozenset(emails), complete)
        return self._members[name]

    def _readers(self, rows: object) -> Iterator[str]:
        """The emails of the user objects ``rows`` who may read: shown, and on Cloud of an
        account Atlassian says is active (see the module's docstring)."""
        users = [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []
        if not self.settings.user:  # Data Center: its user objects carry no status
            yield from _emails(users)
            return
        self._look_up([row.get("accountId") for row in users])
        for row in users:
            account = row.get("accountId")
            if isinstance(account, str) and self._statuses.get(account) == "active":
                yield from _emails([row])

    def _look_up(self, accounts: list[object]) -> None:
        """Remember the ``accountStatus`` of each of ``accounts`` not asked about yet this run.

        An account the lookup does not return (gone), or returns without a
        status, is remembered as ``""``: not active.

        Raises:
            SourceFailed: Confluence failed past the budget, or answered other than JSON.
        """
        new = [a for a in dict.fromkeys(accounts) if isinstance(a, str) and a]
        new = [a for a in new if a not in self._statuses]
        for start in range(0, len(new), USERS_BULK):
            batch = new[start : start + USERS_BULK]
            answer = self._call(
                functools.partial(self.client.post, "api/v2/users-bulk", data={"accountIds": batch})
            )
            results = answer.get("results") if isinstance(answer, dict) else None
            if not isinstance(results, list):
                raise SourceFailed("Confluence answered a user lookup that is not JSON of results.")
            self._statuses.update(dict.fromkeys(batch, ""))
            for user in results:
                if isinstance(user, dict) and user.get("accountId") in batch:
                    status = user.get("accountStatus")
                    self._statuses[str(user["accountId"])] = (
                        status if isinstance(status, str) else ""
                    )

    # ------------------------------------------------------------ calls

    def _call(self, call: Callable[[], Any], *, missing: bool = False, hidden: bool = False) -> Any:
        """``call()``, waiting out 429s, 5xx and dropped connections within the budget.

        ``missing``: a 404 is ``None`` (a page deleted since it was listed), not a failure.
        ``hidden``: a 403 is what Confluence will not show this account (:class:`_Unreadable`).

        Raises:
            SourceCredentialsRejected: 401 or 403.
            SourceFailed: the budget is spent, or any other error.
        """
        budget = RetryBudget("Confluence", self.budget_seconds, self.sleep)
        try:
            return budget.run(call, _transient)
        except (requests.HTTPError, ApiError) as exc:
            status = _status(exc)
            if status == 404 and missing:
                return None
            if status == 403 and hidden:
                raise _Unreadable("Confluence will not show them to this account") from None
            if status in (401, 403):
                raise SourceCredentialsRejected(
                    f"Confluence refused the credentials (HTTP {status}): the token expired, "
                    "was revoked, or cannot read this space. Make a new one and set it."
                ) from None
            raise SourceFailed(f"Confluence answered HTTP {status}.") from None


class _Malformed(Exception):
    """A page Confluence gave in a shape it should not have."""


class _Unreadable(Exception):
    """Permissions that could not be read: the page is unknown."""


def _transient(exc: Exception) -> Retry | None:
    """A 429 (its ``Retry-After``), a 5xx or a dropped connection: worth asking again."""
    if isinstance(exc, (requests.HTTPError, ApiError)):
        status = _status(exc)
        if status == 429:
            response = _response_of(exc)
            asked = response.headers.get("Retry-After") if response is not None else None
            return Retry(f"HTTP {status}", retry_after(asked))
        return Retry(f"HTTP {status}") if status >= 500 else None
    if isinstance(exc, (requests.ConnectionError, requests.Timeout)):
        return Retry("unreachable")
    return None


def _status(exc: Exception) -> int:
    """The HTTP status of the answer ``exc`` is about (0: none)."""
    response = _response_of(exc)
    return response.status_code if response is not None else 0


def _response_of(exc: Exception) -> requests.Response | None:
    if isinstance(exc, requests.HTTPError):
        return exc.response
    reason = getattr(exc, "reason", None)
    return reason.response if isinstance(reason, requests.HTTPError) else None


def _emails(rows: object) -> Iterator[str]:
    for row in rows if isinstance(rows, list) else []:
        email = row.get("email") if isinstance(row, dict) else None
        if isinstance(email, str) and "@" in email:
            yield email.strip().lower()


def _names(rows: object) -> Iterator[str]:
    for row in rows if isinstance(rows, list) else []:
        name = row.get("name") if isinstance(row, dict) else None
        if isinstance(name, str) and name:
            yield name


def _body_html(body: dict[str, Any]) -> str | None:
    for form in ("export_view", "storage"):
        value = (body.get(form) or {}).get("value")
        if isinstance(value, str) and value.strip():
            return value
    return None


def _is_content_id(value: object) -> bool:
    """Whether ``value`` may be a page's id (Confluence writes digits): letters, digits, ``-``
    and ``_``, never a path (no ``/``, no ``.``)."""
    return isinstance(value, str | int) and bool(re.fullmatch(r"[A-Za-z0-9_-]+", str(value)))


def _is_attachment(item: str) -> bool:
    return item.startswith(ATTACHMENT_PREFIX)


def _attachment_item(row: dict[str, Any]) -> str:
    """The attachment's item: its id, ``att`` first as Confluence writes it."""
    raw = str(row["id"])
    return raw if _is_attachment(raw) else ATTACHMENT_PREFIX + raw


def _type(row: dict[str, Any]) -> str:
    """The attachment's media type (``extensions.mediaType``, else ``metadata.mediaType``)."""
    for holder in ("extensions", "metadata"):
        value = _part(row, holder).get("mediaType")
        if isinstance(value, str) and value:
            return value.split(";")[0].strip().lower()
    return "application/octet-stream"


def _read_attachment(row: object) -> bool:
    """Whether the extractor reads this listed attachment (by its name's suffix, else its
    media type).

    Raises:
        SourceFailed: it is not JSON of an attachment.
    """
    if not isinstance(row, dict) or not isinstance(row.get("id"), str | int):
        raise SourceFailed("Confluence listed an attachment that is not JSON of one.")
    title = row.get("title")
    return isinstance(title, str) and bool(readable_suffix(title, _type(row)))


def _shaped(answer: dict[str, Any], name: str, content_id: str) -> dict[str, Any]:
    """``answer[name]``, an object (absent: empty); of another type, the restrictions are unread."""
    value = answer.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Unreadable(f"the restrictions of {content_id} have {name} of another shape")
    return value


def _results(part: dict[str, Any], content_id: str) -> list[Any]:
    """``part["results"]``, a list (absent: empty); of another type, the restrictions are unread."""
    rows = part.get("results")
    if rows is None:
        return []
    if not isinstance(rows, list):
        raise _Unreadable(f"the restrictions of {content_id} list no results")
    return rows


def _part(row: dict[str, Any], name: str) -> dict[str, Any]:
    """``row[name]`` when it is an object, else empty (an answer in a shape it should not have)."""
    value = row.get(name)
    return value if isinstance(value, dict) else {}


def _site_path(value: object) -> str | None:
    """``value`` when it is a path on the site (``/...``), never another host (``//...``)."""
    if isinstance(value, str) and value.startswith("/") and not value.startswith("//"):
        return value
    return None
