"""Web routes: the document viewer behind citation links, the original files, health checks.

``GET /d/{id}?t=<token>`` shows a document's canonical text, formatted by
``bot.server.render`` (the page's script highlights the ``#char=a,b`` range);
``GET /d/{id}/text?t=<token>`` serves that text as it is, as text/plain, and
``GET /d/{id}/file?t=<token>`` the original (PDFs inline, so ``#page=N``
works). A token that is tampered with, expired or issued for another document
gets the same static 403 page whether or not the document exists, so links
cannot be used to enumerate documents.

When sign-in is required (a ``bot.server.readers.ReaderGate`` is registered), a
link alone opens nothing: a browser without a session is sent to sign in first,
whatever the link, and a signed-in person who may not read the link's scope gets
that same 403 page. The viewer then shows a Sign out button: a form posting the
session's token (``bot.server.readers``), the only way a reader is signed out.

Errors are rendered in one middleware: a ``KBError`` with a ``status``
attribute becomes a page (JSON outside ``/d/`` and ``/auth/``) with that status; anything
unexpected is logged and shown as a generic 500.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from bot.server import bodies
from bot.server.connections import REPORTED
from bot.server.readers import READER_GATE, SIGN_OUT_PATH, AccessCheckUnavailable, Reader
from bot.server.render import Formatter, Rendered, render_document
from core.answer import Engine
from core.errors import BadLinkToken
from index.errors import DocumentNotFound, KBError
from index.ingest import ocr_pages
from index.knowledge_base import KnowledgeBase
from index.records import DocumentRow
from index.sources import source_health
from index.sync import source_link

log = logging.getLogger(__name__)

__all__ = [
    "ENGINE",
    "FORMATTER",
    "KB",
    "MIDDLEWARES",
    "AccessLogger",
    "add_readiness_check",
    "add_readiness_info",
    "set_max_behind",
    "setup",
    "sign_out_form",
    "simple_page",
]

KB = web.AppKey("kb", KnowledgeBase)
ENGINE = web.AppKey("engine", Engine)
# Formats the viewer's pages on a thread of its own (``bot.server.render.Formatter``).
FORMATTER = web.AppKey("formatter", Formatter)
STARTED = web.AppKey("started", float)
ReadinessCheck = Callable[[], Awaitable[bool]]
READINESS_CHECKS: web.AppKey[dict[str, ReadinessCheck]] = web.AppKey("readiness_checks")
READINESS_INFO: web.AppKey[dict[str, object]] = web.AppKey("readiness_info")
MAX_BEHIND = web.AppKey("max_behind_s", float)
# A snapshot trailing the database is still consistent and answers; past this
# long behind, whatever keeps it current is stuck or failing: not ready.
DEFAULT_MAX_BEHIND_SECONDS = 30.0

STATIC_DIR = Path(str(resources.files("bot.server") / "static"))
STATIC_ASSETS = {
    "viewer.css": "text/css",
    "viewer.js": "text/javascript",
    "signin.js": "text/javascript",
}

# The viewer's script and style are files on this server: nothing inline may run. Its one
# form (Sign out) posts to this server.
VIEWER_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# An original shown as text must never run anything, even if it is HTML.
TEXT_FILE_CSP = "default-src 'none'; sandbox; frame-ancestors 'none'"
PRIVATE_HEADERS = {"Cache-Control": "private, no-store"}
PAGE_NOT_FOUND = "This document is no longer in the knowledge base."
PAGE_ERROR = "Something went wrong on the server. Please try again later."

_FILE_TYPES = {
    "pdf": "application/pdf",
    "md": "text/plain; charset=utf-8",
    "txt": "text/plain; charset=utf-8",
    # Shown as source: an uploaded page must not run in this origin.
    "html": "text/plain; charset=utf-8",
}
_STYLE_RE = re.compile(r"<style>(.*?)</style>", re.DOTALL)


# ---------------------------------------------------------------- templates


def _template(name: str) -> str:
    return (STATIC_DIR / name).read_text(encoding="utf-8")


def _forbidden_csp(page: str) -> str:
    """A CSP allowing exactly the forbidden page's inline style, by hash."""
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(m.group(1).encode()).digest()).decode() + "'"
        for m in _STYLE_RE.finditer(page)
    ]
    styles = " ".join(hashes) or "'none'"
    return f"default-src 'none'; style-src {styles}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"


