"""The document viewer in a real headless Chromium: exact highlight, scrolling, safety.

The template is filled by the server's own ``fill_viewer`` (a plain-text
document: one ``<pre>``) and served with its static assets from a local aiohttp
server, so what is checked here is what a reader's browser does with a citation
link. Formatted documents are checked in ``tests/test_viewer_render.py``.
"""

from __future__ import annotations

import html
import json
import re
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bot.server.routes import fill_viewer
from tests import browser as browser_module
from tests.browser import (
    Browser,
    ChromiumMissing,
    dump_dom,
    require_chromium,
    requires_chromium,
    screenshot,
    should_skip,
)

pytestmark = pytest.mark.browser

STATIC = Path(__file__).resolve().parent.parent / "bot" / "server" / "static"
PLACEHOLDERS = {
    "title", "meta", "file_url", "text_url", "doc_class", "length", "body", "ocr_pages",
    "signout", "source",
}  # fmt: skip

TITLE = "Handbook <script>document.body.dataset.pwned = 'title'</script> & co"
# A document that tries everything: markup that must stay text, a CRLF, astral
# emoji (two UTF-16 units each) and a ZWJ sequence before the cited range, and
# enough text after them that the passage is far below the first screen.
INTRO = (
    "\nEmployee handbook\n\n"
    "Literal markup: <script>document.body.dataset.pwned = '1'</script> and "
    "<img src=x onerror=\"document.body.dataset.pwned='2'\"> and &amp; and &#13; stay text.\r\n"
    "Thumbs \U0001f44d\U0001f3fd and family \U0001f468\u200d\U0001f469\u200d\U0001f467 "
    "come before the passage.\n\n"
)
FILLER = "\n\n".join(
    f"Section {i}. Policies that nobody cites, written at length so the page is long. " * 3
    for i in range(250)
)
TARGET = "Parental leave is 20 weeks \U0001f389 at full pay (ERR_42 & <b>policy</b> v2.3)."
TEXT = INTRO + FILLER + "\n\n" + TARGET + "\n\nClosing remarks.\n"
A = TEXT.index(TARGET)
B = A + len(TARGET)
EMOJI_RANGE = "\U0001f44d\U0001f3fd and family \U0001f468\u200d\U0001f469\u200d\U0001f467"
C = TEXT.index(EMOJI_RANGE)
D = C + len(EMOJI_RANGE)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
async def doc_url() -> AsyncIterator[str]:
    """URL of the filled viewer for :data:`TEXT`, served with the real static files."""
    page = fill_viewer(
        title=TITLE,
        meta="handbook.txt - indexed 2026-11-29",
        file_url="/d/7/file?t=abc&x=1",
        text=TEXT,
        kind="txt",
        text_url="/d/7/text?t=abc&x=1",
    )

    async def viewer(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html", charset="utf-8")

    app = web.Application()
    app.router.add_get("/d/{doc_id}", viewer)
    app.router.add_static("/static/", STATIC)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}/d/7?t=abc"
    finally:
        await server.close()


STATE_JS = """(() => {
  const hl = document.getElementById('hl');
  const r = hl ? hl.getBoundingClientRect() : null;
  return {
    hl: hl ? hl.textContent : null,
    highlight: document.body.dataset.highlight,
    scrolled: document.body.dataset.scrolled ?? null,
    scrollY: window.scrollY,
    top: r ? r.top : null,
    bottom: r ? r.bottom : null,
    innerHeight: window.innerHeight,
    doc: document.getElementById('doc').textContent,
    marks: document.querySelectorAll('mark').length,
    scripts: document.scripts.length,
    images: document.images.length,
    pwned: document.body.dataset.pwned ?? null,
    title: document.title,
    notice: document.getElementById('notice').hidden ? '' : document.getElementById('notice').textContent,
    focused: hl !== null && document.activeElement === hl,
  };
})()"""


async def set_hash(browser: Browser, fragment: str) -> dict:
    """Change the fragment in place and return the page state once the viewer reacted."""
    await browser.evaluate(
        "new Promise(resolve => {"
        "  window.addEventListener('hashchange', () => setTimeout(resolve, 0), {once: true});"
        f"  location.hash = {json.dumps(fragment)};"
        "})"
    )
    return await browser.evaluate(STATE_JS)


def assert_png(path: Path, width: int | None = None) -> None:
    """``path`` is a non-trivial PNG (of ``width`` pixels when given)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 1000
    if width is not None:
        assert struct.unpack(">II", data[16:24])[0] == width


def test_missing_chromium_fails_in_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without a browser, a developer run skips these tests but a CI run fails them."""
    monkeypatch.setenv(browser_module.CHROMIUM_ENV, str(tmp_path / "no-such-chromium"))
    monkeypatch.delenv("CI", raising=False)
    assert should_skip()
    monkeypatch.setenv("CI", "true")
    assert not should_skip()
    with pytest.raises(ChromiumMissing, match="CI"):
        require_chromium()


