"""The MCP tools over a real engine: the verdicts, the answer path's outcomes, the scopes.

``bot.mcp.tools.Tools`` over the bundled sample corpus (real FAISS, BM25 and
embedding model) and the local OpenAI-compatible server: between the two
thresholds a search says "related only" and an ask shows possibly related
passages, both without a model call; a model that is down still gives the
passages; without Slack to ask, every token searches only the documents for
everyone, one with a channel scope too (nobody can say it is a member). And
the bot's app in process: ``/mcp`` only with ``KB_MCP=on``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from bot.access import Access, Profile
from bot.mcp import MAX_BODY_BYTES, Person
from bot.mcp.people import NotServed, scopes_of
from bot.mcp.tools import SEARCHED, Tools
from core.answer import Engine
from core.gate import related
from core.retrieve import LocalBackend, Mode
from index.knowledge_base import KnowledgeBase
from tests.conftest_bot import FALCON, FALCON_Q, IN_DOMAIN, BotFactory, make_settings, mcp_session
from tests.servers import CHANNEL_ID, DEFAULT_BOT_TOKEN, DEFAULT_SIGNING_SECRET, OpenAICompatServer

EngineFor = Callable[..., Engine]
# A question the sample corpus has related passages for (tests/test_related.py).
QUESTION = "How do I get reimbursed for a conference ticket?"
USER = "U0ALICE001"
EVERYONE_ONLY = Person(USER, None, "plain", None)
IN_CHANNEL = Person(USER, None, "scoped", frozenset({CHANNEL_ID}))


@pytest.fixture
def kb(sample_kb: KnowledgeBase) -> KnowledgeBase:
    return sample_kb


def _best_distance(kb: KnowledgeBase, question: str) -> float:
    vector = kb.embedder.encode_query(question)
    found = LocalBackend(kb.indexes).search(vector, question, None, 20, Mode.HYBRID)
    return min(c.distance for c in found)


def _between(best: float) -> dict[str, float]:
    """Thresholds that put a question whose best distance is ``best`` between them."""
    return {"threshold": round(best - 0.02, 4), "related_threshold": round(best + 0.03, 4)}


async def test_between_the_thresholds_a_search_says_related_only(
    kb: KnowledgeBase, engine_for: EngineFor, openai_server: OpenAICompatServer
) -> None:
    between = _between(_best_distance(kb, QUESTION))
    tools = Tools(engine_for(**between), None)
    found = await tools.search(EVERYONE_ONLY, QUESTION, 5)
    assert found.verdict == "related only" and "not an answer" in found.note
    engine = tools.engine
    scopes = await scopes_of(EVERYONE_ONLY, None, engine.kb)
    # The possibly related passages a Slack answer shows, in its order.
    selection = await asyncio.to_thread(engine.selector.select, QUESTION, scopes)
    near = related(selection.candidates, related_threshold=between["related_threshold"])
    assert len(found.passages) == len(near) > 0
    assert not any(p.passes_gate for p in found.passages)
    assert all(
        between["threshold"] < p.distance <= between["related_threshold"] for p in found.passages
    )
    assert openai_server.requests == []
    [row] = list(kb.store.db.query("SELECT outcome, surface, client FROM query_log"))
    assert (row["outcome"], row["surface"], row["client"]) == ("related", "mcp", "plain")


async def test_between_the_thresholds_an_ask_shows_related_passages_without_the_model(
    kb: KnowledgeBase, engine_for: EngineFor, openai_server: OpenAICompatServer
) -> None:
    tools = Tools(engine_for(**_between(_best_distance(kb, QUESTION))), None)
    answer = await tools.ask(EVERYONE_ONLY, QUESTION)
    assert answer.outcome == "related" and not answer.model_called and not answer.grounded
    assert answer.sources and all("#char=" in s.link for s in answer.sources)
    assert openai_server.requests == []


async def test_a_search_that_passes_the_gate_is_logged_as_searched(
    kb: KnowledgeBase, engine_for: EngineFor
) -> None:
    best = _best_distance(kb, QUESTION)
    tools = Tools(engine_for(threshold=best + 0.05, related_threshold=best + 0.1), None)
    found = await tools.search(EVERYONE_ONLY, QUESTION, 2)
    assert found.verdict == "answerable" and found.passages[0].passes_gate
    assert len(found.passages) <= 2
    [row] = list(kb.store.db.query("SELECT outcome, model_called FROM query_log"))
    assert (row["outcome"], row["model_called"]) == (SEARCHED, 0)


async def test_a_model_that_is_down_still_gives_the_passages(
    kb: KnowledgeBase, engine_for: EngineFor, openai_server: OpenAICompatServer
) -> None:
    best = _best_distance(kb, QUESTION)
    openai_server.fail_with(503)
    tools = Tools(engine_for(threshold=best + 0.05), None)
    answer = await tools.ask(EVERYONE_ONLY, QUESTION)
    assert answer.outcome == "model_unavailable" and not answer.grounded
    assert answer.sources and all(s.link for s in answer.sources)


async def test_without_slack_no_token_reaches_a_channel_not_even_one_scoped_to_it(
    kb: KnowledgeBase, engine_for: EngineFor
) -> None:
    # Nobody can say whether the person is in the channel: a scope alone grants nothing.
    kb.ingest_bytes(FALCON, "falcon.md", uploader="fixture", scope=CHANNEL_ID)
    tools = Tools(engine_for(threshold=0.6), None)
    for person in (EVERYONE_ONLY, IN_CHANNEL):
        found = await tools.search(person, FALCON_Q, 20)
        assert all(p.document != "Project Falcon" for p in found.passages)
    rows = list(kb.store.db.query("SELECT client, scopes FROM query_log ORDER BY id"))
    assert [(r["client"], json.loads(r["scopes"])) for r in rows] == [
        ("plain", []),
        ("scoped", []),
    ]


class _Nobody:
    """A directory in which every caller belongs to another workspace: an outsider's call."""

    async def home_team(self) -> str:
        return "T0HOME0001"

    async def profile(self, user_id: str) -> Profile:
        return Profile(team_id="T0ELSEWHERE")

    def forget(self, user_id: str) -> None:
        pass  # nothing remembered

    async def channel_members(self, channel: str) -> frozenset[str]:
        raise AssertionError("an outsider's channels are never asked for")

    async def guest_ids(self) -> frozenset[str]:
        raise AssertionError("an outsider's call asks for no guests")


