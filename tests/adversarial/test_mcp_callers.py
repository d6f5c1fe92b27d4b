"""Attacks by MCP callers reaching past their rights: a token's scope, the rate limit, a replay.

The bot's real app in process (``make_bot(mcp=True)``), called over HTTP with
bearer tokens issued in its store and with requests signed the way Slack signs
them; who is in which channel is the mock Slack Web API's answer to
``conversations.members``. Each test is an attack that worked before its fix:

* a token issued with ``--scope C...`` for someone who is not in that channel
  read the channel's documents (the scope widened instead of narrowing);
* one person holding several tokens (and Slack's signed identity) got the rate
  limit once per token;
* a Slack-signed call replayed within its five-minute window was answered again,
  by the replica that saw it and by any other.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import FALCON_Q, Bot, BotFactory  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DEFAULT_SIGNING_SECRET,
    TEAM_ID,
    sign_slack_request,
)

MEMBER = "U0MEMBER01"  # in CHANNEL_ID, where the Project Falcon document is
NOT_MEMBER = "U0NOTMEM01"
OTHER_CHANNEL = "C0OTHER001"
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
_ids = itertools.count(1)


def _tool_call(name: str, slack_person: str | None = None, **arguments: Any) -> bytes:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if slack_person is not None:
        params["_meta"] = {"slack": {"user_id": slack_person, "team_id": TEAM_ID}}
    message = {"jsonrpc": "2.0", "id": next(_ids), "method": "tools/call", "params": params}
    return json.dumps(message).encode()


async def _with_token(bot: Bot, token: str, body: bytes) -> tuple[int, dict[str, Any]]:
    resp = await bot.http.post(
        "/mcp", data=body, headers={**HEADERS, "Authorization": f"Bearer {token}"}
    )
    return resp.status, await resp.json() if resp.status != 401 else {}


async def _signed(bot: Bot, body: bytes, signature: dict[str, str]) -> tuple[int, bytes]:
    resp = await bot.http.post("/mcp", data=body, headers={**HEADERS, **signature})
    return resp.status, await resp.read()


async def _documents_found(bot: Bot, token: str) -> set[str]:
    status, answer = await _with_token(
        bot, token, _tool_call("search_knowledge_base", query=FALCON_Q, limit=20)
    )
    assert status == 200 and not answer["result"]["isError"], answer
    return {p["document"] for p in answer["result"]["structuredContent"]["passages"]}


# ------------------------------------------------------------------ a token's scope


async def test_a_scope_never_grants_a_channel_its_person_is_not_in(make_bot: BotFactory) -> None:
    bot = await make_bot(mcp=True)
    bot.slack.set_members(CHANNEL_ID, [MEMBER])
    tokens = bot.kb.store.mcp_tokens
    widened, _ = tokens.issue("scoped-outsider", user_id=NOT_MEMBER, scopes=(CHANNEL_ID,))
    member, _ = tokens.issue("scoped-member", user_id=MEMBER, scopes=(CHANNEL_ID,))
    elsewhere, _ = tokens.issue("member-elsewhere", user_id=MEMBER, scopes=(OTHER_CHANNEL,))

    found = await _documents_found(bot, widened)
    assert "Project Falcon" not in found
    asked = [p.get("channel") for m, p in bot.slack.log if m == "conversations.members"]
    assert CHANNEL_ID in asked, "membership was asked of Slack, not read off the token"
    # A member's token scoped to the channel reads it; scoped elsewhere, the scope narrows.
    assert "Project Falcon" in await _documents_found(bot, member)
    assert "Project Falcon" not in await _documents_found(bot, elsewhere)
    rows = bot.kb.store.db.query(
        "SELECT client, scopes FROM query_log WHERE surface = ? ORDER BY id", ["mcp"]
    )
    scopes = {r["client"]: json.loads(r["scopes"]) for r in rows}
    assert CHANNEL_ID not in scopes["scoped-outsider"]
    assert CHANNEL_ID in scopes["scoped-member"]
    assert CHANNEL_ID not in scopes["member-elsewhere"]


# ------------------------------------------------------------------ the rate limit


async def test_one_person_gets_the_limit_once_whatever_tokens_or_auth_they_use(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    limit = 3
    bot = await make_bot(mcp=True, mcp_slack_identity=True, mcp_calls_per_minute=limit)
    bot.slack.set_members(CHANNEL_ID, [MEMBER])
    tokens = bot.kb.store.mcp_tokens
    first, _ = tokens.issue("laptop", user_id=MEMBER)
    second, _ = tokens.issue("phone", user_id=MEMBER)
    someone_else, _ = tokens.issue("colleague", user_id=NOT_MEMBER)
    listed = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})

    for _ in range(limit):
        assert (await _with_token(bot, first, listed.encode()))[0] == 200
    with caplog.at_level(logging.INFO, logger="bot.mcp.server"):
        status, answer = await _with_token(bot, second, listed.encode())
    assert status == 429, "a second token of the same person is the same person"
    assert f"at most {limit} a minute for this person" in answer["error"]["message"]
    assert any(MEMBER in r.getMessage() for r in caplog.records if "rate limit" in r.getMessage())
    # Slack's signed identity of the same person counts against the same limit.
    body = _tool_call("search_knowledge_base", slack_person=MEMBER, query=FALCON_Q)
    status, _ = await _signed(bot, body, sign_slack_request(DEFAULT_SIGNING_SECRET, body))
    assert status == 429
    # Another person is not held up by this one's calls.
    assert (await _with_token(bot, someone_else, listed.encode()))[0] == 200


# ------------------------------------------------------------------ replayed Slack signatures


@pytest.fixture
async def replicas(make_bot: BotFactory, database_url: str, tmp_path: Path) -> tuple[Bot, Bot]:
    """Two apps on one store: one SQLite data dir, or one Postgres database with a data dir each."""
    settings: dict[str, Any] = {"mcp": True, "mcp_slack_identity": True}
    if not database_url:
        return await make_bot(**settings), await make_bot(**settings)
    shared = {**settings, "database_url": database_url, "documents": False}
    return (
        await make_bot(data_dir=tmp_path / "replica-a", **shared),
        await make_bot(data_dir=tmp_path / "replica-b", **shared),
    )


async def test_a_replayed_slack_signed_call_is_refused_by_every_replica(
    replicas: tuple[Bot, Bot], caplog: pytest.LogCaptureFixture
) -> None:
    first, second = replicas
    first.slack.set_members(CHANNEL_ID, [MEMBER])
    body = _tool_call("search_knowledge_base", slack_person=MEMBER, query=FALCON_Q)
    signature = sign_slack_request(DEFAULT_SIGNING_SECRET, body)
    status, answered = await _signed(first, body, signature)
    assert status == 200 and "result" in json.loads(answered)

    with caplog.at_level(logging.WARNING, logger="bot.mcp.server"):
        for replica in (first, second, first):
            status, refused = await _signed(replica, body, signature)
            assert status == 401, "the captured request, sent again within its window"
            assert "each signature is accepted once" in json.loads(refused)["error"]["message"]
    replays = [r for r in caplog.records if "replayed Slack-signed MCP request" in r.getMessage()]
    assert len(replays) == 3
    # The same call, signed anew by Slack, is a new request: served.
    again = _tool_call("search_knowledge_base", slack_person=MEMBER, query=FALCON_Q)
    status, _ = await _signed(second, again, sign_slack_request(DEFAULT_SIGNING_SECRET, again))
    assert status == 200
    logged = first.kb.store.db.query(
        "SELECT COUNT(*) AS n FROM query_log WHERE client = 'slack' AND question = ?", [FALCON_Q]
    )
    assert next(iter(logged))["n"] == 2, "the replays reached no tool"


async def test_a_signature_is_remembered_until_its_window_is_over(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(mcp=True, mcp_slack_identity=True)
    used = bot.kb.store.used_states
    listed = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {}}).encode()
    signature = sign_slack_request(DEFAULT_SIGNING_SECRET, listed)
    signed_at = used.clock()
    assert (await _signed(bot, listed, signature))[0] == 200
    # Four minutes on (still inside Slack's window): refused; every used value is kept for
    # as long as a signature stamped up to five minutes ahead stays valid.
    used.clock = lambda: signed_at + 240
    assert (await _signed(bot, listed, signature))[0] == 401
    [(kept_until,)] = used.db.execute("SELECT expires_at FROM used_states").fetchall()
    assert kept_until >= signed_at + 2 * 300
