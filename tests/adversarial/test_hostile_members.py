"""What members, people who left, external users and agents can reach, attacked from outside.

The people here hold what an ordinary member holds: a viewer session cookie, an
MCP token, the questions and titles they type, the buttons they click. Each
attack is sent to the real app over HTTP (signed as Slack signs, where Slack is
the sender) and must end with nothing leaked, nothing lost and no server error.
"""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

from bot.server.routes import UNREADABLE

pytest.register_assert_rewrite("tests.conftest_bot", "tests.signin")

from tests.conftest_bot import IN_DOMAIN, Bot, BotFactory, everything_posted  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    TEAM_ID,
    USER_ID,
    MockSlackAPI,
    message_im_event,
)
from tests.signin import SIGN_IN, forge_session, link, use_session  # noqa: E402
from tests.slack_workspace import company_workspace  # noqa: E402

DEPARTED = "U0LEFT0001"
AGENT_USER = "U0AGENT001"
# An emoji (U+1F642) whose second half a client cut off, as JSON escapes it.
HALF_AN_EMOJI = "\\ud83d"
_TOKENS = itertools.count(1)


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


def _call_body(tool: str, arguments: dict[str, str]) -> bytes:
    """A ``tools/call`` written by hand, so that its JSON escapes are the caller's own."""
    args = ", ".join(f'"{k}": "{v}"' for k, v in arguments.items())
    return (
        '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", '
        f'"params": {{"name": "{tool}", "arguments": {{{args}}}}}}}'
    ).encode()


async def _post_mcp(bot: Bot, body: bytes) -> tuple[int, Any]:
    """POST ``body`` to ``/mcp`` with a token of :data:`AGENT_USER`'s; the status and JSON answer."""
    token, _ = bot.kb.store.mcp_tokens.issue(f"agent-{next(_TOKENS)}", user_id=AGENT_USER)
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    resp = await bot.http.post("/mcp", data=body, headers=headers)
    return resp.status, await resp.json()


async def _tool_call(bot: Bot, tool: str, arguments: dict[str, str]) -> Any:
    """Call ``tool`` on ``/mcp`` as an agent would; its result."""
    status, answer = await _post_mcp(bot, _call_body(tool, arguments))
    assert status == 200, answer
    return answer["result"]


@pytest.mark.parametrize(
    ("tool", "argument"), [("search_knowledge_base", "query"), ("ask_knowledge_base", "question")]
)
async def test_an_agent_relaying_half_an_emoji_is_answered_as_slack_answers_it(
    make_bot: BotFactory, tool: str, argument: str
) -> None:
    """Slack's clients cut messages mid-emoji, and an agent relays the question as it got it."""
    bot = await make_bot(mcp=True)
    result = await _tool_call(bot, tool, {argument: f"{IN_DOMAIN} {HALF_AN_EMOJI}"})
    assert not result.get("isError"), result
    assert "/d/" in json.dumps(result["structuredContent"])  # passages, with their links
    [logged] = list(bot.kb.store.db.query("SELECT question, surface FROM query_log"))
    assert logged == {"question": f"{IN_DOMAIN} \ufffd", "surface": "mcp"}


async def test_an_emoji_escaped_whole_is_kept(make_bot: BotFactory) -> None:
    bot = await make_bot(mcp=True)
    result = await _tool_call(
        bot, "search_knowledge_base", {"query": f"{IN_DOMAIN} \\ud83e\\uddfe"}
    )
    assert not result.get("isError"), result
    [logged] = list(bot.kb.store.db.query("SELECT question FROM query_log"))
    assert logged["question"] == f"{IN_DOMAIN} \U0001f9fe"


async def test_readiness_tells_an_outsider_a_source_fails_never_why(bot: Bot) -> None:
    """/readyz answers anyone who reaches the server (a load balancer's probe needs no token)."""
    source = "hr-wiki"
    # What the Confluence reader records when a restricted page's attachment is cut off.
    reason = "Confluence cut off the download of layoffs-2027-shortlist.xlsx."
    bot.kb.store.sources.add(source, "confluence", {"url": "https://wiki.example"})
    bot.kb.store.sources.record_run(source, reason)
    resp = await bot.http.get("/readyz")
    assert resp.status == 200
    ready = await resp.json()
    assert [(s["name"], s["ok"]) for s in ready["sources"]] == [(source, False)]
    assert "layoffs" not in json.dumps(ready)
    # The admins still read why, where only they look (kb status reads it from here).
    assert bot.kb.store.sources.get(source).last_error == reason


async def test_readiness_tells_an_outsider_the_store_is_unreadable_never_where_it_is(
    make_bot: BotFactory,
    postgres_server: Any,
    postgres_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store stops taking connections: /readyz says the knowledge base cannot be read,
    not the database's host, port, name or user, which the server's log keeps."""
    bot = await make_bot(database_url=postgres_url, documents=False)
    before = await (await bot.http.get("/readyz")).json()
    assert before["checks"]["knowledge_base"] is True
    name = urlsplit(postgres_url).path.lstrip("/")
    with psycopg.connect(postgres_server.get_uri(), autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name]
        )
    resp = await bot.http.get("/readyz")
    body = await resp.json()
    assert resp.status == 503 and body["checks"]["knowledge_base"] is False
    assert body["error"] == UNREADABLE
    told = json.dumps(body)
    where = urlsplit(postgres_url)
    host = where.hostname or parse_qs(where.query)["host"][0]  # a socket's directory
    assert name not in told and host not in told and "KB_DATABASE_URL" not in told
    assert name in caplog.text  # the operator's log says which database


@pytest.mark.parametrize("escape", ["", HALF_AN_EMOJI])
async def test_a_call_nested_deeper_than_any_parser_goes_is_a_parse_error_not_a_crash(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture, escape: str
) -> None:
    """Within the 64 KiB a body may have: 20,000 arrays inside one another, with or without
    half an emoji to make the endpoint read the body itself."""
    bot = await make_bot(mcp=True)
    caplog.set_level(logging.INFO)
    depth = 20_000
    nested = "[" * depth + f'"{escape}"' + "]" * depth
    body = _call_body("search_knowledge_base", {"query": "expenses"}).replace(
        b'"query"', b'"deep": ' + nested.encode() + b', "query"'
    )
    assert len(body) < 64 * 1024
    status, answer = await _post_mcp(bot, body)
    assert status == 400 and answer["error"]["code"] == -32700, answer
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    # The endpoint goes on answering.
    assert "/d/" in json.dumps(await _tool_call(bot, "search_knowledge_base", {"query": IN_DOMAIN}))


async def test_a_guest_is_never_shown_public_channels_the_bots_own_search_finds(
    make_bot: BotFactory, slack: MockSlackAPI
) -> None:
    """Without the event's action_token Slack is searched with the bot's token: public
    channels, which a guest of the workspace does not read."""
    workspace = company_workspace()
    slack.workspace = workspace
    bot = await make_bot(slack_search=True)
    guest = "U0GUEST001"
    bot.slack.set_user(guest).update(is_restricted=True, is_ultra_restricted=True)
    question = "Is there a production deploy freeze over the holidays?"
    await bot.event(message_im_event(question, user=guest))
    await bot.answer()
    await bot.idle()
    shown = everything_posted(bot.slack) + json.dumps(bot.llm.requests)
    assert "20 December" not in shown
    assert bot.slack.calls("assistant.search.context") == []
    # A member asking the same way is searched there, and told it was public channels only.
    await bot.event(message_im_event(question, user=USER_ID))
    await bot.answer(2)
    [call] = bot.slack.calls("assistant.search.context")
    assert call["channel_types"] == "public_channel"