async def test_a_person_the_workspace_does_not_serve_gets_nothing_logged(
    kb: KnowledgeBase, engine_for: EngineFor
) -> None:
    tools = Tools(engine_for(), Access(_Nobody(), allow_external=False))
    with pytest.raises(NotServed, match="KB_ALLOW_EXTERNAL"):
        await tools.search(IN_CHANNEL, QUESTION, 5)
    assert list(kb.store.db.query("SELECT id FROM query_log")) == []


# ------------------------------------------------------------------ KB_MCP off and on


async def test_with_mcp_off_there_is_no_endpoint(make_bot: BotFactory) -> None:
    bot = await make_bot()
    resp = await bot.http.post("/mcp", data=b"{}", headers={"Content-Type": "application/json"})
    assert resp.status == 404
    ready = await (await bot.http.get("/readyz")).json()
    assert ready["mcp"] is False


async def test_with_mcp_on_the_app_serves_it_beside_the_viewer(make_bot: BotFactory) -> None:
    bot = await make_bot(mcp=True)
    token, _ = bot.kb.store.mcp_tokens.issue("in-process", user_id=USER)
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}})
    resp = await bot.http.post("/mcp", data=body, headers=headers)
    assert resp.status == 200
    listed = await resp.json()
    assert listed["id"] == 7
    assert {t["name"] for t in listed["result"]["tools"]} == {
        "search_knowledge_base",
        "ask_knowledge_base",
    }
    assert (await bot.http.get("/readyz")).status == 200
    assert (await bot.http.post("/mcp", data=body)).status == 401


def test_kb_mcp_reads_on_and_slack_identity_needs_the_signing_secret_and_bot_token() -> None:
    assert make_settings(mcp="on").mcp is True and make_settings(mcp="off").mcp is False
    needs = "KB_MCP_SLACK_IDENTITY=on needs SLACK_SIGNING_SECRET, SLACK_BOT_TOKEN"
    with pytest.raises(ValueError, match=needs):
        make_settings(mcp="on", mcp_slack_identity="on")
    # Without the bot token nobody a signed call names could be looked up.
    with pytest.raises(ValueError, match="KB_MCP_SLACK_IDENTITY=on needs SLACK_BOT_TOKEN \\["):
        make_settings(mcp_slack_identity="on", slack_signing_secret=DEFAULT_SIGNING_SECRET)
    assert make_settings(
        mcp_slack_identity="on",
        slack_signing_secret=DEFAULT_SIGNING_SECRET,
        slack_bot_token=DEFAULT_BOT_TOKEN,
    ).mcp_slack_identity


# ------------------------------------------------------------------ the door, in process


def _door_headers(token: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }


