"""One question, the same passages in the same order on every surface.

The bot's app in process, on the fixture documents and the sample ones: each
question is asked in Slack (a signed ``app_mention`` through the real bolt
app), through the MCP endpoint of the same app by the official MCP client
(``search_knowledge_base`` and ``ask_knowledge_base``), with ``kb ask --json``
(click's runner, its own process state on the same data dir) and through
``kb eval``'s kept passages (``evaluation.kept.kept_selection``). What each
surface gives or shows (the passages an answer is written from, then any
beside it; or the possibly related ones) must be the same chunks in the same
order. Slackbot is also shown Block Kit beside the text: for an answer, the
very blocks the bot posted in Slack (its buttons aside), for a search the same
passages numbered ``[1]``, ``[2]``... with the same links. The questions include ones whose answer order differs from the fused
order, one between the thresholds, one nothing is close to, and questions
typed in full-width letters or with zero-width characters, which are searched
in their plain form.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import re
from collections.abc import AsyncIterator, Generator
from typing import Any, cast

import httpx2
from click.testing import CliRunner
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, RequestParamsMeta

from bot.cli import main
from core.selection import PassageSelector, retrieval_query
from evaluation.kept import kept_selection
from index.knowledge_base import KnowledgeBase
from index.normal_form import plain, same_text
from tests.conftest import SAMPLE
from tests.conftest_bot import IN_DOMAIN, OUT_OF_DOMAIN, PAGER, THRESHOLD, Bot, BotFactory
from tests.servers import (
    CHANNEL_ID,
    DEFAULT_SIGNING_SECRET,
    TEAM_ID,
    app_mention_event,
    sign_slack_request,
)

ASKER = "U0SAMEPASS"
RELATED_THRESHOLD = 0.75
CONFERENCE = "How do I get reimbursed for a conference ticket?"
PAID = "When are expense claims paid?"
VPN = "How do I connect to the VPN?"


def full_width(text: str) -> str:
    """``text`` in full-width forms, as an East Asian keyboard types Latin letters."""
    return "".join(
        chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else "\u3000" if c == " " else c for c in text
    )


def zero_width(text: str) -> str:
    """``text`` with a zero-width character of each kind inside its words."""
    marks = "\u200b\u200c\u200d\u2060\ufeff"
    words = text.split(" ")
    return " ".join(w[:2] + marks[i % len(marks)] + w[2:] for i, w in enumerate(words))


QUESTIONS = (
    IN_DOMAIN,  # the answer order puts another passage first than the fused order
    CONFERENCE,
    PAID,
    PAGER,
    VPN,
    OUT_OF_DOMAIN,
    full_width(IN_DOMAIN),
    zero_width(VPN),
)
_LINK = re.compile(r"/d/(\d+)\?[^#]*#char=(\d+),(\d+)$")
# A citation in mrkdwn: ``<url|[n]>``.
_CITATION = re.compile(r"<([^|<>]+)\|\[(\d+)\]>")
# What Slackbot sends of the asking person with each call (Slack identity auth).
AS_ASKER = cast(RequestParamsMeta, {"slack": {"user_id": ASKER, "team_id": TEAM_ID}})
# Blocks only the bot's own messages carry: buttons whose clicks reach its listeners.
_BUTTONS = {"context_actions", "actions"}


async def _bot(make_bot: BotFactory) -> Bot:
    bot = await make_bot(mcp=True, mcp_slack_identity=True, related_threshold=RELATED_THRESHOLD)
    assert bot.kb.ingest_paths([SAMPLE]).chunks > 0
    bot.slack.set_members(CHANNEL_ID, [ASKER])
    return bot


@contextlib.asynccontextmanager
async def _mcp(bot: Bot) -> AsyncIterator[ClientSession]:
    token, _ = bot.kb.store.mcp_tokens.issue("same-passages", user_id=ASKER)
    url = str(bot.http.make_url("/mcp"))
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


class SlackSigned(httpx2.Auth):
    """Signs each request as Slack signs Slackbot's MCP calls: HMAC of its exact body."""

    requires_request_body = True

    def __init__(self, secret: str = DEFAULT_SIGNING_SECRET) -> None:
        self.secret = secret

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response]:
        request.headers.update(sign_slack_request(self.secret, request.content))
        yield request


