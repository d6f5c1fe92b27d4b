"""Sign in with Slack in headless Chromium: a citation link from a real answer, through
Slack's (mock) authorize page, to the highlighted passage."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp.test_utils import TestClient

pytest.register_assert_rewrite("tests.conftest_bot", "tests.signin")

from bot.settings import Settings  # noqa: E402
from core.links import parse_char_fragment  # noqa: E402
from index.embed import Embedder  # noqa: E402
from tests.browser import Browser, CDPError, browser_marks, require_chromium  # noqa: E402
from tests.conftest_bot import FALCON_Q, Bot, create_bot_app, links  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    USER_ID,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    closed_port_url,
)
from tests.signin import SIGN_IN  # noqa: E402

pytestmark = browser_marks

VIEWER_SETTLED = (
    "location.pathname.startsWith('/d/') && !!document.body"
    " && document.body.dataset.highlight !== undefined"
)


async def _wait_for_viewer(browser: Browser, timeout: float = 20.0) -> None:
    """Wait until the redirects and page scripts have brought the browser to the viewer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            if await browser.evaluate(VIEWER_SETTLED):
                return
        except CDPError:
            pass  # between two documents: nothing to evaluate in yet
        if loop.time() > deadline:
            where = await browser.evaluate("location.href")
            raise AssertionError(f"never reached the viewer; the browser is at {where}")
        await asyncio.sleep(0.05)


async def test_a_citation_link_signs_in_with_slack_and_lands_on_the_passage(
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    settings_for: Callable[..., Settings],
    embedder: Embedder,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    fixture_data_dir: Path,
    tmp_path: Path,
) -> None:
    require_chromium()
    # The browser follows the real redirects, so the public URL is where this server listens.
    port = urlsplit(closed_port_url("/")).port
    public = f"http://127.0.0.1:{port}"
    settings = settings_for(public_url=public, **SIGN_IN)
    app = create_bot_app(settings, embedder, fixture_data_dir)
    http = await aiohttp_client(app, server_kwargs={"host": "127.0.0.1", "port": port})
    bot = Bot(http, app, slack, llm, settings, frozenset(asyncio.all_tasks()))
    slack.set_members(CHANNEL_ID, [USER_ID, "U0SOMEONE1"])
    slack.sign_in_as(USER_ID)

    await bot.event(app_mention_event(FALCON_Q, channel=CHANNEL_ID))
    url, _ = links(await bot.answer())[0]
    parts = urlsplit(url)
    assert url.startswith(f"{public}/d/")
    doc = bot.kb.store.document(int(parts.path.split("/")[2]))
    assert doc.scope == CHANNEL_ID, "a channel's document: membership is checked too"
    span = parse_char_fragment(parts.fragment)
    assert span is not None
    quote = bot.kb.canonical_text(doc.id)[span[0] : span[1]]

    async with Browser(window=(900, 300)) as browser:
        await browser.goto(url)
        await _wait_for_viewer(browser)
        state: dict[str, Any] = await browser.evaluate(
            "({hl: document.getElementById('hl')?.textContent ?? null,"
            " highlight: document.body.dataset.highlight,"
            " href: location.href, cookies: document.cookie})"
        )
        assert state["hl"] == quote and quote
        assert state["highlight"] == f"{span[0]},{span[1]}"
        assert state["href"] == url, "the same link, fragment included, after signing in"
        assert state["cookies"] == "", "the session cookie is out of scripts' reach"
        shot = await browser.screenshot(tmp_path / "signed-in-viewer.png")
        assert shot.read_bytes()[:4] == b"\x89PNG"

    (authorization,) = slack.authorizations
    assert authorization["redirect_uri"] == f"{public}/auth/slack/callback"
    assert "t=" not in str(authorization), "the link's token never went to Slack"
    assert len(slack.calls("openid.connect.token")) == 1
    assert len(slack.calls("openid.connect.userInfo")) == 1
    assert [c["channel"] for c in slack.calls("conversations.members")] == [CHANNEL_ID]
