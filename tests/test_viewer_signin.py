"""Sign in with Slack for the viewer (KB_VIEWER_AUTH=slack): the flow, the session, who reads what."""

from __future__ import annotations

import base64
import html
import json
import re
import time
from http.cookies import SimpleCookie
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.conftest_bot", "tests.signin")

from bot.server.readers import local_path  # noqa: E402
from bot.slack.people.signin import LOGIN_PATH, LOGOUT_PATH, STATE_COOKIE  # noqa: E402
from tests.conftest_bot import PUBLIC_URL, Bot, BotFactory, make_settings  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    CLIENT_ID,
    DEFAULT_CLIENT_SECRET,
    TEAM_ID,
    USER_ID,
)
from tests.signin import (  # noqa: E402
    SIGN_IN,
    callback,
    forge_session,
    link,
    local,
    query,
    session_cookie,
    sign_in,
    start,
    use_session,
)

FORBIDDEN = Path(__file__).resolve().parent.parent / "bot" / "server" / "static" / "forbidden.html"
MEMBER = USER_ID
OUTSIDER = "U0OUTSIDER"


@pytest.fixture
async def bot(make_bot: BotFactory) -> Bot:
    """The bot with sign-in on; only :data:`MEMBER` is in CHANNEL_ID."""
    bot = await make_bot(**SIGN_IN)
    bot.slack.set_members(CHANNEL_ID, [MEMBER, "U0SOMEONE1"])
    return bot


def _cookie(resp_headers: list[str], name: str) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for header in resp_headers:
        if header.startswith(f"{name}="):
            jar.load(header)
    assert name in jar, resp_headers
    return jar


async def test_without_a_session_every_document_link_goes_to_sign_in(bot: Bot) -> None:
    falcon = bot.kb.store.find_document("falcon.md")
    for path in (
        link(bot, falcon),
        link(bot, falcon, file=True),
        f"/d/{falcon.id}?t=tampered",  # nothing about the link is looked at first
        "/d/abc",
    ):
        resp = await bot.http.get(path, allow_redirects=False)
        assert resp.status == 302, path
        location = resp.headers["Location"]
        assert location.startswith(f"{PUBLIC_URL}{LOGIN_PATH}?"), location
        assert query(location) == {"next": path}
        assert resp.headers["Cache-Control"] == "private, no-store"


async def test_the_sign_in_page_goes_on_to_slack_with_the_fragment(bot: Bot) -> None:
    resp = await bot.http.get(LOGIN_PATH, params={"next": "/d/7?t=abc"})
    assert resp.status == 200
    page = await resp.text()
    assert 'id="signin" href="start?next=%2Fd%2F7%3Ft%3Dabc"' in page
    assert '<script src="../../static/signin.js"></script>' in page
    csp = resp.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert (await bot.http.get("/static/signin.js")).status == 200


async def test_start_sends_the_browser_to_slack_with_state_and_nonce(bot: Bot) -> None:
    resp = await bot.http.get(
        "/auth/slack/start", params={"next": "/d/7?t=abc"}, allow_redirects=False
    )
    assert resp.status == 302
    location = resp.headers["Location"]
    assert location.startswith(f"{bot.slack.url}/openid/connect/authorize?"), location
    params = query(location)
    assert params["response_type"] == "code" and params["scope"] == "openid profile"
    assert params["client_id"] == CLIENT_ID and params["team"] == TEAM_ID
    assert params["redirect_uri"] == f"{PUBLIC_URL}/auth/slack/callback"
    assert len(params["state"]) >= 32 and len(params["nonce"]) >= 32
    assert params["state"] != params["nonce"]
    cookie = _cookie(resp.headers.getall("Set-Cookie"), STATE_COOKIE)[STATE_COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Lax" and not cookie["secure"]
    assert cookie["path"] == "/auth/slack" and cookie["max-age"] == "600"
    # The link's token stays in this server's cookie, never in the URL Slack sees.
    assert "abc" not in location


async def test_a_member_signs_in_and_lands_on_the_passage(bot: Bot) -> None:
    falcon = bot.kb.store.find_document("falcon.md")
    path = link(bot, falcon)
    authorize = await start(bot, path, fragment="char=10,42")
    resp = await callback(bot, authorize)
    assert resp.status == 302
    assert resp.headers["Location"] == f"{PUBLIC_URL}{path}#char=10,42"
    session = _cookie(resp.headers.getall("Set-Cookie"), "kb_session")["kb_session"]
    assert session["httponly"] and session["samesite"] == "Lax" and session["path"] == "/"
    assert not session["secure"], "http public URL"
    assert session["max-age"] == str(8 * 3600)
    # Signed, not secret: the user and team, nothing Slack handed over.
    payload = session.value.split(".")[0]
    assert json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))) == [
        MEMBER,
        TEAM_ID,
    ]
    assert "xoxp" not in session.value and DEFAULT_CLIENT_SECRET not in session.value
    page = await bot.http.get(local(resp.headers["Location"]))
    assert page.status == 200 and "Project Falcon launches" in await page.text()
    pdf_or_file = await bot.http.get(link(bot, falcon, file=True))
    assert pdf_or_file.status == 200


