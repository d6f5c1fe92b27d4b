"""Sign in with Slack in headless Chromium: a citation link from a real answer, through
Slack's (mock) authorize page, to the highlighted passage; and out again, only with the
viewer's own Sign out button (another page's image, request or form signs nobody out)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

pytest.register_assert_rewrite("tests.conftest_bot", "tests.signin")

from bot.server.readers import SESSION_COOKIE  # noqa: E402
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


@pytest.fixture
async def served(
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    settings_for: Callable[..., Settings],
    embedder: Embedder,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    fixture_data_dir: Path,
) -> tuple[Bot, str]:
    """The bot with sign-in on, and its public URL: where it listens, since the browser
    follows the real redirects."""
    require_chromium()
    port = urlsplit(closed_port_url("/")).port
    public = f"http://127.0.0.1:{port}"
    settings = settings_for(public_url=public, **SIGN_IN)
    app = create_bot_app(settings, embedder, fixture_data_dir)
    http = await aiohttp_client(app, server_kwargs={"host": "127.0.0.1", "port": port})
    return Bot(http, app, slack, llm, settings, frozenset(asyncio.all_tasks())), public


async def test_a_citation_link_signs_in_with_slack_and_lands_on_the_passage(
    served: tuple[Bot, str], tmp_path: Path
) -> None:
    bot, public = served
    slack = bot.slack
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


# A page of another origin on the same site (127.0.0.1, another port): the browser sends
# the Lax session cookie with its requests, so only the session's token can tell them apart.
_ATTACK_QUIET = """<!DOCTYPE html><html><body>
<img id="img" src="{kb}/auth/logout">
<script>
const form = new URLSearchParams({{token: "forged"}});
Promise.all([
  new Promise(done => {{ const i = document.getElementById("img");
    i.onload = i.onerror = done; if (i.complete) done(); }}),
  fetch("{kb}/auth/logout", {{method: "POST", mode: "no-cors", credentials: "include", body: form}})
    .catch(() => null),
]).then(() => {{ document.body.dataset.done = "true"; }});
</script></body></html>"""
_ATTACK_FORM = """<!DOCTYPE html><html><body>
<form id="f" method="post" action="{kb}/auth/logout"><input name="token" value="forged"></form>
<script>document.getElementById("f").submit();</script></body></html>"""


async def _session_cookie(browser: Browser, public: str) -> str | None:
    cookies = (await browser.send("Network.getCookies", urls=[f"{public}/"]))["cookies"]
    return next((c["value"] for c in cookies if c["name"] == SESSION_COOKIE), None)


async def _text_at(browser: Browser, path: str, timeout: float = 20.0) -> str:
    """The page's text once the browser has arrived at ``path`` and loaded it."""
    expression = (
        f"location.pathname === {path!r} && document.readyState === 'complete'"
        " && document.body.innerText"
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            text = await browser.evaluate(expression)
            if text:
                return str(text)
        except CDPError:
            pass  # between two documents
        if loop.time() > deadline:
            raise AssertionError(
                f"never reached {path}: at {await browser.evaluate('location.href')}"
            )
        await asyncio.sleep(0.05)


async def test_only_the_viewers_sign_out_button_signs_a_reader_out(
    served: tuple[Bot, str],
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    tmp_path: Path,
) -> None:
    bot, public = served
    slack = bot.slack
    slack.sign_in_as(USER_ID)
    handbook = bot.kb.store.find_document("handbook.md")
    url = f"{public}/d/{handbook.id}?t={bot.services.engine.signer.token(handbook.id, '*')}"

    pages = {"/quiet": _ATTACK_QUIET, "/form": _ATTACK_FORM}

    async def attack(request: web.Request) -> web.Response:
        return web.Response(text=pages[request.path].format(kb=public), content_type="text/html")

    attacker = web.Application()
    attacker.router.add_get("/quiet", attack)
    attacker.router.add_get("/form", attack)
    other = await aiohttp_server(attacker, host="127.0.0.1")
    assert other.port != urlsplit(public).port

    async with Browser(window=(900, 400)) as browser:
        await browser.goto(url)
        await _wait_for_viewer(browser)
        signed_in = await _session_cookie(browser, public)
        assert signed_in

        # An image and a no-cors POST from another page: nothing changes.
        await browser.goto(f"http://127.0.0.1:{other.port}/quiet")
        await browser.wait_for("document.body.dataset.done === 'true'", timeout=20)
        assert await _session_cookie(browser, public) == signed_in
        # Another page's form, posted top-level with a token of its own: refused.
        await browser.goto(f"http://127.0.0.1:{other.port}/form")
        refused = await _text_at(browser, "/auth/logout")
        assert "did not come from the knowledge base's own page" in refused
        assert await _session_cookie(browser, public) == signed_in
        # The old address, opened as a link: a page with the button, not a sign-out.
        await browser.goto(f"{public}/auth/logout")
        assert "Sign out of the knowledge base?" in await _text_at(browser, "/auth/logout")
        assert await browser.evaluate("!!document.querySelector('#signout button')")
        assert await _session_cookie(browser, public) == signed_in

        # Still signed in: the viewer opens without another sign-in; its button signs out.
        await browser.goto(url)
        await _wait_for_viewer(browser)
        assert len(slack.authorizations) == 1
        await browser.evaluate("document.querySelector('#signout button').click()")
        assert "You are signed out" in await _text_at(browser, "/auth/logout")
        assert await _session_cookie(browser, public) is None
        shot = await browser.screenshot(tmp_path / "signed-out.png")
        assert shot.read_bytes()[:4] == b"\x89PNG"