VIEWER_TEMPLATE = _template("viewer.html")
FORBIDDEN_PAGE = _template("forbidden.html")
FORBIDDEN_CSP = _forbidden_csp(FORBIDDEN_PAGE)


def fill_viewer(
    *,
    title: str,
    meta: str,
    file_url: str,
    text: str,
    kind: str = "txt",
    text_url: str = "",
    ocr_pages: Sequence[int] = (),
    sign_out_token: str = "",
    rendered: Rendered | None = None,
    source_url: str | None = None,
) -> str:
    """The viewer page for one document; every value is escaped here.

    Args:
        title: the document's title.
        meta: one line about it (name, when indexed).
        file_url: the link to the original file.
        text: the canonical text, rendered for ``kind`` (``bot.server.render``).
        kind: the document's detected type (``md``, ``html``, ``pdf``, ...).
        text_url: the link to the canonical text as text/plain.
        ocr_pages: the pages OCR read (``index.ingest.ocr.ocr_pages``), which the page names.
        sign_out_token: the reader's session's form token; the page then has a
            Sign out button (none without it: no session to end).
        rendered: ``text`` already rendered (``Formatter.render``); rendered here if not.
        source_url: where the document is opened at its source (a Slack canvas's
            permalink, ``index.sync.source_link``); no such button without it.
    """
    rendered = rendered or render_document(text, kind)
    values = {
        "title": html.escape(title, quote=True),
        "meta": html.escape(meta, quote=True),
        "file_url": html.escape(file_url, quote=True),
        "text_url": html.escape(text_url, quote=True),
        "doc_class": f"formatted {rendered.layout}" if rendered.formatted else "plain",
        "length": str(rendered.length),
        "body": rendered.html,
        "ocr_pages": ",".join(str(int(n)) for n in ocr_pages),
        # From /d/<id>, like the assets: a path prefix keeps working.
        "signout": sign_out_form(".." + SIGN_OUT_PATH, sign_out_token) if sign_out_token else "",
        "source": _source_button(source_url),
    }
    # One pass, so a value that happens to contain "{{body}}" is never substituted again.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], VIEWER_TEMPLATE)


def _ocr_pages(doc: DocumentRow, text: str) -> list[int]:
    # Only a PDF has pages OCR read; any other document's marker lines are its own words.
    if doc.kind != "pdf" or not doc.page_starts:
        return []
    return ocr_pages(text, [int(s) for s in doc.page_starts.split(",")])


def sign_out_form(action: str, token: str) -> str:
    """The Sign out button: a form posting the session's ``token`` to ``action`` (both escaped)."""
    return (
        f'<form class="signout" id="signout" method="post" action="{html.escape(action)}">'
        f'<input type="hidden" name="token" value="{html.escape(token)}">'
        '<button class="button" type="submit">Sign out</button></form>'
    )


def simple_page(status: int, message: str) -> web.Response:
    """A minimal page that says one thing (not found, signed out, ...); ``message`` is escaped."""
    body = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="referrer" content="no-referrer"><title>Knowledge base</title></head>'
        f"<body><main><h1>{html.escape(message)}</h1></main></body></html>"
    )
    return web.Response(
        status=status,
        text=body,
        content_type="text/html",
        headers={"Content-Security-Policy": "default-src 'none'", **PRIVATE_HEADERS},
    )


def forbidden() -> web.Response:
    """The static 403 page: names no document and says nothing about whether one exists."""
    return web.Response(
        status=403,
        text=FORBIDDEN_PAGE,
        content_type="text/html",
        headers={"Content-Security-Policy": FORBIDDEN_CSP, **PRIVATE_HEADERS},
    )