def test_template_contract() -> None:
    """Exactly the documented placeholders, each documented; the body alone in the document element."""
    template = (STATIC / "viewer.html").read_text(encoding="utf-8")
    assert set(re.findall(r"\{\{(\w+)\}\}", template)) == PLACEHOLDERS
    comment = template.split("-->", 1)[0]
    assert all(re.search(rf"^    {name} ", comment, re.M) for name in PLACEHOLDERS)
    assert (
        '<div id="doc" class="document {{doc_class}}" data-length="{{length}}">{{body}}</div>'
        in (template)
    )
    assert not re.search(r"(src|href)=\"(https?:)?//", template), "no external resources"
    forbidden = (STATIC / "forbidden.html").read_text(encoding="utf-8")
    assert "{{" not in forbidden and "<script" not in forbidden


@requires_chromium
async def test_highlights_exact_code_point_range_and_scrolls(doc_url: str, tmp_path: Path) -> None:
    async with Browser() as browser:
        await browser.goto(f"{doc_url}#char={A},{B}")
        await browser.wait_for("document.body.dataset.ready === 'true'")
        state = await browser.evaluate(STATE_JS)

        assert state["hl"] == TEXT[A:B] == TARGET
        assert state["highlight"] == f"{A},{B}"
        assert state["marks"] == 1 and state["focused"]
        # Scrolled down to the passage, and the passage is on screen.
        assert int(state["scrolled"]) > 0 and state["scrollY"] > 0
        assert state["top"] >= 0 and state["bottom"] <= state["innerHeight"]
        # The whole text arrived intact and inert: same characters, no injected elements.
        assert state["doc"] == TEXT
        assert state["scripts"] == 1 and state["images"] == 0 and state["pwned"] is None
        assert state["title"] == TITLE and state["notice"] == ""

        shot = await browser.screenshot(tmp_path / "viewer.png")
        assert_png(shot, width=1200)

        # Following another link to the same page only changes the fragment.
        state = await set_hash(browser, f"char={C},{D}")
        assert state["hl"] == TEXT[C:D] == EMOJI_RANGE
        assert state["highlight"] == f"{C},{D}" and state["marks"] == 1

        state = await set_hash(browser, f"char={A}")
        assert state["hl"] == "" and state["highlight"] == str(A) and state["marks"] == 1
        assert state["scrollY"] > 0

        state = await set_hash(browser, f"char=,{C}")
        assert state["hl"] == TEXT[:C] and state["highlight"] == f"0,{C}"
        state = await set_hash(browser, f"char={A},;length={len(TEXT)},UTF-8")
        assert state["hl"] == TEXT[A:] and state["highlight"] == f"{A},{len(TEXT)}"


@requires_chromium
async def test_invalid_fragments_highlight_nothing(doc_url: str) -> None:
    n = len(TEXT)
    async with Browser() as browser:
        await browser.goto(f"{doc_url}#char={n + 1}")
        await browser.wait_for("document.body.dataset.ready === 'true'")
        state = await browser.evaluate(STATE_JS)
        assert state["highlight"] == "none" and state["marks"] == 0
        assert state["scrollY"] == 0 and state["doc"] == TEXT
        assert "not in this version" in state["notice"]

        for fragment in (
            f"char={B},{A}",
            f"char=0,{n + 1}",
            "char=abc",
            "char=",
            "char=,",
            "char=-1,3",
            "line=1,2",
        ):
            await set_hash(
                browser, f"char={A},{B}"
            )  # a valid one in between, so each change counts
            state = await set_hash(browser, fragment)
            assert state["highlight"] == "none", fragment
            assert state["marks"] == 0 and state["doc"] == TEXT, fragment
            if fragment.startswith("char="):  # back to the top, where the notice is
                assert state["scrollY"] == 0 and state["notice"], fragment

        state = await set_hash(browser, f"char=0,{n}")  # the whole text is a valid range
        assert state["hl"] == TEXT


@requires_chromium
async def test_mobile_layout_has_no_sideways_scroll(doc_url: str, tmp_path: Path) -> None:
    async with Browser(window=(390, 844), mobile=True) as browser:
        await browser.goto(f"{doc_url}#char={A},{B}")
        await browser.wait_for("document.body.dataset.ready === 'true'")
        state = await browser.evaluate(STATE_JS)
        assert state["hl"] == TARGET and state["scrollY"] > 0
        widths = await browser.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert widths[0] <= widths[1]
        assert_png(await browser.screenshot(tmp_path / "mobile.png"), width=390)


@requires_chromium
async def test_one_shot_dom_dump_and_screenshot(doc_url: str, tmp_path: Path) -> None:
    dom = await dump_dom(f"{doc_url}#char={C},{D}", budget_ms=1000)
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None
    assert f'data-highlight="{C},{D}"' in body.group(1)
    mark = re.search(r'<mark id="hl"[^>]*>(.*?)</mark>', dom, re.S)
    assert mark is not None and html.unescape(mark.group(1)) == EMOJI_RANGE

    shot = await screenshot(
        f"{doc_url}#char={A},{B}", tmp_path / "cli.png", window=(800, 600), budget_ms=1000
    )
    assert_png(shot, width=800)
