"""A citation link from a real Slack answer, opened in headless Chromium on the real server."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from core.links import parse_char_fragment
from tests.browser import Browser, require_chromium, requires_chromium
from tests.conftest_bot import IN_DOMAIN, Bot, links
from tests.servers import app_mention_event

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
    quote = bot.kb.canonical_text(doc_id)[span[0] : span[1]]
    async with Browser(window=(900, 300)) as browser:
        await browser.goto(_local(bot, url))
        await browser.wait_for("document.body.dataset.highlight !== undefined")
        state = await browser.evaluate(
            "({hl: document.getElementById('hl')?.textContent ?? null,"
            " highlight: document.body.dataset.highlight,"
            " top: document.getElementById('hl')?.getBoundingClientRect().top ?? null,"
            " h: window.innerHeight})"
        )
        assert state["hl"] == quote and quote
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