# ---------------------------------------------------------------- middleware

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _NotAReader(Exception):
    """The signed-in person may not read the scope a valid link names."""


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render ``KBError``s with a ``status`` and hide everything unexpected behind a 500."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except (BadLinkToken, _NotAReader) as exc:
        # The reason (expired, tampered, other document, not a member) is for the log only.
        log.info("refused a document link: %s", exc)
        return forbidden()
    except AccessCheckUnavailable as exc:
        # Not a failure of this server: the person may try again shortly.
        log.warning("request %s: %s", request.path, exc.__cause__ or exc)
        return _error_response(request, 503, str(exc))
    except KBError as exc:
        status = getattr(exc, "status", None)
        if not isinstance(status, int) or status >= 500:
            log.exception("request %s failed", request.path)
            return _error_response(request, 500, PAGE_ERROR)
        return _error_response(request, status, str(exc))
    except Exception:
        log.exception("request %s failed", request.path)
        return _error_response(request, 500, PAGE_ERROR)


def _error_response(request: web.Request, status: int, message: str) -> web.Response:
    # Pages where a browser is what asks; JSON for health checks and tools.
    if request.path.startswith(("/d/", "/auth/")):
        return simple_page(status, message)
    return web.json_response({"error": message}, status=status)


# The bodies' door inside: it answers clients' faults itself, before anything here sees them.
MIDDLEWARES = [error_middleware, bodies.middleware]


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    # On every response, errors included: links carry tokens and pages show untrusted text.
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    if request.path.startswith(("/d/", "/auth/")):
        response.headers.setdefault("Cache-Control", "private, no-store")


# ---------------------------------------------------------------- access log


class AccessLogger(AbstractAccessLogger):
    """One line per request, without the query string: citation links carry access tokens.

    A client's fault the server already logged (a body too slow or too large, a
    malformed request, a client gone: ``bot.server.faults``) has that line only,
    counted once they repeat, so an attacker cannot fill the log a line a request.
    """

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        """Log method, path, status, size and duration."""
        if request.get(REPORTED):
            return
        self.logger.info(
            "%s %s %s %s bytes %.1f ms",
            request.method,
            request.path,
            response.status,
            response.body_length,
            time * 1000,
        )

    @property
    def enabled(self) -> bool:
        """Only when INFO is logged at all."""
        return self.logger.isEnabledFor(logging.INFO)


# ---------------------------------------------------------------- documents


_DOCUMENT_ID = re.compile(r"[0-9]{1,18}")


def _document_id(request: web.Request) -> int:
    raw = request.match_info["id"]
    # ASCII digits only: str.isdigit() and int() also take "١٢" and "²", the latter a ValueError.
    if not _DOCUMENT_ID.fullmatch(raw):
        # Same answer as a bad token: a malformed id reveals nothing either.
        raise BadLinkToken(f"Malformed document id {raw[:40]!r}.")
    return int(raw)


def _verify(request: web.Request) -> tuple[int, str, str]:
    doc_id = _document_id(request)
    token = request.query.get("t", "")
    scope = request.app[ENGINE].signer.verify(token, doc_id)
    log.debug("document %s opened with a link for scope %s", doc_id, scope)
    return doc_id, token, scope


async def _linked_document(request: web.Request) -> tuple[DocumentRow, str]:
    """The document a valid link names, and the link's token.

    Raises:
        BadLinkToken: the token is invalid, or was signed for another scope
            than the document now has (a link never widens who sees what).
        DocumentNotFound: the document is gone.
        HTTPFound: sign-in is required and the browser has no session.
        _NotAReader: the signed-in person may not read the link's scope.
    """
    # The session first: without one, nothing about the link is looked at.
    reader = _signed_in_reader(request)
    doc_id, token, scope = _verify(request)
    if reader is not None and not await request.app[READER_GATE].may_read(reader, scope):
        raise _NotAReader(f"{reader.user_id} may not read scope {scope!r} (document {doc_id}).")
    doc = await asyncio.to_thread(request.app[KB].store.document, doc_id)
    if doc.scope != scope:
        raise BadLinkToken(f"Link for scope {scope!r}, document {doc_id} is in another scope.")
    return doc, token