async def test_a_token_that_expires_between_two_calls_is_refused_at_the_second(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(mcp=True)
    tokens = bot.kb.store.mcp_tokens
    token, _ = tokens.issue("day-pass", user_id=USER, expires_in_days=1)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
    assert (await bot.http.post("/mcp", data=body, headers=_door_headers(token))).status == 200
    issued_at = tokens.clock()
    tokens.clock = lambda: issued_at + 86400 + 1
    refused = await bot.http.post("/mcp", data=body, headers=_door_headers(token))
    assert refused.status == 401 and await refused.read() == b""


async def test_a_body_that_does_not_arrive_in_time_gets_408(make_bot: BotFactory) -> None:
    bot = await make_bot(mcp=True, http_body_timeout=0.5)
    token, _ = bot.kb.store.mcp_tokens.issue("slow", user_id=USER)
    reader, writer = await asyncio.open_connection("127.0.0.1", bot.http.port)
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in _door_headers(token).items())
        writer.write(
            f"POST /mcp HTTP/1.1\r\nHost: x\r\n{head}Content-Length: 1000\r\n\r\n".encode()
            + b'{"jsonrpc"'
        )
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout=20)
    finally:
        writer.close()
    assert status_line.startswith(b"HTTP/1.1 408")


async def test_without_slack_to_ask_a_slack_signed_person_is_not_served(
    kb: KnowledgeBase, engine_for: EngineFor
) -> None:
    # Slack signed for someone of some workspace; nothing can say it is this one.
    signed_for = Person(USER, "T0OTHER001", "slack", None)
    tools = Tools(engine_for(), None)
    with pytest.raises(NotServed, match="SLACK_BOT_TOKEN"):
        await tools.search(signed_for, QUESTION, 5)
    with pytest.raises(NotServed, match="SLACK_BOT_TOKEN"):
        await tools.ask(signed_for, QUESTION)
    assert list(kb.store.db.query("SELECT id FROM query_log")) == []


async def test_a_compressed_body_that_inflates_past_the_limit_gets_413(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(mcp=True)
    token, _ = bot.kb.store.mcp_tokens.issue("zipped", user_id=USER)
    padded = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}, "x": "0" * 2**22}
    bomb = gzip.compress(json.dumps(padded).encode())
    assert len(bomb) < MAX_BODY_BYTES  # small on the wire, four MiB once inflated
    headers = {**_door_headers(token), "Content-Encoding": "gzip"}
    refused = await bot.http.post("/mcp", data=bomb, headers=headers)
    assert refused.status == 413
    small = gzip.compress(json.dumps({**padded, "x": ""}).encode())
    assert (await bot.http.post("/mcp", data=small, headers=headers)).status == 200


UNKNOWN_ARGUMENTS: dict[str, tuple[str, dict[str, Any], list[str], str]] = {
    "a typo of limit": (
        "search_knowledge_base",
        {"query": IN_DOMAIN, "limits": 3},
        ["'limits'"],
        "query, limit",
    ),
    "the other tool's argument": (
        "ask_knowledge_base",
        {"question": IN_DOMAIN, "limit": 3},
        ["'limit'"],
        "question",
    ),
    "two unknown beside a bad value": (
        "search_knowledge_base",
        {"query": IN_DOMAIN, "top_k": 2, "filter": {"channel": "C1"}, "limit": 0},
        ["'filter'", "'top_k'"],
        "query, limit",
    ),
}
# A value no log line and no refusal may repeat.
SENT_VALUE = "unknown-argument-value-7f3a"


@pytest.mark.parametrize("name", list(UNKNOWN_ARGUMENTS))
async def test_an_unknown_argument_is_a_tool_error_naming_it_and_the_accepted_ones(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    tool, arguments, unknown, accepted = UNKNOWN_ARGUMENTS[name]
    arguments = {**arguments, "scope_hint": SENT_VALUE}
    bot = await make_bot(mcp=True)
    caplog.set_level(logging.DEBUG)
    async with mcp_session(bot, "unknown-arguments", USER) as session:
        result = await session.call_tool(tool, arguments)
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error, text
    assert f"{tool} does not take " in text
    assert all(u in text for u in [*unknown, "'scope_hint'"]), text
    assert f"its arguments are: {accepted}" in text
    # Nothing was searched or asked, and the value sent is in no refusal and no log line.
    assert list(bot.kb.store.db.query("SELECT id FROM query_log")) == []
    assert SENT_VALUE not in text
    # (The test's own client logs what it sends; the server's records are the product's.)
    served = [r for r in caplog.records if not r.name.startswith("mcp.client")]
    assert all(SENT_VALUE not in r.getMessage() for r in served)
    assert any("rejected arguments" in r.getMessage() for r in served)


async def test_the_advertised_schemas_forbid_other_arguments(make_bot: BotFactory) -> None:
    bot = await make_bot(mcp=True)
    async with mcp_session(bot, "schemas", USER) as session:
        listed = {t.name: t.input_schema for t in (await session.list_tools()).tools}
        # The declared arguments still work, the default limit too.
        limited = await session.call_tool("search_knowledge_base", {"query": IN_DOMAIN, "limit": 1})
    assert {name: s["additionalProperties"] for name, s in listed.items()} == {
        "search_knowledge_base": False,
        "ask_knowledge_base": False,
    }
    assert set(listed["search_knowledge_base"]["properties"]) == {"query", "limit"}
    assert not limited.is_error and len(limited.structured_content["passages"]) == 1  # type: ignore[index]