async def test_a_non_member_gets_the_same_403_as_a_bad_link(bot: Bot) -> None:
    falcon = bot.kb.store.find_document("falcon.md")
    assert (await sign_in(bot, OUTSIDER)).status == 200
    for path in (link(bot, falcon), link(bot, falcon, file=True)):
        resp = await bot.http.get(path)
        assert resp.status == 403
        assert await resp.text() == FORBIDDEN.read_text(encoding="utf-8")
    bad = await bot.http.get(f"/d/{falcon.id}?t=tampered")
    assert bad.status == 403 and await bad.text() == FORBIDDEN.read_text(encoding="utf-8")


async def test_documents_for_everyone_need_only_a_signed_in_member_of_the_workspace(
    bot: Bot,
) -> None:
    handbook = bot.kb.store.find_document("handbook.md")
    await sign_in(bot, OUTSIDER)
    resp = await bot.http.get(link(bot, handbook))
    assert resp.status == 200 and "expense claims" in await resp.text()
    assert bot.slack.calls("conversations.members") == []


async def test_someone_of_another_workspace_is_refused(bot: Bot) -> None:
    resp = await sign_in(bot, "U0ELSEWHERE", team_id="T0OTHERORG", next_path="/d/1?t=x")
    assert resp.status == 403
    assert "another Slack workspace" in await resp.text()
    assert session_cookie(bot) is None


async def test_a_callback_with_the_wrong_state_is_refused(bot: Bot) -> None:
    authorize = await start(bot, "/d/1?t=x")
    back = bot.slack.approve(authorize).replace("state=", "state=x", 1)
    resp = await bot.http.get(local(back), allow_redirects=False)
    assert resp.status == 400 and session_cookie(bot) is None
    # Nothing was exchanged: the code never left this server.
    assert bot.slack.calls("openid.connect.token") == []


async def test_a_callback_without_the_state_cookie_is_refused(bot: Bot) -> None:
    authorize = await start(bot, "/d/1?t=x")
    bot.http.session.cookie_jar.clear()
    resp = await callback(bot, authorize)
    assert resp.status == 400 and session_cookie(bot) is None


async def test_cancelling_in_slack_signs_nobody_in(bot: Bot) -> None:
    bot.slack.sign_in_as(None)
    resp = await callback(bot, await start(bot, "/d/1?t=x"))
    assert resp.status == 403 and "cancelled" in await resp.text()
    assert session_cookie(bot) is None


async def test_an_expired_session_goes_back_to_sign_in(make_bot: BotFactory) -> None:
    bot = await make_bot(**SIGN_IN, viewer_session_hours=1)
    handbook = bot.kb.store.find_document("handbook.md")
    use_session(bot, forge_session(bot, issued_at=time.time() - 3500))
    assert (await bot.http.get(link(bot, handbook))).status == 200
    use_session(bot, forge_session(bot, issued_at=time.time() - 3700))
    resp = await bot.http.get(link(bot, handbook), allow_redirects=False)
    assert resp.status == 302 and LOGIN_PATH in resp.headers["Location"]


