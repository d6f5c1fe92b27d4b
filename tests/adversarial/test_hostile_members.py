"""What members, people who left, external users and agents can reach, attacked from outside.

The people here hold what an ordinary member holds: a viewer session cookie, an
MCP token, the questions and titles they type, the buttons they click. Each
attack is sent to the real app over HTTP (signed as Slack signs, where Slack is
the sender) and must end with nothing leaked, nothing lost and no server error.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("tests.conftest_bot", "tests.signin")

from tests.conftest_bot import Bot, BotFactory  # noqa: E402
from tests.servers import CHANNEL_ID, TEAM_ID, USER_ID  # noqa: E402
from tests.signin import SIGN_IN, forge_session, link, use_session  # noqa: E402

DEPARTED = "U0LEFT0001"


@pytest.fixture
async def signin_bot(make_bot: BotFactory) -> Bot:
    """The bot with sign-in required; :data:`DEPARTED` and the usual member are in CHANNEL_ID."""
    bot = await make_bot(**SIGN_IN)
    bot.slack.set_members(CHANNEL_ID, [USER_ID, DEPARTED])
    return bot


@pytest.mark.parametrize("document", ["handbook.md", "falcon.md"])
async def test_a_viewer_session_of_someone_who_left_opens_nothing(
    signin_bot: Bot, document: str
) -> None:
    """The session cookie outlives its person's account (hours); the account is what counts."""
    bot = signin_bot
    doc = bot.kb.store.find_document(document)
    # Signed in while still employed; the cookie is valid for hours.
    use_session(bot, forge_session(bot, (DEPARTED, TEAM_ID)))
    bot.slack.set_user(DEPARTED, deleted=True)
    for path in (link(bot, doc), link(bot, doc, file=True)):
        resp = await bot.http.get(path, allow_redirects=False)
        assert resp.status == 403, (path, resp.status)
        page = await resp.text()
        assert "Project Falcon" not in page and "expense claims" not in page
    # A colleague still in the workspace opens the same links.
    use_session(bot, forge_session(bot, (USER_ID, TEAM_ID)))
    resp = await bot.http.get(link(bot, doc))
    assert resp.status == 200