def _signed_in_reader(request: web.Request) -> Reader | None:
    """The signed-in reader when sign-in is required; ``None`` when links alone suffice."""
    gate = request.app.get(READER_GATE)
    if gate is None:
        return None
    reader = gate.sessions.reader(request)
    if reader is None:
        raise web.HTTPFound(gate.login_url(request.path_qs))
    return reader


def _sign_out_token(request: web.Request) -> str:
    """The form token of the reader's session when sign-in is required; ``""`` otherwise."""
    gate = request.app.get(READER_GATE)
    return (gate.sessions.form_token(request) or "") if gate is not None else ""


def _source_button(url: str | None) -> str:
    if not url:
        return ""
    href = html.escape(url, quote=True)
    return f'<a class="button" id="source" href="{href}" rel="noopener noreferrer">Open at its source</a>'


def _meta(doc: DocumentRow) -> str:
    parts = [doc.name]
    if doc.indexed_at:
        day = datetime.fromtimestamp(doc.indexed_at, tz=UTC).strftime("%Y-%m-%d")
        parts.append(f"indexed {day}")
    return " - ".join(parts)


async def viewer(request: web.Request) -> web.Response:
    """``GET /d/{id}?t=...``: the canonical text of a document, for the ``#char`` highlight."""
    kb = request.app[KB]
    try:
        doc, token = await _linked_document(request)
        text = await asyncio.to_thread(kb.canonical_text, doc.id)
    except DocumentNotFound:
        return simple_page(404, PAGE_NOT_FOUND)
    source = await asyncio.to_thread(source_link, kb, doc)
    # Formatting, and the page around it, on the formatter's own thread: never the
    # default executor that health checks, searches and answers wait for.
    formatter = request.app[FORMATTER]
    rendered = await formatter.render(text, doc.kind)
    page = await formatter.run(
        _viewer_page, doc, text, token, rendered, _sign_out_token(request), source
    )
    return web.Response(
        body=page,
        content_type="text/html",
        charset="utf-8",
        headers={"Content-Security-Policy": VIEWER_CSP, **PRIVATE_HEADERS},
    )


def _viewer_page(
    doc: DocumentRow,
    text: str,
    token: str,
    rendered: Rendered,
    sign_out_token: str,
    source: str | None = None,
) -> bytes:
    # Relative (from /d/<id>), like the page's assets, so a path prefix keeps working.
    query = f"?t={quote(token, safe='')}"
    return fill_viewer(
        title=doc.title or doc.name,
        meta=_meta(doc),
        file_url=f"{doc.id}/file{query}",
        text=text,
        kind=doc.kind,
        text_url=f"{doc.id}/text{query}",
        ocr_pages=_ocr_pages(doc, text),
        sign_out_token=sign_out_token,
        rendered=rendered,
        source_url=source,
    ).encode("utf-8")


async def canonical_text(request: web.Request) -> web.Response:
    """``GET /d/{id}/text?t=...``: the canonical text exactly as stored, as text/plain.

    It is the text every ``#char=a,b`` counts in, so a citation can be checked
    against it; served like an original shown as text (sandboxed, never run).
    """
    kb = request.app[KB]
    try:
        doc, _ = await _linked_document(request)
        text = await asyncio.to_thread(kb.canonical_text, doc.id)
    except DocumentNotFound:
        return simple_page(404, PAGE_NOT_FOUND)
    name = f"{Path(doc.name).stem or 'document'}.txt"
    headers = {
        "Content-Disposition": f"inline; filename*=UTF-8''{quote(name, safe='')}",
        "Content-Security-Policy": TEXT_FILE_CSP,
        **PRIVATE_HEADERS,
    }
    return web.Response(
        body=text.encode("utf-8"), content_type="text/plain", charset="utf-8", headers=headers
    )


