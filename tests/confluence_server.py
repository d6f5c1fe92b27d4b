"""A local Confluence Cloud REST API v1 (``/wiki/rest/api``), as its documentation describes it.

Pages, their attachments (``/content/{id}/child/attachment``, each with
``version.number`` when expanded, ``extensions.mediaType`` and
``extensions.fileSize``, ``_links.download`` relative to the site, the bytes
at ``/wiki/download/attachments/{page}/{name}``; one the test names in
:attr:`MockConfluence.trickle` a byte at a time, each moving the test's clock
on), spaces with their read
permission, page read restrictions, groups and their members, and CQL search
over ``space``, ``type`` and ``lastmodified`` (``/rest/api/search``, pages; and
``/rest/api/content/search``, whose results are content as the content API
gives it: the attachments of the space's pages there now, each with its
``container`` when expanded; a deleted page's are in the trash with it).
What it follows of Confluence's documented behaviour:

* pagination: ``start`` and ``limit``, the server capping ``limit`` at
  :attr:`MockConfluence.page_cap` (Confluence caps it too and says what it
  used), and ``_links.next`` relative to ``_links.base`` while more results
  remain (developer.atlassian.com/cloud/confluence/rest/v1/intro/#pagination);
* authentication: basic auth with an account email and API token; anything
  else, or a token the test revoked (at once, or from a given request on), is HTTP 401;
* rate limiting: HTTP 429 with ``Retry-After`` (seconds), queued by the test;
  any other status (500s) the same way;
* an unknown page is HTTP 404 with ``statusCode`` and ``message``;
* the people user objects name (restrictions, space permissions, group
  members: ``accountId``, ``email`` unless hidden, no status, as Atlassian
  gives them in v1) looked up with the REST API v2's ``POST
  /wiki/api/v2/users-bulk`` (``{"accountIds": [...]}``): each found account with
  its ``accountStatus`` (``active``, ``inactive``: deactivated, ``closed``), an
  unknown one left out of ``results``, at most 100 ids a request
  (developer.atlassian.com/cloud/confluence/rest/v2/api-group-user).

Every request is recorded (method, path, query) in :attr:`MockConfluence.calls`.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from tests.clocks import Waits, send_answer
from tests.servers import DEFAULT_CONFLUENCE_TOKEN, threaded_http_server

# Marks an answer sent a byte at a time (``MockConfluence.trickle``); never sent itself.
_TRICKLE = "X-Mock-Trickle"

ACCOUNT = "bot@example.com"
SPACE = "ENG"


@dataclass
class Page:
    """One page."""

    id: str
    title: str
    body: str
    space: str = SPACE
    version: int = 1
    parent: str | None = None
    read_users: list[str] = field(default_factory=list)
    read_groups: list[str] = field(default_factory=list)
    modified: datetime = field(default_factory=lambda: datetime(2026, 12, 1, 9, 0, tzinfo=UTC))
    garbage: bool = False  # served without a title or a body
    webui: str | None = None  # its _links.webui, when not the usual path


@dataclass
class Attachment:
    """One file attached to a page (``id`` as Confluence writes it: ``att<number>``)."""

    id: str
    page: str
    title: str
    data: bytes
    media_type: str
    version: int = 1
    size: int | None = None  # the fileSize it states, when not len(data)


@dataclass
class Space:
    """One space's read permission."""

    key: str
    users: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    anonymous: bool = False


@dataclass
class Fault:
    """An answer queued for the next requests whose path contains ``path``."""

    path: str
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b'{"statusCode": 500, "message": "Internal server error"}'
    times: int = 1
    after: int = 0  # matching requests answered as usual before the fault starts


