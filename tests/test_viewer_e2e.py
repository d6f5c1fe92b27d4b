"""A citation link from a real Slack answer, opened in headless Chromium on the real server."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from core.links import parse_char_fragment
from tests.browser import Browser, require_chromium, requires_chromium
from tests.conftest_bot import IN_DOMAIN, Bot, links
from tests.servers import app_mention_event
from tests.test_viewer_render import SYNTAX, shown

pytestmark = [pytest.mark.browser, requires_chromium]


def _local(bot: Bot, url: str) -> str:
    """The link as served by the test server (the public host is a placeholder)."""
    parts = urlsplit(url)
    return str(bot.http.make_url(parts.path)) + f"?{parts.query}#{parts.fragment}"


async def test_cited_passage_is_highlighted_and_scrolled_into_view(
    bot: Bot, tmp_path: Path
) -> None:
    require_chromium()
    await bot.event(app_mention_event(f"<@{bot.slack.bot_user_id}> {IN_DOMAIN}"))
    answer = await bot.answer()
    url, n = links(answer)[0]
    assert n == 1
    parts = urlsplit(url)
    doc_id = int(parts.path.rsplit("/", 1)[-1])
    span = parse_char_fragment(parts.fragment)
    assert span is not None
    text = bot.kb.canonical_text(doc_id)
    quote = text[span[0] : span[1]]
    # The page is formatted: the passage's blocks are highlighted, not the blank lines
    # or marks between them (tests/test_viewer_render.py).
    highlighted = shown(text, bot.kb.store.document(doc_id).kind, span[0], span[1])
    async with Browser(window=(900, 300)) as browser:
        await browser.goto(_local(bot, url))
        await browser.wait_for("document.body.dataset.highlight !== undefined")
        state = await browser.evaluate(
            "({hl: [...document.querySelectorAll('mark.hl')].map(m => m.textContent).join(''),"
            " highlight: document.body.dataset.highlight,"
            " top: document.getElementById('hl')?.getBoundingClientRect().top ?? null,"
            " h: window.innerHeight})"
        )
        assert state["hl"] == highlighted and highlighted
        # What is not highlighted of the quote is whitespace and marks, never words.
        rest = iter(quote)
        unshown = [c for h in highlighted for c in iter(lambda: next(rest), h)]
        assert set(unshown + list(rest)) <= SYNTAX
        assert state["highlight"] == f"{span[0]},{span[1]}"
        assert 0 <= state["top"] < state["h"], "the passage is not in view"
        shot = await browser.screenshot(tmp_path / "viewer.png")
        assert shot.read_bytes()[:4] == b"\x89PNG"

        tampered = _local(bot, url).replace("t=", "t=x", 1)
        await browser.goto(tampered)
        body = await browser.evaluate("document.body.innerText")
        assert quote[:30] not in body
        assert "This link is not valid" in body  # the static 403 page
    resp = await bot.http.get(urlsplit(tampered).path + "?" + urlsplit(tampered).query)
    assert resp.status == 403