async def original_file(request: web.Request) -> web.StreamResponse:
    """``GET /d/{id}/file?t=...``: the original upload; a PDF inline so ``#page=N`` works."""
    kb = request.app[KB]
    try:
        doc, _ = await _linked_document(request)
    except DocumentNotFound:
        return simple_page(404, PAGE_NOT_FOUND)
    # On Postgres the original is a row: this replica keeps a file of it to serve.
    path = await asyncio.to_thread(kb.original_file, doc.sha256)
    if path is None:
        return simple_page(404, PAGE_NOT_FOUND)
    content_type = _FILE_TYPES.get(doc.kind, "application/octet-stream")
    disposition = "attachment" if content_type == "application/octet-stream" else "inline"
    headers = {
        "Content-Type": content_type,
        "Content-Disposition": f"{disposition}; filename*=UTF-8''{quote(doc.name, safe='')}",
        **PRIVATE_HEADERS,
    }
    if content_type != "application/pdf":
        # Not on PDFs: browsers refuse to run their PDF viewer in a sandboxed document.
        headers["Content-Security-Policy"] = TEXT_FILE_CSP
    return web.FileResponse(path, headers=headers)


async def static_asset(request: web.Request) -> web.StreamResponse:
    """The viewer's own script and style (only those two files)."""
    name = request.match_info["name"]
    if name not in STATIC_ASSETS:
        raise web.HTTPNotFound()
    headers = {"Content-Type": STATIC_ASSETS[name], "Cache-Control": "public, max-age=3600"}
    return web.FileResponse(STATIC_DIR / name, headers=headers)


# ---------------------------------------------------------------- health


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers."""
    return web.json_response(
        {"status": "ok", "uptime_s": round(time.monotonic() - request.app[STARTED], 1)}
    )


def _readiness(kb: KnowledgeBase, max_behind: float) -> dict[str, Any]:
    # Cheap on purpose (probes come every few seconds): the state the last
    # sync recorded and counters, never a scan of the chunks (`kb status` does that).
    index = kb.search_index.health()
    behind = index["behind_s"]
    return {
        "checks": {
            "knowledge_base": True,
            # A snapshot one change behind answers consistently; only one that
            # is missing or has trailed the database too long is a problem.
            "index_current": isinstance(behind, float) and behind <= max_behind,
            "model_loaded": kb.embedder.loaded,
            # The store's documents moved to a model this server cannot load: it refuses.
            "store_model_followed": kb.unfollowed is None,
        },
        "index": {
            **index,
            "refresh_error": _failed(index["refresh_error"]),
            "max_behind_s": max_behind,
        },
        # Replicas share the store: its generation beside the index's says how far behind
        # this one is, and the same store generation on every replica that they share one.
        "store": {**_store_facts(kb), "reachable": True, "generation": index["generation"]},
        "engine": kb.config.search_engine,
        "embedding_model": kb.embedder.name,
        # Still ready: a knowledge base built on the earlier default answers on it until
        # `kb reindex`; the note says so (index.kept_model).
        "kept_model": kb.kept_model.to_dict() if kb.kept_model else None,
        # Why every question is refused, while it is (core.switch).
        "store_model_refused": kb.unfollowed,
        # Counted once per store generation; its advice says when the model is the wrong one.
        "languages": kb.language_fit().to_dict(),
        "documents": kb.document_count(),
        # Each synced source: failing or not, and its last good sync (never a silent stall).
        "sources": _sources_health(kb),
        "chunks": index["chunks"],
        "reindex_running": kb.reindex_running(),
        # Answering still works; uploads and removals will not until there is room.
        "store_read_only": kb.read_only,
        "index_files_degraded": index["degraded"],
    }


def _failed(reason: object) -> str | None:
    """Whether the search index's last refresh failed, without why: the log says why (a
    database's host and user, a file's path), and ``/readyz`` is read by anyone."""
    return REFRESH_FAILED if reason else None


def _sources_health(kb: KnowledgeBase) -> list[dict[str, Any]]:
    """Each source's health without why it fails: anyone who reaches the server reads
    ``/readyz``, and a reason may name what it could not read (an attachment of a
    restricted page). ``kb status`` and the admins' Home tab say why."""
    return [{k: v for k, v in s.items() if k != "last_error"} for s in source_health(kb)]


