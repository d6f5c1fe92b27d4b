"""The embeddings endpoint down while the bot runs: it starts, and an asker is told why it cannot search.

The documents were indexed through the endpoint while it was up; then it goes
away. The bot runs as in production (real bolt app, signed requests, the mock
Slack Web API), with the knowledge base built from its own settings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient

from bot.app import create_app
from bot.settings import Settings
from bot.slack import messages
from index.knowledge_base import KnowledgeBase

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import Bot, EndpointBot  # noqa: E402
from tests.servers import (  # noqa: E402
    DM_CHANNEL_ID,
    MockSlackAPI,
    OpenAICompatServer,
    closed_port_url,
    message_im_event,
)

MODEL = "openai:test-embed"


async def test_a_question_while_the_embeddings_endpoint_is_down_says_so(
    tmp_path: Path,
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    settings_for: Callable[..., Settings],
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
) -> None:
    settings = settings_for(
        data_dir=tmp_path / "kb",
        embedding_model=MODEL,
        embedding_base_url=closed_port_url(),
        embedding_max_retries=0,
    )
    up = settings.index_config()
    up = replace(up, embedding_endpoint=replace(up.embedding_endpoint, base_url=llm.url))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bikes.md").write_text("# Bicycles\n\nBicycle storage is in the basement.\n")
    indexed = await asyncio.to_thread(KnowledgeBase, up)
    await asyncio.to_thread(indexed.ingest_paths, [docs])
    indexed.store.db.conn.close()

    # The endpoint is gone: the bot still starts from the documents' stamps.
    app = create_app(settings, kb=await asyncio.to_thread(KnowledgeBase, settings.index_config()))
    bot = Bot(await aiohttp_client(app), app, slack, llm, settings, frozenset(asyncio.all_tasks()))
    await bot.event(message_im_event("Where can I leave my bicycle?"))
    await bot.idle()

    told = [
        c["text"]
        for c in slack.calls("chat.postMessage") + slack.calls("chat.update")
        if c.get("channel") == DM_CHANNEL_ID
    ]
    assert messages.ERROR_SEARCH_UNAVAILABLE in told, told
    assert llm.requests == []  # nothing to ground an answer on, so no model call


async def test_a_question_while_the_embeddings_endpoint_trickles_is_told_within_the_limit(
    on_the_endpoint: EndpointBot, slack: MockSlackAPI, llm: OpenAICompatServer
) -> None:
    bot = await on_the_endpoint(embedding_timeout=1.0, embedding_max_retries=0)

    # The endpoint answers at once and then sends its reply a byte every 0.2 s: no
    # read ever times out, and the question's vector would take minutes to arrive.
    llm.trickle_embeddings(0.2)
    await bot.event(message_im_event("Where can I leave my bicycle?"))
    await bot.idle(timeout=10.0)
    llm.reset()

    told = [
        c["text"]
        for c in slack.calls("chat.postMessage") + slack.calls("chat.update")
        if c.get("channel") == DM_CHANNEL_ID
    ]
    assert messages.ERROR_SEARCH_UNAVAILABLE in told, told
    assert llm.requests == []