@contextlib.asynccontextmanager
async def slackbot(bot: Bot, secret: str = DEFAULT_SIGNING_SECRET) -> AsyncIterator[ClientSession]:
    """The official MCP client calling the bot's endpoint as Slackbot does."""
    url = str(bot.http.make_url("/mcp"))
    async with (
        httpx2.AsyncClient(auth=SlackSigned(secret), timeout=60) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def blocks_of(result: CallToolResult) -> list[dict[str, Any]]:
    """The Block Kit a tool result carries for Slackbot (``_meta.slack.blocks``)."""
    assert result.meta is not None, result
    blocks: list[dict[str, Any]] = result.meta["slack"]["blocks"]
    return blocks


def mrkdwn_of(blocks: list[dict[str, Any]]) -> str:
    """Every mrkdwn text of ``blocks``, in order (sections, then context elements)."""
    texts = []
    for block in blocks:
        if "text" in block:
            texts.append(block["text"]["text"])
        texts += [e["text"] for e in block.get("elements", []) if "text" in e]
    return "\n".join(texts)


def cited_links(blocks: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Each ``<url|[n]>`` citation of ``blocks``, in order: its number and its (unescaped) URL."""
    return [(int(n), html.unescape(url)) for url, n in _CITATION.findall(mrkdwn_of(blocks))]


def _unsigned(blocks: list[dict[str, Any]]) -> str:
    """``blocks`` as JSON with each link's token left out: signed a second apart, two
    links into one passage differ only by it."""
    return re.sub(r"\?t=[^#|\"]*", "", json.dumps(blocks))


def _logged(kb: KnowledgeBase, surface: str, question: str) -> list[int]:
    """What the last question asked on ``surface`` was given and shown, by the query log."""
    [asked] = kb.store.queries.latest(1, surface=surface)
    assert plain(asked.record.question) == plain(question)  # Slack folds its spaces
    return [cid for cid, _ in asked.record.kept] + [cid for cid, _ in asked.record.beside]


def _chunk_of(kb: KnowledgeBase, link: str) -> int:
    """The chunk a passage link opens (its document and ``#char`` range)."""
    found = _LINK.search(link)
    assert found is not None, link
    document, start, end = (int(g) for g in found.groups())
    [row] = kb.store.db.query(
        'SELECT id FROM chunks WHERE document_id = ? AND start = ? AND "end" = ?',
        [document, start, end],
    )
    return int(row["id"])


async def _slack(bot: Bot, question: str, count: int) -> tuple[list[int], list[dict[str, Any]]]:
    """What the bot's answer in Slack was given and shown, and the blocks it posted."""
    await bot.event(app_mention_event(question, user=ASKER))
    shown = await bot.answer(count)  # logged before it is shown
    posted = [b for b in shown["blocks"] if b["type"] not in _BUTTONS]
    return _logged(bot.kb, "slack", question), posted


async def _slackbot_search(bot: Bot, session: ClientSession, question: str) -> list[int]:
    result = await session.call_tool(
        "search_knowledge_base", {"query": question, "limit": 20}, meta=AS_ASKER
    )
    assert not result.is_error, result.content
    passages = result.structured_content["passages"]  # type: ignore[index]
    links = cited_links(blocks_of(result))
    # The blocks number the passages as the text does, each linked where its passage is.
    assert [n for n, _ in links] == list(range(1, len(passages) + 1))
    assert [url for _, url in links] == [p["link"] for p in passages]
    for n, p in enumerate(passages, start=1):
        assert f"[{n}] " in result.content[0].text and p["link"] in result.content[0].text  # type: ignore[union-attr]
    return [_chunk_of(bot.kb, url) for _, url in links]


async def _slackbot_ask(
    bot: Bot, session: ClientSession, question: str
) -> tuple[list[int], list[dict[str, Any]]]:
    result = await session.call_tool("ask_knowledge_base", {"question": question}, meta=AS_ASKER)
    assert not result.is_error, result.content
    blocks = blocks_of(result)
    # Its sources' links are the ones its text gives.
    for _, url in cited_links(blocks):
        assert url in result.content[0].text  # type: ignore[union-attr]
    return _logged(bot.kb, "mcp", question), blocks


async def _mcp_search(bot: Bot, session: ClientSession, question: str) -> list[int]:
    result = await session.call_tool("search_knowledge_base", {"query": question, "limit": 20})
    assert not result.is_error, result.content
    passages = result.structured_content["passages"]  # type: ignore[index]
    return [_chunk_of(bot.kb, p["link"]) for p in passages]


async def _mcp_ask(bot: Bot, session: ClientSession, question: str) -> list[int]:
    result = await session.call_tool("ask_knowledge_base", {"question": question})
    assert not result.is_error, result.content
    return _logged(bot.kb, "mcp", question)


async def _kb_ask(bot: Bot, question: str) -> list[int]:
    args = ["--data-dir", str(bot.settings.data_dir), "ask", question, "--scope", CHANNEL_ID]
    # The bot's gate; in a thread: the model server answers from this test's event loop.
    env = {"KB_THRESHOLD": str(THRESHOLD), "KB_RELATED_THRESHOLD": str(RELATED_THRESHOLD)}
    result = await asyncio.to_thread(CliRunner(env=env).invoke, main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    answer: dict[str, Any] = json.loads(result.stdout)
    given = answer["kept"] or answer["sources"]
    return [s["chunk_id"] for s in given] + [s["chunk_id"] for s in answer["beside"]]


def _evaluated(bot: Bot, question: str) -> list[int]:
    selector = PassageSelector(bot.kb, bot.services.engine.config)
    query = retrieval_query(question)
    selection = kept_selection(
        selector, query, bot.kb.embedder.encode_query(query), threshold=THRESHOLD
    )
    return [c.chunk_id for c in selection.shown]


async def test_every_surface_gives_one_question_the_same_passages_in_the_same_order(
    make_bot: BotFactory,
) -> None:
    bot = await _bot(make_bot)
    seen: dict[str, list[int]] = {}
    async with _mcp(bot) as session, slackbot(bot) as as_slackbot:
        for i, question in enumerate(QUESTIONS, start=1):
            slack, posted = await _slack(bot, question, i)
            asked, shown = await _slackbot_ask(bot, as_slackbot, question)
            surfaces = {
                "mcp search": await _mcp_search(bot, session, question),
                "mcp ask": await _mcp_ask(bot, session, question),
                "slackbot search": await _slackbot_search(bot, as_slackbot, question),
                "slackbot ask": asked,
                "kb ask": await _kb_ask(bot, question),
                "kb eval": _evaluated(bot, question),
            }
            for surface, passages in surfaces.items():
                assert passages == slack, (surface, question)
            # Slackbot is shown what the bot posted: the same blocks, citations and links.
            assert _unsigned(shown) == _unsigned(posted), question
            seen[question] = slack
    # The comparison is between real lists: answers written from passages only
    # the related threshold let in, a question nothing is close to, and the odd
    # spellings answered as plain.
    assert seen[OUT_OF_DOMAIN] == []
    assert all(seen[q] for q in QUESTIONS if q != OUT_OF_DOMAIN)
    assert seen[full_width(IN_DOMAIN)] == seen[IN_DOMAIN]
    assert seen[zero_width(VPN)] == seen[VPN]
    logged = bot.kb.store.queries.latest(len(QUESTIONS), surface="slack")
    assert any(d > THRESHOLD for q in logged for _, d in q.record.kept)


async def test_copies_of_one_document_are_one_passage_on_every_surface(
    make_bot: BotFactory,
) -> None:
    """The expenses page uploaded again, re-saved (other line ends and wrapping) and in the
    asker's channel: each surface gives and shows its passages once, the same on each, and
    Slack's citations point at different words."""
    bot = await _bot(make_bot)
    page = (SAMPLE / "expenses.md").read_bytes()
    resaved = page.replace(b"within 30 days", b"within\n30 days").replace(b"\n", b"\r\n")
    for name, data, scope in (
        ("expenses (1).md", resaved, "*"),
        ("expenses-finance.md", page + b"\n", CHANNEL_ID),
    ):
        assert bot.kb.ingest_bytes(data, name, scope=scope).document.state == "indexed"
    async with _mcp(bot) as session:
        for i, question in enumerate((IN_DOMAIN, CONFERENCE, PAID), start=1):
            slack, posted = await _slack(bot, question, i)
            rows = bot.kb.chunks_by_id(slack)
            words = [same_text(rows[cid].content) for cid in slack]
            assert len(words) == len(set(words)) > 1, question
            for surface, passages in {
                "mcp search": await _mcp_search(bot, session, question),
                "mcp ask": await _mcp_ask(bot, session, question),
                "kb ask": await _kb_ask(bot, question),
                "kb eval": _evaluated(bot, question),
            }.items():
                assert passages == slack, (surface, question)
            cited = [_chunk_of(bot.kb, url) for _, url in cited_links(posted)]
            assert len({same_text(rows[cid].content) for cid in cited}) == len(set(cited))
