"""A local Notion API (``/v1``, version ``2025-09-03``), as its documentation describes it.

Pages shared with the integration (workspace pages, sub-pages, and the rows of
shared databases' data sources), their blocks, and the workspace's users.
What it follows of Notion's documented behaviour (developers.notion.com/reference):

* ``POST /v1/search`` with ``filter: {property: object, value: page | data_source}`` and
  ``sort: {timestamp: last_edited_time, direction}``; only what is shared with the
  integration, archived and trashed pages included (as Notion does, flagged);
* ``POST /v1/data_sources/{id}/query`` with a ``last_edited_time`` timestamp filter;
* ``GET /v1/blocks/{id}/children``, ``GET /v1/users``;
* pagination: ``start_cursor``/``page_size`` in, ``next_cursor``/``has_more`` out, the
  server capping ``page_size`` at :attr:`MockNotion.page_cap`; an unknown cursor is 400;
* authentication: ``Authorization: Bearer <secret>`` and a ``Notion-Version`` header; a
  wrong or revoked secret is 401 ``unauthorized``; a page not shared is 404
  ``object_not_found``; users without the user-information capability 403
  ``restricted_resource``;
* errors as ``{"object": "error", "status", "code", "message"}``; rate limiting is 429
  ``rate_limited`` with ``Retry-After`` (seconds), queued by the test, as are 5xx.

Every request is recorded (method, path, body or query) in :attr:`MockNotion.calls`.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.servers import DEFAULT_NOTION_TOKEN, threaded_http_server

VERSION = "2025-09-03"


def notion_id(n: int) -> str:
    """A stable Notion-shaped id (a UUID with dashes) for the test's number ``n``."""
    return str(uuid.UUID(int=n))


def text(content: str) -> list[dict[str, Any]]:
    """Rich text of one plain run."""
    return [
        {
            "type": "text",
            "text": {"content": content, "link": None},
            "annotations": {"bold": False, "italic": False, "code": False, "color": "default"},
            "plain_text": content,
            "href": None,
        }
    ]


def block(kind: str, content: str = "", children: list[Block] | None = None, **extra: Any) -> Block:
    """A block of ``kind`` whose rich text is ``content``."""
    body: dict[str, Any] = {"rich_text": text(content), "color": "default", **extra}
    return Block(kind, body, children or [])


@dataclass
class Block:
    """One block and its children."""

    kind: str
    body: dict[str, Any]
    children: list[Block] = field(default_factory=list)
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    extra: dict[str, Any] = field(default_factory=dict)  # more keys of the block object


@dataclass
class Page:
    """One page (a row of a data source when ``data_source`` is set)."""

    id: str
    title: str
    blocks: list[Block] = field(default_factory=list)
    edited: datetime = field(default_factory=lambda: datetime(2026, 12, 1, 9, 0, tzinfo=UTC))
    shared: bool = True
    archived: bool = False
    in_trash: bool = False
    parent: str | None = None  # a page id; None: the workspace
    data_source: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)  # a row's other properties
    url: str | None = None  # its url, when not the usual one
    garbage: bool = False  # served without properties
    in_search: bool = True  # Notion's search index has it (it lags behind new pages)


@dataclass
class DataSource:
    """One data source of a database, its rows being pages."""

    id: str
    title: str
    shared: bool = True


@dataclass
class Fault:
    """An answer queued for the next requests whose path contains ``path``."""

    path: str
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    times: int = 1


