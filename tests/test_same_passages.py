"""One question, the same passages in the same order on every surface.

The bot's app in process, on the fixture documents and the sample ones: each
question is asked in Slack (a signed ``app_mention`` through the real bolt
app), through the MCP endpoint of the same app by the official MCP client
(``search_knowledge_base`` and ``ask_knowledge_base``), with ``kb ask --json``
(click's runner, its own process state on the same data dir) and through
``kb eval``'s kept passages (``evaluation.kept.kept_selection``). What each
surface gives or shows (the passages an answer is written from, then any
beside it; or the possibly related ones) must be the same chunks in the same
order. The questions include ones whose answer order differs from the fused
order, one between the thresholds, one nothing is close to, and questions
typed in full-width letters or with zero-width characters, which are searched
in their plain form.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from click.testing import CliRunner
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from bot.cli import main
from core.selection import PassageSelector, retrieval_query
from evaluation.kept import kept_selection
from index.knowledge_base import KnowledgeBase
from index.normal_form import plain
from tests.conftest import SAMPLE
from tests.conftest_bot import IN_DOMAIN, OUT_OF_DOMAIN, PAGER, THRESHOLD, Bot, BotFactory
from tests.servers import CHANNEL_ID, app_mention_event

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


async def _bot(make_bot: BotFactory) -> Bot:
    bot = await make_bot(mcp=True, related_threshold=RELATED_THRESHOLD)
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


async def _slack(bot: Bot, question: str, count: int) -> list[int]:
    await bot.event(app_mention_event(question, user=ASKER))
    await bot.answer(count)  # logged before it is shown
    return _logged(bot.kb, "slack", question)


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
    async with _mcp(bot) as session:
        for i, question in enumerate(QUESTIONS, start=1):
            slack = await _slack(bot, question, i)
            surfaces = {
                "mcp search": await _mcp_search(bot, session, question),
                "mcp ask": await _mcp_ask(bot, session, question),
                "kb ask": await _kb_ask(bot, question),
                "kb eval": _evaluated(bot, question),
            }
            for surface, passages in surfaces.items():
                assert passages == slack, (surface, question)
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