_SIGN_OUT_FORM = re.compile(
    r'<form class="signout" id="signout" method="post" action="([^"]*)">'
    r'<input type="hidden" name="token" value="([^"]*)">'
)


def _sign_out_form(page: str) -> tuple[str, str]:
    """The action and token of a page's Sign out button."""
    found = _SIGN_OUT_FORM.search(page)
    assert found is not None, "the page has a Sign out button"
    return html.unescape(found[1]), html.unescape(found[2])


async def test_the_viewers_sign_out_button_ends_the_session(bot: Bot) -> None:
    handbook = bot.kb.store.find_document("handbook.md")
    await sign_in(bot)
    page = await bot.http.get(link(bot, handbook))
    assert page.status == 200
    assert "form-action 'self'" in page.headers["Content-Security-Policy"]
    action, token = _sign_out_form(await page.text())
    assert action == "../auth/logout"  # from /d/<id>, as a path prefix needs
    resp = await bot.http.post(LOGOUT_PATH, data={"token": token})
    assert resp.status == 200 and "signed out" in await resp.text()
    assert session_cookie(bot) is None
    resp = await bot.http.get(link(bot, handbook), allow_redirects=False)
    assert resp.status == 302


async def test_a_get_of_the_sign_out_address_shows_the_button_and_signs_nobody_out(
    bot: Bot,
) -> None:
    handbook = bot.kb.store.find_document("handbook.md")
    await sign_in(bot)
    page = await bot.http.get(LOGOUT_PATH)
    assert page.status == 200
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert "Set-Cookie" not in page.headers
    action, token = _sign_out_form(await page.text())
    assert action == "logout"
    assert session_cookie(bot) is not None
    assert (await bot.http.get(link(bot, handbook))).status == 200
    # Its button works like the viewer's.
    assert (await bot.http.post(LOGOUT_PATH, data={"token": token})).status == 200
    assert session_cookie(bot) is None
    assert "not signed in" in await (await bot.http.get(LOGOUT_PATH)).text()