class MockNotion:
    """The server's state; :meth:`serve` runs it."""

    def __init__(self) -> None:
        self.pages: dict[str, Page] = {}
        self.sources: dict[str, DataSource] = {}
        self.users: list[dict[str, Any]] = []
        self.user_emails = True  # the integration may read users' emails
        self.token = DEFAULT_NOTION_TOKEN
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.page_cap = 2
        self.list_twice: str | None = None  # a page id the search lists twice
        self.endless: str | None = None  # a page whose blocks page on for ever (hostile)
        self.base = ""
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the test's side

    def page(self, page: Page) -> Page:
        """Add or replace ``page``."""
        self.pages[page.id] = page
        return page

    def person(self, name: str, email: str) -> None:
        """A member of the workspace."""
        self.users.append(
            {"object": "user", "id": str(uuid.uuid4()), "type": "person", "name": name,
             "avatar_url": None, "person": {"email": email}}
        )  # fmt: skip

    def fail(
        self, path: str, status: int, *, retry_after: str | None = None, times: int = 1
    ) -> None:
        """Answer the next ``times`` requests to ``path`` with ``status``."""
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        code = {429: "rate_limited", 500: "internal_server_error", 503: "service_unavailable"}
        body = _error(status, code.get(status, "internal_server_error"), "failure")
        self.faults.append(Fault(path, status, headers, body, times))

    def calls_to(self, fragment: str) -> list[tuple[str, str, dict[str, Any]]]:
        """The calls whose path holds ``fragment``."""
        return [c for c in self.calls if fragment in c[1]]

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on 127.0.0.1; yields the base URL the SDK is given (``http://127.0.0.1:port``)."""
        mock = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                mock._answer(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                mock._answer(self, "POST")

            def log_message(self, *args: Any) -> None:
                pass

        with threaded_http_server(Handler) as port:
            self.base = f"http://127.0.0.1:{port}"
            yield self.base

    # ------------------------------------------------------------ answers

    def _answer(self, request: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(request.path)
        length = int(request.headers.get("Content-Length") or 0)
        raw = request.rfile.read(length) if length else b""
        with self._lock:
            if method == "POST":
                try:
                    args = json.loads(raw or b"{}")
                except ValueError:
                    args = None
            else:
                args = {k: v[-1] for k, v in parse_qs(split.query).items()}
            self.calls.append((method, split.path, args if isinstance(args, dict) else {}))
            status, headers, body = self._route(request, method, split.path, args)
        request.send_response(status)
        request.send_header("Content-Type", headers.pop("Content-Type", "application/json"))
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    def _route(
        self, request: BaseHTTPRequestHandler, method: str, path: str, args: Any
    ) -> tuple[int, dict[str, str], bytes]:
        header = request.headers.get("Authorization", "")
        if not self.token or header != f"Bearer {self.token}":
            return 401, {}, _error(401, "unauthorized", "API token is invalid.")
        if not request.headers.get("Notion-Version"):
            return 400, {}, _error(400, "missing_version", "Notion-Version header is required.")
        for fault in self.faults:
            if fault.path in path and fault.times > 0:
                fault.times -= 1
                return fault.status, dict(fault.headers), fault.body
        if not isinstance(args, dict):
            return 400, {}, _error(400, "invalid_json", "Error parsing JSON body.")
        parts = path.removeprefix("/v1/").split("/")
        if method == "POST" and parts == ["search"]:
            return self._search(args)
        if method == "POST" and parts[0] == "data_sources" and parts[2:] == ["query"]:
            return self._query(parts[1], args)
        if method == "GET" and parts[0] == "blocks" and parts[2:] == ["children"]:
            return self._children(parts[1], args)
        if method == "GET" and parts == ["users"]:
            return self._users(args)
        return 400, {}, _error(400, "invalid_request_url", "Invalid request URL.")

    def _visible(self, page: Page) -> bool:
        source = self.sources.get(page.data_source or "")
        return page.shared or (source is not None and source.shared)

    def _search(self, args: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        kind = (args.get("filter") or {}).get("value")
        if kind == "data_source":
            found: list[Any] = [s for s in self.sources.values() if s.shared]
            return self._paged(found, args, self._source_object, "page_or_data_source")
        pages = [p for p in self.pages.values() if self._visible(p) and p.in_search]
        sort = args.get("sort") or {}
        pages.sort(key=lambda p: p.edited, reverse=sort.get("direction") == "descending")
        if self.list_twice in self.pages:
            pages.append(self.pages[self.list_twice])
        return self._paged(pages, args, self._page_object, "page_or_data_source")

    def _query(self, source_id: str, args: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        source = self.sources.get(source_id)
        if source is None or not source.shared:
            return 404, {}, _not_found(source_id)
        rows = [p for p in self.pages.values() if p.data_source == source_id and not p.in_trash]
        since = ((args.get("filter") or {}).get("last_edited_time") or {}).get("on_or_after")
        if since:
            when = datetime.fromisoformat(since.replace("Z", "+00:00"))
            rows = [p for p in rows if p.edited >= when]
        rows.sort(key=lambda p: p.edited, reverse=True)
        return self._paged(rows, args, self._page_object, "page_or_data_source")

    def _children(self, block_id: str, args: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        if block_id == self.endless:
            # Hostile: more blocks and a fresh cursor on every page, for ever.
            answer = {
                "object": "list",
                "results": [
                    _block_object(block("paragraph", "More.")) for _ in range(self.page_cap)
                ],
                "next_cursor": str(uuid.uuid4()),
                "has_more": True,
                "type": "block",
                "block": {},
            }
            return 200, {}, json.dumps(answer).encode()
        page = self.pages.get(block_id)
        if page is not None:
            if not self._visible(page):
                return 404, {}, _not_found(block_id)
            return self._paged(page.blocks, args, _block_object, "block")
        for found in self._all_blocks():
            if found.id == block_id:
                return self._paged(found.children, args, _block_object, "block")
        return 404, {}, _not_found(block_id)

    def _all_blocks(self) -> Iterator[Block]:
        seen: set[str] = set()

        def walk(blocks: list[Block]) -> Iterator[Block]:
            for b in blocks:
                if b.id in seen:
                    continue  # a block that is its own ancestor (hostile): walked once
                seen.add(b.id)
                yield b
                yield from walk(b.children)

        for page in self.pages.values():
            if self._visible(page):
                yield from walk(page.blocks)

    def _users(self, args: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        if not self.user_emails:
            message = "Insufficient permissions for this endpoint."
            return 403, {}, _error(403, "restricted_resource", message)
        bot = {"object": "user", "id": str(uuid.uuid4()), "type": "bot", "bot": {}, "name": "KB"}
        return self._paged([*self.users, bot], args, lambda u: u, "user")

    def _paged(
        self, items: list[Any], args: dict[str, Any], shape: Any, kind: str
    ) -> tuple[int, dict[str, str], bytes]:
        cursor = args.get("start_cursor")
        start = 0
        if cursor:
            try:
                start = int(base64.urlsafe_b64decode(str(cursor)).decode().removeprefix("at:"))
            except ValueError:
                return 400, {}, _error(400, "validation_error", "start_cursor is not valid.")
        size = min(int(args.get("page_size") or 100), self.page_cap)
        chunk = items[start : start + size]
        more = start + size < len(items)
        following = base64.urlsafe_b64encode(f"at:{start + size}".encode()).decode()
        answer = {
            "object": "list",
            "results": [shape(i) for i in chunk],
            "next_cursor": following if more else None,
            "has_more": more,
            "type": kind,
            kind: {},
            "request_id": str(uuid.uuid4()),
        }
        return 200, {}, json.dumps(answer).encode()

    def _page_object(self, page: Page) -> dict[str, Any]:
        parent: dict[str, Any] = {"type": "workspace", "workspace": True}
        if page.data_source:
            parent = {"type": "data_source_id", "data_source_id": page.data_source}
        elif page.parent:
            parent = {"type": "page_id", "page_id": page.parent}
        found: dict[str, Any] = {
            "object": "page",
            "id": page.id,
            "created_time": "2026-11-01T08:00:00.000Z",
            "last_edited_time": _stamp(page.edited),
            "archived": page.archived,
            "in_trash": page.in_trash,
            "parent": parent,
            "url": page.url or f"https://www.notion.so/{page.id.replace('-', '')}",
            "public_url": None,
        }
        if not page.garbage:
            title = {"id": "title", "type": "title", "title": text(page.title)}
            found["properties"] = {"Name": title, **page.properties}
        return found

    def _source_object(self, source: DataSource) -> dict[str, Any]:
        return {
            "object": "data_source",
            "id": source.id,
            "title": text(source.title),
            "parent": {"type": "database_id", "database_id": notion_id(0xDB)},
            "properties": {},
        }


def _block_object(b: Block) -> dict[str, Any]:
    return {
        "object": "block",
        "id": b.id,
        "type": b.kind,
        "created_time": "2026-11-01T08:00:00.000Z",
        "last_edited_time": "2026-11-01T08:00:00.000Z",
        "has_children": bool(b.children),
        "archived": False,
        "in_trash": False,
        b.kind: b.body,
        **b.extra,
    }


def _stamp(when: datetime) -> str:
    # Rounded to the minute, as Notion does; isoformat writes every year in four digits.
    minute = when.astimezone(UTC).replace(second=0, microsecond=0, tzinfo=None)
    return minute.isoformat(timespec="milliseconds") + "Z"


def _error(status: int, code: str, message: str) -> bytes:
    return json.dumps(
        {"object": "error", "status": status, "code": code, "message": message,
         "request_id": str(uuid.uuid4())}
    ).encode()  # fmt: skip


def _not_found(object_id: str) -> bytes:
    message = (
        f"Could not find block with ID: {object_id}. Make sure the relevant pages and "
        "databases are shared with your integration."
    )
    return _error(404, "object_not_found", message)
