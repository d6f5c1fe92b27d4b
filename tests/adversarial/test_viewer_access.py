"""Only the right people read: attacks on the viewer when sign-in is required.

The attacker holds a forwarded citation link, or crafts URLs and cookies, or
replays what they captured of someone else's sign-in. They have a Slack account
of their own (in this workspace, but not in the channel, or in another one) and
can make a victim's browser open any URL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.register_assert_rewrite("tests.conftest_bot", "tests.signin")

from bot.slack.people.signin import LOGIN_PATH, STATE_COOKIE, STATE_PURPOSE  # noqa: E402
from core.links import LinkSigner  # noqa: E402
from tests.conftest_bot import PUBLIC_URL, Bot, BotFactory  # noqa: E402
from tests.servers import CHANNEL_ID, DEFAULT_CLIENT_SECRET, TEAM_ID, USER_ID  # noqa: E402
from tests.signin import (  # noqa: E402
    SIGN_IN,
    callback,
    forge_session,
    link,
    link_secret,
    local,
    session_cookie,
    sign_in,
    start,
    use_session,
)

FORBIDDEN = (
    Path(__file__).resolve().parents[2] / "bot" / "server" / "static" / "forbidden.html"
).read_text(encoding="utf-8")
MEMBER = USER_ID
ATTACKER = "U0ATTACKER"
FALCON_WORDS = "Project Falcon launches"


@pytest.fixture
async def bot(make_bot: BotFactory) -> Bot:
    """Sign-in on; only :data:`MEMBER` is in CHANNEL_ID, where falcon.md belongs."""
    bot = await make_bot(**SIGN_IN)
    bot.slack.set_members(CHANNEL_ID, [MEMBER])
    return bot


async def _is_sent_to_sign_in(bot: Bot, path: str) -> None:
    resp = await bot.http.get(path, allow_redirects=False)
    assert resp.status == 302, (path, resp.status)
    assert resp.headers["Location"].startswith(f"{PUBLIC_URL}{LOGIN_PATH}?")
    assert FALCON_WORDS not in await resp.text()


async def test_a_forwarded_link_opens_nothing_for_someone_outside_the_channel(bot: Bot) -> None:
    falcon = bot.kb.store.find_document("falcon.md")
    forwarded = link(bot, falcon)
    # Nobody signed in: off to sign-in, nothing of the document.
    await _is_sent_to_sign_in(bot, forwarded)
    # Signed in to this workspace, but not in the channel: the plain 403 page.
    await sign_in(bot, ATTACKER)
    for path in (forwarded, link(bot, falcon, file=True)):
        resp = await bot.http.get(path)
        assert resp.status == 403 and await resp.text() == FORBIDDEN
    # A link re-signed for "everyone" by nobody: the token is checked, and a
    # genuine token for the wrong scope still opens nothing.
    wider = link(bot, falcon, scope="*")
    resp = await bot.http.get(wider)
    assert resp.status == 403 and await resp.text() == FORBIDDEN


async def test_a_forwarded_link_opens_nothing_for_another_workspace(bot: Bot) -> None:
    handbook = bot.kb.store.find_document("handbook.md")
    resp = await sign_in(bot, ATTACKER, team_id="T0OTHERORG", next_path=link(bot, handbook))
    assert resp.status == 403 and session_cookie(bot) is None
    await _is_sent_to_sign_in(bot, link(bot, handbook))


@pytest.mark.parametrize(
    "next_path",
    [
        "https://evil.example/",
        "//evil.example/",
        "///evil.example/",
        "/\\evil.example/",
        "\\\\evil.example/",
        "/%0d%0aLocation: https://evil.example/",
        "/\tevil",
        "http:evil.example",
    ],
)
async def test_no_open_redirect_after_sign_in(bot: Bot, next_path: str) -> None:
    for path in (LOGIN_PATH, "/auth/slack/start"):
        resp = await bot.http.get(path, params={"next": next_path}, allow_redirects=False)
        assert resp.status == 400 and "Location" not in resp.headers, path
        assert "evil" not in await resp.text()
    assert bot.slack.authorizations == []


async def test_the_landing_url_is_always_on_the_public_url(bot: Bot) -> None:
    bot.slack.sign_in_as(MEMBER)
    for next_path in ("/d/1?t=x", "/@evil.example", "/.evil.example"):
        resp = await callback(bot, await start(bot, next_path, fragment="char=1,2"))
        assert resp.headers["Location"] == f"{PUBLIC_URL}{next_path}#char=1,2"


async def test_a_fragment_cannot_smuggle_anything_into_the_landing_url(bot: Bot) -> None:
    bot.slack.sign_in_as(MEMBER)
    for fragment in ("x=1", "char=1,2\r\nSet-Cookie: a=b", "page=1#<script>", "char=" + "9" * 300):
        resp = await callback(bot, await start(bot, "/d/1?t=x", fragment=fragment))
        assert resp.headers["Location"] == f"{PUBLIC_URL}/d/1?t=x", fragment


@pytest.mark.parametrize(
    "cookie",
    [
        pytest.param(lambda b: forge_session(b, secret="guessed-secret-0000"), id="other secret"),
        pytest.param(lambda b: forge_session(b, purpose=STATE_PURPOSE), id="sign-in state key"),
        pytest.param(lambda b: forge_session(b, purpose="kb-doc-link"), id="link key"),
        pytest.param(lambda b: forge_session(b, issued_at=time.time() - 9 * 3600), id="expired"),
        pytest.param(lambda b: forge_session(b, [ATTACKER, TEAM_ID, "admin"]), id="odd shape"),
        pytest.param(lambda b: forge_session(b)[:-3] + "AAA", id="bad signature"),
        pytest.param(lambda b: _swap_user(b, forge_session(b)), id="edited user"),
        pytest.param(lambda b: "", id="empty"),
    ],
)
async def test_forged_or_expired_session_cookies_open_nothing(
    bot: Bot, cookie: Callable[[Bot], str]
) -> None:
    falcon = bot.kb.store.find_document("falcon.md")
    use_session(bot, cookie(bot))
    await _is_sent_to_sign_in(bot, link(bot, falcon))
    await _is_sent_to_sign_in(bot, link(bot, falcon, file=True))


def _swap_user(bot: Bot, value: str) -> str:
    """A genuine cookie's timestamp and signature on a payload naming the attacker."""
    _, timestamp, signature = value.split(".")
    payload = forge_session(bot, [ATTACKER, TEAM_ID]).split(".")[0]
    return f"{payload}.{timestamp}.{signature}"