@pytest.mark.parametrize("token", [None, "", "forged", "another-session"])
async def test_a_post_without_this_sessions_token_signs_nobody_out(
    bot: Bot, token: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    handbook = bot.kb.store.find_document("handbook.md")
    if token == "another-session":
        # A token the server issued, for the session of someone else (or an earlier one).
        use_session(bot, forge_session(bot, ("U0SOMEONE1", TEAM_ID)))
        _, token = _sign_out_form(await (await bot.http.get(LOGOUT_PATH)).text())
    await sign_in(bot)
    mine = session_cookie(bot)
    data = {} if token is None else {"token": token}
    with caplog.at_level("WARNING", logger="bot.slack.people.signin"):
        resp = await bot.http.post(LOGOUT_PATH, data=data)
    assert resp.status == 403
    assert "did not come from the knowledge base's own page" in html.unescape(await resp.text())
    assert "Set-Cookie" not in resp.headers, "the cookie is not touched"
    assert session_cookie(bot) == mine
    assert (await bot.http.get(link(bot, handbook))).status == 200
    assert any("refused a sign-out" in r.getMessage() for r in caplog.records)


async def test_the_sign_out_token_never_shows_the_session_cookie(bot: Bot) -> None:
    await sign_in(bot)
    cookie = session_cookie(bot)
    assert cookie
    page = await (await bot.http.get(LOGOUT_PATH)).text()
    _, token = _sign_out_form(page)
    assert cookie not in page and cookie.split(".")[-1] not in token


@pytest.mark.parametrize(
    "next_path",
    [
        "https://evil.example/d/1",
        "//evil.example/d/1",
        "/\\evil.example/d/1",
        "javascript:alert(1)",
        "d/1",
        "/d/1\r\nSet-Cookie: x=1",
    ],
)
async def test_a_next_off_this_server_is_refused(bot: Bot, next_path: str) -> None:
    assert local_path(next_path) is None
    for path in (LOGIN_PATH, "/auth/slack/start"):
        resp = await bot.http.get(path, params={"next": next_path}, allow_redirects=False)
        assert resp.status == 400, (path, next_path)
        assert "Location" not in resp.headers


async def test_https_public_url_makes_the_cookies_secure(make_bot: BotFactory) -> None:
    bot = await make_bot(**SIGN_IN, public_url="https://kb.example.com/kb")
    resp = await bot.http.get(
        "/auth/slack/start", params={"next": "/d/1?t=x"}, allow_redirects=False
    )
    cookie = _cookie(resp.headers.getall("Set-Cookie"), STATE_COOKIE)[STATE_COOKIE]
    assert cookie["secure"] and cookie["path"] == "/kb/auth/slack"
    assert query(resp.headers["Location"])["redirect_uri"] == (
        "https://kb.example.com/kb/auth/slack/callback"
    )
    redirect = await bot.http.get("/d/1?t=x", allow_redirects=False)
    assert redirect.headers["Location"].startswith("https://kb.example.com/kb/auth/slack/login?")


async def test_channel_members_are_paged_and_remembered_for_a_minute(bot: Bot) -> None:
    falcon = bot.kb.store.find_document("falcon.md")
    crowd = [f"U{i:09d}" for i in range(2500)]
    bot.slack.set_members(CHANNEL_ID, [*crowd, MEMBER])
    await sign_in(bot)
    assert (await bot.http.get(link(bot, falcon))).status == 200
    assert (await bot.http.get(link(bot, falcon, file=True))).status == 200
    calls = bot.slack.calls("conversations.members")
    assert len(calls) == 3 and all(c["channel"] == CHANNEL_ID for c in calls)
    # Removed from the channel: still a reader until the minute is over.
    bot.slack.set_members(CHANNEL_ID, crowd)
    assert (await bot.http.get(link(bot, falcon))).status == 200
    from bot.server.readers import READER_GATE
    from bot.slack.people.signin import SlackReaders

    readers = bot.app[READER_GATE]
    assert isinstance(readers, SlackReaders)
    now = readers.members.clock()
    readers.members.clock = lambda: now + 61
    assert (await bot.http.get(link(bot, falcon))).status == 403


async def test_slack_unreachable_for_the_membership_check_is_a_503(bot: Bot) -> None:
    falcon = bot.kb.store.find_document("falcon.md")
    await sign_in(bot)
    bot.slack.fail("conversations.members", "internal_error")
    resp = await bot.http.get(link(bot, falcon))
    assert resp.status == 503 and "Project Falcon" not in await resp.text()


async def test_link_mode_has_no_sign_in(make_bot: BotFactory) -> None:
    bot = await make_bot()
    assert (await bot.http.get(LOGIN_PATH)).status == 404
    handbook = bot.kb.store.find_document("handbook.md")
    assert (await bot.http.get(link(bot, handbook))).status == 200
    ready = await (await bot.http.get("/readyz")).json()
    assert ready["viewer_auth"] == "link"


def test_sign_in_needs_the_app_credentials_and_the_bot_token() -> None:
    with pytest.raises(ValueError, match="SLACK_CLIENT_SECRET"):
        make_settings(viewer_auth="slack", slack_client_id=CLIENT_ID, slack_bot_token="xoxb-1")
    with pytest.raises(ValueError, match="SLACK_BOT_TOKEN"):
        make_settings(**SIGN_IN)
    with pytest.raises(ValueError, match="KB_VIEWER_AUTH"):
        make_settings(viewer_auth="slack-ish")


def test_the_client_secret_is_in_no_repr() -> None:
    settings = make_settings(**SIGN_IN, slack_bot_token="xoxb-1")
    shown = repr(settings) + repr(settings.signin_config()) + str(settings.signin_config())
    assert DEFAULT_CLIENT_SECRET not in shown
    assert DEFAULT_CLIENT_SECRET in settings.secret_values(), "redacted from the log by value"
