"""The web server: viewer links, original files, static assets, health and error pages."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from bot.server.routes import MIDDLEWARES, add_readiness_check, set_max_behind
from core.errors import BadLinkToken
from core.links import LinkSigner, load_or_create_secret
from index.errors import KBError
from index.records import DocumentRow
from tests.docs_factory import text_pdf

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.clocks import FakeTime  # noqa: E402
from tests.conftest_bot import Bot, BotFactory  # noqa: E402

FORBIDDEN = Path(__file__).resolve().parent.parent / "bot" / "server" / "static" / "forbidden.html"


def _doc(bot: Bot, name: str) -> DocumentRow:
    return bot.kb.store.find_document(name)


def _token(bot: Bot, doc_id: int) -> str:
    return bot.services.engine.signer.token(doc_id, "*")


async def _forbidden_body(bot: Bot, path: str) -> str:
    resp = await bot.http.get(path)
    assert resp.status == 403
    assert resp.headers["Cache-Control"] == "private, no-store"
    return await resp.text()


async def test_valid_link_shows_the_escaped_canonical_text(bot: Bot) -> None:
    doc = _doc(bot, "oncall.md")
    token = _token(bot, doc.id)
    resp = await bot.http.get(f"/d/{doc.id}", params={"t": token})
    assert resp.status == 200
    page = await resp.text()
    assert "write &lt;!channel&gt; and &lt;@U123&gt; in #incidents" in page
    assert "<!channel>" not in page.split("-->", 1)[1]
    assert "<title>On-call guide</title>" in page
    assert f'href="{doc.id}/file?t={token}"' in page, "relative to /d/<id>"
    text = bot.kb.canonical_text(doc.id)
    assert f'<div id="doc" class="document formatted markdown" data-length="{len(text)}">' in page
    assert page.count("&amp;") >= text.count("&")

    headers = resp.headers
    assert headers["Cache-Control"] == "private, no-store"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"
    csp = headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp


async def test_viewer_assets_are_served_and_nothing_else(bot: Bot) -> None:
    js = await bot.http.get("/static/viewer.js")
    assert js.status == 200 and "javascript" in js.headers["Content-Type"]
    assert (await bot.http.get("/static/viewer.css")).status == 200
    assert (await bot.http.get("/static/viewer.html")).status == 404
    assert (await bot.http.get("/static/..%2Fapp.py")).status == 404


async def test_bad_links_all_get_the_same_forbidden_page(bot: Bot) -> None:
    doc = _doc(bot, "handbook.md")
    other = _doc(bot, "security.md")
    falcon = _doc(bot, "falcon.md")
    assert falcon.scope != "*"
    token = _token(bot, doc.id)
    tampered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    secret = load_or_create_secret(bot.settings.data_dir, bot.settings.engine_config().link_secret)
    expired = LinkSigner(secret, ttl_seconds=60, clock=lambda: 1_000_000.0).token(doc.id, "*")

    bodies = {
        "tampered": await _forbidden_body(bot, f"/d/{doc.id}?t={tampered}"),
        "expired": await _forbidden_body(bot, f"/d/{doc.id}?t={expired}"),
        "other document": await _forbidden_body(bot, f"/d/{other.id}?t={token}"),
        "no token": await _forbidden_body(bot, f"/d/{doc.id}"),
        "missing document": await _forbidden_body(bot, f"/d/999999?t={tampered}"),
        # a genuine signature, but for a wider scope than the document has
        "wrong scope": await _forbidden_body(
            bot, f"/d/{falcon.id}?t={bot.services.engine.signer.token(falcon.id, '*')}"
        ),
        "file, wrong scope": await _forbidden_body(
            bot, f"/d/{falcon.id}/file?t={bot.services.engine.signer.token(falcon.id, '*')}"
        ),
        "not an id": await _forbidden_body(bot, f"/d/abc?t={token}"),
        "file, tampered": await _forbidden_body(bot, f"/d/{doc.id}/file?t={tampered}"),
    }
    assert len(set(bodies.values())) == 1, "nothing distinguishes one refusal from another"
    # The static page itself: it names no document.
    assert next(iter(bodies.values())) == FORBIDDEN.read_text(encoding="utf-8")


async def test_forbidden_page_csp_allows_only_its_own_style(bot: Bot) -> None:
    resp = await bot.http.get("/d/1?t=nope")
    csp = resp.headers["Content-Security-Policy"]
    assert "style-src 'sha256-" in csp and "unsafe-inline" not in csp and "script-src" not in csp


async def test_link_to_a_removed_document_is_not_found(bot: Bot) -> None:
    doc = _doc(bot, "security.md")
    token = _token(bot, doc.id)
    bot.kb.remove(doc.id)
    resp = await bot.http.get(f"/d/{doc.id}", params={"t": token})
    assert resp.status == 404


async def test_original_pdf_is_served_inline_for_page_fragments(bot: Bot) -> None:
    pdf = text_pdf(["First page about parking.", "Second page about bicycles."])
    doc = bot.kb.ingest_bytes(pdf, "parking.pdf").document
    resp = await bot.http.get(f"/d/{doc.id}/file", params={"t": _token(bot, doc.id)})
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/pdf"
    assert resp.headers["Content-Disposition"].startswith("inline;")
    assert resp.headers["Cache-Control"] == "private, no-store"
    assert await resp.read() == pdf


async def test_original_text_file_is_plain_text_in_a_sandbox(bot: Bot) -> None:
    doc = bot.kb.ingest_bytes(
        b"<html><body><script>alert(1)</script><p>Hi there.</p></body></html>", "page.html"
    ).document
    resp = await bot.http.get(f"/d/{doc.id}/file", params={"t": _token(bot, doc.id)})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain")
    assert "sandbox" in resp.headers["Content-Security-Policy"]
    assert resp.headers["X-Content-Type-Options"] == "nosniff"


async def test_health_and_readiness(bot: Bot) -> None:
    health = await bot.http.get("/healthz")
    assert health.status == 200 and (await health.json())["status"] == "ok"
    ready = await bot.http.get("/readyz")
    body = await ready.json()
    assert ready.status == 200 and body["ready"] is True
    assert body["checks"] == {
        "knowledge_base": True,
        "index_current": True,
        "model_loaded": True,
        "store_model_followed": True,
    }
    assert body["store_model_refused"] is None
    assert body["slack"] == "http" and body["llm_configured"] is True
    assert body["documents"] == 4


async def test_a_snapshot_trailing_the_database_too_long_is_not_ready(make_bot: BotFactory) -> None:
    # Nothing follows the database during the test.
    bot = await make_bot(sync_seconds=3600, prepare=lambda app: set_max_behind(app, 1.0))
    fake = FakeTime(time.monotonic())  # how long the snapshot is behind: this test says
    bot.kb.indexes.clock = fake.clock
    bot.kb.indexes.refresh()
    bot.kb.store.delete_rows(bot.kb.find("oncall.md").id)  # committed, no refresh
    # One change behind is still a consistent snapshot: ready.
    body = await (await bot.http.get("/readyz")).json()
    assert body["ready"] is True and body["index"]["lag"] == 1
    fake.now += 1.1
    resp = await bot.http.get("/readyz")
    body = await resp.json()
    assert resp.status == 503 and body["checks"]["index_current"] is False
    assert body["index"]["behind_s"] > 1.0
    bot.kb.indexes.refresh()
    assert (await bot.http.get("/readyz")).status == 200


async def test_parts_register_their_own_readiness_checks(bot: Bot) -> None:
    async def down() -> bool:
        return False

    async def broken() -> bool:
        raise RuntimeError("probe exploded")

    add_readiness_check(bot.app, "queue_reachable", down)
    resp = await bot.http.get("/readyz")
    body = await resp.json()
    assert resp.status == 503 and body["checks"]["queue_reachable"] is False
    assert body["checks"]["index_current"] is True
    # A check that raises means "not ready", never a 500.
    add_readiness_check(bot.app, "queue_reachable", broken)
    resp = await bot.http.get("/readyz")
    assert resp.status == 503 and (await resp.json())["checks"]["queue_reachable"] is False


async def test_readiness_counts_what_the_last_sync_recorded(bot: Bot) -> None:
    body = await (await bot.http.get("/readyz")).json()
    assert body["chunks"] == len(bot.kb.snapshot) > 0
    assert body["index"]["snapshot_generation"] == body["index"]["generation"]


class _Conflict(KBError):
    """A test error that carries an HTTP status."""

    status = 409


async def test_errors_are_rendered_by_status_and_unexpected_ones_hidden() -> None:
    async def conflict(request: web.Request) -> web.Response:
        raise _Conflict("That name is taken; choose another one.")

    async def crash(request: web.Request) -> web.Response:
        raise RuntimeError("secret stack detail")

    async def bad_link(request: web.Request) -> web.Response:
        raise BadLinkToken("issued for document 7")

    app = web.Application(middlewares=MIDDLEWARES)
    app.router.add_get("/conflict", conflict)
    app.router.add_get("/crash", crash)
    app.router.add_get("/d/crash", crash)
    app.router.add_get("/d/link", bad_link)
    async with TestClient(TestServer(app)) as http:
        resp = await http.get("/conflict")
        assert resp.status == 409
        assert await resp.json() == {"error": "That name is taken; choose another one."}
        resp = await http.get("/crash")
        assert resp.status == 500 and "secret" not in await resp.text()
        resp = await http.get("/d/crash")
        assert resp.status == 500 and resp.content_type == "text/html"
        assert "secret" not in await resp.text()
        resp = await http.get("/d/link")
        assert resp.status == 403 and "document 7" not in await resp.text()


def test_access_log_never_contains_link_tokens(caplog: pytest.LogCaptureFixture) -> None:
    from aiohttp.test_utils import make_mocked_request

    from bot.server.routes import AccessLogger

    request = make_mocked_request("GET", "/d/7?t=secret-token-value")
    with caplog.at_level("INFO", logger="kb.access"):
        AccessLogger(logging.getLogger("kb.access"), "").log(
            request, web.Response(status=200), 0.002
        )
    assert "GET /d/7 200" in caplog.text
    assert "secret-token-value" not in caplog.text
