"""Helpers for tests of the viewer's Sign in with Slack: the settings, signing in, links.

Sign-in goes the way a browser goes, minus the browser: ``/auth/slack/start``,
then the mock's authorize step (:meth:`MockSlackAPI.approve`), then the callback,
with the test client's cookie jar carrying the cookies in between.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp

from bot.server.readers import SESSION_COOKIE, SESSION_PURPOSE
from bot.slack.people.signin import CALLBACK_PATH, START_PATH
from core.links import LinkSigner, load_or_create_secret
from index.records import DocumentRow
from tests.conftest_bot import PUBLIC_URL, Bot
from tests.servers import CLIENT_ID, DEFAULT_CLIENT_SECRET, TEAM_ID, USER_ID

SIGN_IN: dict[str, Any] = {
    "viewer_auth": "slack",
    "slack_client_id": CLIENT_ID,
    "slack_client_secret": DEFAULT_CLIENT_SECRET,
}
"""Settings overrides that turn sign-in on (pass to ``make_bot(**SIGN_IN)``)."""


def link(bot: Bot, doc: DocumentRow, *, scope: str | None = None, file: bool = False) -> str:
    """The path and query of a citation link to ``doc`` (signed for its own scope by default)."""
    token = bot.services.engine.signer.token(doc.id, doc.scope if scope is None else scope)
    return f"/d/{doc.id}{'/file' if file else ''}?t={token}"


def local(url: str) -> str:
    """The path and query of an absolute URL on the public host (the test client's server)."""
    parts = urlsplit(url)
    assert url.startswith(PUBLIC_URL + "/"), url
    return parts.path + (f"?{parts.query}" if parts.query else "")


async def start(bot: Bot, next_path: str = "", fragment: str = "") -> str:
    """Begin a sign-in; returns Slack's authorize URL the browser is sent to."""
    params = {"next": next_path, **({"fragment": fragment} if fragment else {})}
    resp = await bot.http.get(START_PATH, params=params, allow_redirects=False)
    assert resp.status == 302, await resp.text()
    return resp.headers["Location"]


async def callback(bot: Bot, authorize_url: str) -> aiohttp.ClientResponse:
    """Approve at the mock's authorize step and bring Slack's answer to the callback."""
    back = bot.slack.approve(authorize_url)
    assert back.startswith(PUBLIC_URL + CALLBACK_PATH), back
    return await bot.http.get(local(back), allow_redirects=False)


async def sign_in(
    bot: Bot, user_id: str = USER_ID, *, team_id: str | None = None, next_path: str = ""
) -> aiohttp.ClientResponse:
    """Sign ``user_id`` in on the test client; returns the callback's response."""
    bot.slack.sign_in_as(user_id, team_id=team_id)
    return await callback(bot, await start(bot, next_path))


def query(url: str) -> dict[str, str]:
    """The query parameters of ``url``."""
    return dict(parse_qsl(urlsplit(url).query))


def session_cookie(bot: Bot) -> str | None:
    """The session cookie the test client holds, if any."""
    morsel = bot.http.session.cookie_jar.filter_cookies(bot.http.make_url("/d/1")).get(
        SESSION_COOKIE
    )
    return morsel.value if morsel is not None else None


def link_secret(bot: Bot) -> str:
    """The secret the bot signs links, sessions and sign-in states with."""
    return load_or_create_secret(bot.settings.data_dir, bot.settings.engine_config().link_secret)


def forge_session(
    bot: Bot,
    payload: Any = (USER_ID, TEAM_ID),
    *,
    issued_at: float | None = None,
    secret: str | None = None,
    purpose: str = SESSION_PURPOSE,
) -> str:
    """A session cookie value as the server would sign it, or with another secret, purpose, age."""
    when = time.time() if issued_at is None else issued_at
    signer = LinkSigner(secret or link_secret(bot), ttl_seconds=60, clock=lambda: when)
    return signer.derived(purpose).dumps(list(payload) if isinstance(payload, tuple) else payload)


def use_session(bot: Bot, value: str) -> None:
    """Put ``value`` in the test client's cookie jar as the session cookie."""
    jar = bot.http.session.cookie_jar
    jar.clear()
    jar.update_cookies({SESSION_COOKIE: value}, response_url=bot.http.make_url("/"))