# What /readyz says of a failure, to anyone; the reason is in the server's log.
UNREADABLE = "The knowledge base cannot be read now; the server's log says why."
REFRESH_FAILED = "The last refresh failed; the server's log says why."


def _store_facts(kb: KnowledgeBase) -> dict[str, object]:
    return {"kind": kb.database_kind}


def add_readiness_check(app: web.Application, name: str, check: ReadinessCheck) -> None:
    """Make ``/readyz`` answer 503 while ``check()`` is false (a part of the bot registers its own)."""
    app[READINESS_CHECKS][name] = check


def set_max_behind(app: web.Application, seconds: float) -> None:
    """How long the search snapshot may trail the database before ``/readyz`` answers 503."""
    app[MAX_BEHIND] = seconds


def add_readiness_info(app: web.Application, name: str, value: object) -> None:
    """Report ``value`` under ``name`` in ``/readyz`` (facts for operators, not checks)."""
    app[READINESS_INFO][name] = value


async def readyz(request: web.Request) -> web.Response:
    """Readiness: knowledge base open, a search snapshot no longer than the bound behind
    SQLite, model loaded, and every check the other parts registered (Slack's Socket
    Mode connection, for one)."""
    try:
        details = await asyncio.to_thread(_readiness, request.app[KB], request.app[MAX_BEHIND])
    except Exception as exc:  # not ready is an answer, not a crash
        log.warning("readiness check failed: %s", exc)
        kb = request.app[KB]
        store = {**_store_facts(kb), "reachable": False}
        return web.json_response(
            {
                "ready": False,
                "checks": {"knowledge_base": False},
                "store": store,
                "engine": kb.config.search_engine,
                # Anyone who reaches the server reads this: the reason (a database's host
                # and user, a file's path) goes to the log only.
                "error": UNREADABLE,
            },
            status=503,
        )
    for name, check in request.app[READINESS_CHECKS].items():
        details["checks"][name] = await _passes(name, check)
    details["ready"] = all(details["checks"].values())
    info: dict[str, object] = request.app[READINESS_INFO]
    details.update(info)
    details["llm_configured"] = request.app[ENGINE].llm.configured
    # Answers still work without it, their sources unlinked: degraded, not down.
    details["links_degraded"] = await asyncio.to_thread(request.app[ENGINE].signer.unavailable)
    return web.json_response(details, status=200 if details["ready"] else 503)


async def _passes(name: str, check: ReadinessCheck) -> bool:
    try:
        return bool(await check())
    except Exception as exc:  # a failing check means not ready, never a 500
        log.warning("readiness check %s failed: %s", name, exc)
        return False


def setup(app: web.Application) -> None:
    """Add the viewer, file, static and health routes to ``app``."""
    app[STARTED] = time.monotonic()
    app[READINESS_CHECKS] = {}
    app[READINESS_INFO] = {}
    app[MAX_BEHIND] = DEFAULT_MAX_BEHIND_SECONDS
    app[FORMATTER] = Formatter()
    app.on_cleanup.append(_close_formatter)
    app.on_response_prepare.append(_security_headers)
    app.router.add_get("/d/{id}", viewer)
    app.router.add_get("/d/{id}/file", original_file)
    app.router.add_get("/d/{id}/text", canonical_text)
    app.router.add_get("/static/{name}", static_asset)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


async def _close_formatter(app: web.Application) -> None:
    app[FORMATTER].close()