class MockConfluence:
    """The server's state; :meth:`serve` runs it."""

    def __init__(self) -> None:
        self.pages: dict[str, Page] = {}
        self.attachments: dict[str, Attachment] = {}
        self.download_host = ""  # put before each _links.download (another site's, say)
        # Attachments whose bytes are sent one at a time, each moving ``trickle_clock`` on by
        # ``trickle_seconds`` (hostile: a download that never quite stops).
        self.trickle: set[str] = set()
        self.trickle_clock: Waits | None = None
        self.trickle_seconds = 5.0
        self.spaces: dict[str, Space] = {SPACE: Space(SPACE, groups=["confluence-users"])}
        self.groups: dict[str, list[str]] = {"confluence-users": []}
        self.hidden_emails: set[str] = set()  # people whose profile hides their email
        # accountStatus by email (users-bulk): absent is "active"; "inactive" is deactivated.
        self.account_status: dict[str, str] = {}
        self._accounts: dict[str, str] = {}  # accountId -> email, as user objects named them
        self.bulk_asked: list[list[str]] = []  # the accountIds of each users-bulk request
        self.token = DEFAULT_CONFLUENCE_TOKEN
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self.page_cap = 2
        self.list_twice: str | None = None  # a page id the search lists twice
        # A path fragment: the first request to it revokes the token (it and all after get 401).
        self.revoke_at: str | None = None
        self.base = ""
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the test's side

    def page(self, page: Page) -> Page:
        """Add or replace ``page``."""
        self.pages[page.id] = page
        return page

    def attach(self, attachment: Attachment) -> Attachment:
        """Add or replace ``attachment``."""
        self.attachments[attachment.id] = attachment
        return attachment

    def fail(
        self, path: str, status: int, *, retry_after: str | None = None, times: int = 1
    ) -> None:
        """Answer the next ``times`` requests to ``path`` with ``status``."""
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        body = json.dumps({"statusCode": status, "message": "failure"}).encode()
        self.faults.append(Fault(path, status, headers, body, times))

    def calls_to(self, fragment: str) -> list[tuple[str, str, dict[str, str]]]:
        """The calls whose path holds ``fragment``."""
        return [c for c in self.calls if fragment in c[1]]

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on 127.0.0.1; yields the site URL (``http://127.0.0.1:port/wiki``)."""
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                mock._answer(self)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                mock._answer(self, "POST")

            def log_message(self, *args: Any) -> None:
                pass

        with threaded_http_server(Handler) as port:
            self.base = f"http://127.0.0.1:{port}/wiki"
            yield self.base

    # ------------------------------------------------------------ answers

    def _answer(self, request: BaseHTTPRequestHandler, method: str = "GET") -> None:
        split = urlsplit(request.path)
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(request.headers.get("Content-Length") or 0)
        sent = request.rfile.read(length) if length else b""
        with self._lock:
            self.calls.append((method, split.path, query))
            if method == "POST":
                status, headers, body = self._post(request, split.path, sent)
            else:
                status, headers, body = self._route(request, split.path, query)
        trickled = headers.pop(_TRICKLE, None) is not None
        send_answer(
            request,
            status,
            headers,
            body,
            trickled=trickled,
            clock=self.trickle_clock,
            step=self.trickle_seconds,
        )

    def _route(
        self, request: BaseHTTPRequestHandler, path: str, query: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        if self.revoke_at is not None and self.revoke_at in path:
            self.token = ""
        if not self._authorised(request.headers.get("Authorization", "")):
            return _json(401, {"statusCode": 401, "message": "Client must be authenticated"})
        if (faulted := self._fault(path)) is not None:
            return faulted
        if path.startswith("/wiki/download/attachments/"):
            return self._download(path.removeprefix("/wiki/download/attachments/"))
        parts = path.removeprefix("/wiki/rest/api/").split("/")
        if parts == ["search"]:
            return _json(200, self._search(query))
        if parts == ["content", "search"]:
            return self._content_search(query)
        if parts[0] == "content" and len(parts) == 2 and self._attached(parts[1]):
            return _json(200, self._attachment(self.attachments[parts[1]], query))
        if parts[0] == "content" and len(parts) == 2:
            return self._content(parts[1])
        if parts[0] == "content" and parts[2:] == ["child", "attachment"]:
            return self._attachments(parts[1], query)
        if parts[0] == "content" and parts[2:] == ["restriction", "byOperation"]:
            return self._restrictions(parts[1])
        if parts[0] == "space" and len(parts) == 2 and parts[1] in self.spaces:
            return _json(200, self._space(self.spaces[parts[1]]))
        if parts[0] == "group" and parts[2:] == ["member"]:
            return self._members(parts[1], query)
        return _json(404, {"statusCode": 404, "message": f"No resource at {path}"})

    def _fault(self, path: str) -> tuple[int, dict[str, str], bytes] | None:
        """The answer of the first fault queued for ``path`` whose turn has come, if any."""
        for fault in self.faults:
            if fault.path in path and fault.times > 0:
                if fault.after > 0:
                    fault.after -= 1
                    continue
                fault.times -= 1
                return fault.status, dict(fault.headers), fault.body
        return None

    def _post(
        self, request: BaseHTTPRequestHandler, path: str, sent: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        if not self._authorised(request.headers.get("Authorization", "")):
            return _json(401, {"statusCode": 401, "message": "Client must be authenticated"})
        if (faulted := self._fault(path)) is not None:
            return faulted
        if path != "/wiki/api/v2/users-bulk":
            return _json(404, {"statusCode": 404, "message": f"No resource at {path}"})
        try:
            ids = json.loads(sent)["accountIds"]
        except (ValueError, KeyError, TypeError):
            return _json(400, {"statusCode": 400, "message": "accountIds is required"})
        if not isinstance(ids, list) or not 1 <= len(ids) <= 100:
            return _json(400, {"statusCode": 400, "message": "1 to 100 accountIds"})
        self.bulk_asked.append([str(i) for i in ids])
        found = [self._accounts[i] for i in ids if i in self._accounts]
        return _json(200, {"results": [self._bulk_user(e) for e in found], "_links": {}})

    def _bulk_user(self, email: str) -> dict[str, Any]:
        name = email.split("@")[0]
        user: dict[str, Any] = {
            "accountId": f"acct-{name}",
            "accountType": "atlassian",
            "accountStatus": self.account_status.get(email, "active"),
            "displayName": name.title(),
            "publicName": name,
            "isExternalCollaborator": False,
        }
        if email not in self.hidden_emails:
            user["email"] = email
        return user

    def _authorised(self, header: str) -> bool:
        if not header.startswith("Basic "):
            return False
        try:
            user, _, token = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return False
        return user == ACCOUNT and token == self.token and bool(self.token)

    def _search(self, query: dict[str, str]) -> dict[str, Any]:
        cql = query.get("cql", "")
        found = [p for p in self.pages.values() if _matches(cql, p)]
        found.sort(key=lambda p: p.modified)
        if self.list_twice is not None and self.list_twice in self.pages:
            found.append(self.pages[self.list_twice])
        start = int(query.get("start", "0"))
        limit = min(int(query.get("limit", "25")), self.page_cap)
        chunk = found[start : start + limit]
        links: dict[str, str] = {"base": self.base, "context": "/wiki"}
        if start + limit < len(found):
            following = {**query, "start": str(start + limit), "limit": str(limit)}
            links["next"] = "/rest/api/search?" + urlencode(following)
        return {
            "results": [self._result(p) for p in chunk],
            "start": start,
            "limit": limit,
            "size": len(chunk),
            "totalSize": len(found),
            "cqlQuery": cql,
            "_links": links,
        }

    def _result(self, page: Page) -> dict[str, Any]:
        return {
            "content": {
                "id": page.id,
                "type": "page",
                "status": "current",
                "title": page.title,
                "version": {"number": page.version},
                "_links": {"webui": self._webui(page)},
            },
            "title": page.title,
            "lastModified": page.modified.isoformat().replace("+00:00", "Z"),
        }

    def _webui(self, page: Page) -> str:
        return page.webui or f"/spaces/{page.space}/pages/{page.id}"

    def _content(self, page_id: str) -> tuple[int, dict[str, str], bytes]:
        page = self.pages.get(page_id)
        if page is None:
            return _json(404, {"statusCode": 404, "message": f"No content found with id {page_id}"})
        if page.garbage:
            return _json(200, {"id": page.id, "type": "page", "space": {"key": page.space}})
        value = {"value": page.body, "representation": "export_view"}
        return _json(
            200,
            {
                "id": page.id,
                "type": "page",
                "status": "current",
                "title": page.title,
                "space": {"key": page.space},
                "version": {"number": page.version},
                "ancestors": [{"id": a.id, "title": a.title} for a in self._ancestors(page)],
                "body": {"export_view": value},
                "_links": {"webui": self._webui(page), "base": self.base},
            },
        )

    def _attachments(
        self, page_id: str, query: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        if page_id not in self.pages:
            return _json(404, {"statusCode": 404, "message": f"No content found with id {page_id}"})
        found = [a for a in self.attachments.values() if a.page == page_id]
        return self._attachment_page(found, query, f"/rest/api/content/{page_id}/child/attachment")

    def _content_search(self, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        cql = query.get("cql", "")
        clauses = dict(c.split(" = ", 1) for c in cql.split(" and "))
        if clauses.get("type") != "attachment" or "space" not in clauses:
            return _json(400, {"statusCode": 400, "message": f"This mock cannot search {cql}"})
        space = clauses["space"].strip('"')
        found = [
            a
            for a in self.attachments.values()
            if a.page in self.pages and self.pages[a.page].space == space
        ]
        return self._attachment_page(found, query, "/rest/api/content/search")

    def _attachment_page(
        self, found: list[Attachment], query: dict[str, str], path: str
    ) -> tuple[int, dict[str, str], bytes]:
        """One page of ``found`` from ``start``, ``_links.next`` at ``path`` while more remain."""
        start = int(query.get("start", "0"))
        limit = min(int(query.get("limit", "25")), self.page_cap)
        chunk = found[start : start + limit]
        links: dict[str, str] = {"base": self.base, "context": "/wiki"}
        if start + limit < len(found):
            following = urlencode({**query, "start": start + limit, "limit": limit})
            links["next"] = f"{path}?{following}"
        answer = {"start": start, "limit": limit, "size": len(chunk), "_links": links}
        return _json(200, {"results": [self._attachment(a, query) for a in chunk], **answer})

    def _attached(self, content_id: str) -> bool:
        """An attachment on a page there now (a deleted page's are in the trash with it)."""
        attachment = self.attachments.get(content_id)
        return attachment is not None and attachment.page in self.pages

    def _attachment(self, attachment: Attachment, query: dict[str, str]) -> dict[str, Any]:
        expand = query.get("expand", "").split(",")
        page = attachment.page
        preview = quote(f"/{page}/{attachment.id}/{attachment.title}", safe="")
        row: dict[str, Any] = {
            "id": attachment.id,
            "type": "attachment",
            "status": "current",
            "title": attachment.title,
            "metadata": {"mediaType": attachment.media_type, "comment": ""},
            "extensions": {
                "mediaType": attachment.media_type,
                "fileSize": len(attachment.data) if attachment.size is None else attachment.size,
                "comment": "",
            },
            "_links": {
                "webui": f"/pages/viewpageattachments.action?pageId={page}&preview={preview}",
                "download": (
                    f"{self.download_host}/download/attachments/{page}/{quote(attachment.title)}"
                    f"?version={attachment.version}&modificationDate=1764579600000&api=v2"
                ),
                "self": f"{self.base}/rest/api/content/{attachment.id}",
            },
        }
        if "version" in expand:
            row["version"] = {"number": attachment.version, "minorEdit": False}
        if "container" in expand and page in self.pages:
            row["container"] = {"id": page, "type": "page", "title": self.pages[page].title}
        return row

    def _download(self, rest: str) -> tuple[int, dict[str, str], bytes]:
        page, _, name = rest.partition("/")
        for attachment in self.attachments.values():
            if attachment.page == page and quote(attachment.title) == name and page in self.pages:
                headers = {"Content-Type": attachment.media_type}
                if attachment.id in self.trickle:
                    headers[_TRICKLE] = ""
                return 200, headers, attachment.data
        return _json(404, {"statusCode": 404, "message": "No attachment found"})

    def _ancestors(self, page: Page) -> list[Page]:
        found: list[Page] = []
        parent = self.pages.get(page.parent or "")
        while parent is not None and parent not in found:
            found.insert(0, parent)
            parent = self.pages.get(parent.parent or "")
        return found

    def _restrictions(self, page_id: str) -> tuple[int, dict[str, str], bytes]:
        page = self.pages.get(page_id)
        if page is None:
            return _json(404, {"statusCode": 404, "message": f"No content found with id {page_id}"})

        def operation(name: str, users: list[str], groups: list[str]) -> dict[str, Any]:
            return {
                "operation": name,
                "restrictions": {
                    "user": {"results": [self._user(u) for u in users], "size": len(users)},
                    "group": {
                        "results": [{"type": "group", "name": g} for g in groups],
                        "size": len(groups),
                    },
                },
            }

        return _json(
            200,
            {
                "read": operation("read", page.read_users, page.read_groups),
                "update": operation("update", [], []),
            },
        )

    def _user(self, email: str) -> dict[str, Any]:
        user: dict[str, Any] = {"type": "known", "accountId": f"acct-{email.split('@')[0]}"}
        self._accounts[user["accountId"]] = email
        if email not in self.hidden_emails:
            user["email"] = email
        return user

    def _space(self, space: Space) -> dict[str, Any]:
        return {
            "key": space.key,
            "name": space.key,
            "permissions": [
                {
                    "operation": {"operation": "read", "targetType": "space"},
                    "subjects": {
                        "user": {"results": [self._user(u) for u in space.users]},
                        "group": {"results": [{"type": "group", "name": g} for g in space.groups]},
                    },
                    "anonymousAccess": space.anonymous,
                    "unlicensedAccess": False,
                },
                {
                    "operation": {"operation": "create", "targetType": "page"},
                    "subjects": {"user": {"results": [self._user("everyone@example.com")]}},
                    "anonymousAccess": False,
                },
            ],
        }

    def _members(self, group: str, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if group not in self.groups:
            return _json(404, {"statusCode": 404, "message": f"No group {group}"})
        members = self.groups[group]
        start = int(query.get("start", "0"))
        limit = min(int(query.get("limit", "200")), self.page_cap)
        chunk = members[start : start + limit]
        links: dict[str, str] = {"base": self.base, "context": "/wiki"}
        if start + limit < len(members):
            following = urlencode({"start": start + limit, "limit": limit})
            links["next"] = f"/rest/api/group/{group}/member?{following}"
        answer = {"start": start, "limit": limit, "size": len(chunk), "_links": links}
        return _json(200, {"results": [self._user(m) for m in chunk], **answer})


def _matches(cql: str, page: Page) -> bool:
    """The CQL this mock understands: ``space = "K" and type = page [and lastmodified >= "d"]``."""
    clauses = [c.strip() for c in cql.split(" and ")]
    for clause in clauses:
        field_name, op, value = clause.split(" ", 2)
        value = value.strip('"')
        if field_name == "space" and page.space != value:
            return False
        if field_name == "type" and value != "page":
            return False
        if field_name == "lastmodified" and op == ">=":
            since = datetime.fromisoformat(value).replace(tzinfo=UTC)
            if page.modified < since:
                return False
    return True


def _json(status: int, data: Any) -> tuple[int, dict[str, str], bytes]:
    return status, {}, json.dumps(data).encode()