async def test_a_genuine_session_is_what_opens_the_channel_document(bot: Bot) -> None:
    # The control for the forgeries above: the same cookie, correctly signed, works.
    falcon = bot.kb.store.find_document("falcon.md")
    use_session(bot, forge_session(bot))
    resp = await bot.http.get(link(bot, falcon))
    assert resp.status == 200 and FALCON_WORDS in await resp.text()


async def test_a_captured_callback_cannot_be_replayed(bot: Bot) -> None:
    bot.slack.sign_in_as(MEMBER)
    authorize = await start(bot, "/d/1?t=x")
    state_cookie = bot.http.session.cookie_jar.filter_cookies(
        bot.http.make_url("/auth/slack/callback")
    )[STATE_COOKIE].value
    back = bot.slack.approve(authorize)
    first = await bot.http.get(local(back), allow_redirects=False)
    assert first.status == 302
    # Everything the browser sent, sent again (the attacker copied URL and cookie).
    bot.http.session.cookie_jar.clear()
    bot.http.session.cookie_jar.update_cookies(
        {STATE_COOKIE: state_cookie}, response_url=bot.http.make_url("/auth/slack/callback")
    )
    again = await bot.http.get(local(back), allow_redirects=False)
    assert again.status == 400 and session_cookie(bot) is None


async def test_a_victim_cannot_be_signed_in_as_the_attacker(bot: Bot) -> None:
    # Login CSRF: the attacker gets a code for their own account and sends the
    # callback URL to the victim, whose browser never started that sign-in.
    bot.slack.sign_in_as(ATTACKER)
    back = bot.slack.approve(await start(bot, "/d/1?t=x"))
    bot.http.session.cookie_jar.clear()  # the victim's browser
    resp = await bot.http.get(local(back), allow_redirects=False)
    assert resp.status == 400 and session_cookie(bot) is None
    # ...nor by pairing the attacker's state with a sign-in the victim started.
    victim_authorize = await start(bot, "/d/1?t=x")
    assert victim_authorize
    resp = await bot.http.get(local(back), allow_redirects=False)
    assert resp.status == 400 and session_cookie(bot) is None


@pytest.mark.parametrize(
    "claims",
    [
        {"nonce": "nonce-of-another-sign-in"},
        {"aud": "9999999999.8888888888"},
        {"exp": 1_000_000_000},
        {"exp": float("nan")},  # NaN <= now is false: it passed for a token that never expires
        {"exp": float("inf")},
        {"exp": "9999999999"},
        {"exp": None},
        {"https://slack.com/user_id": "U0SOMEONE2", "sub": "U0SOMEONE2"},
        {"https://slack.com/team_id": "T0OTHERORG"},
    ],
)
async def test_an_id_token_for_another_sign_in_app_or_person_is_refused(
    bot: Bot, claims: dict[str, object]
) -> None:
    bot.slack.id_token_overrides = claims
    resp = await sign_in(bot, MEMBER, next_path="/d/1?t=x")
    assert resp.status == 403 and session_cookie(bot) is None


async def test_a_stolen_state_cookie_expires(bot: Bot) -> None:
    old = LinkSigner(link_secret(bot), ttl_seconds=60, clock=lambda: time.time() - 601)
    stale = old.derived(STATE_PURPOSE).dumps(["s" * 43, "n" * 43, "/d/1?t=x", ""])
    bot.http.session.cookie_jar.update_cookies(
        {STATE_COOKIE: stale}, response_url=bot.http.make_url("/auth/slack/callback")
    )
    resp = await bot.http.get(
        "/auth/slack/callback", params={"state": "s" * 43, "code": "x"}, allow_redirects=False
    )
    assert resp.status == 400 and session_cookie(bot) is None
    assert bot.slack.calls("openid.connect.token") == []


async def test_a_sign_in_logs_no_secret_even_at_debug(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        resp = await sign_in(bot, MEMBER, next_path="/d/1?t=x")
    assert resp.status == 302
    issued = [t for t in bot.slack._user_tokens if t in caplog.text]  # noqa: SLF001
    assert issued == [], "the reader's access token reached the log"
    assert DEFAULT_CLIENT_SECRET not in caplog.text
    assert session_cookie(bot) not in caplog.text
