"""`/kb-reindex` moves a knowledge base kept on the earlier default model to the configured one.

The bot is real (bolt, signed requests, the mock Slack Web API) on the fixture
documents, embedded by all-MiniLM-L6-v2 and started with the default model, so
it keeps MiniLM (``index.kept_model``). An admin's ``/kb-reindex`` embeds every
document with the multilingual preset while questions are answered on MiniLM,
then switches the running bot to the preset: ``/readyz``, the Home tab and a
restart no longer speak of the earlier model. The search gate the switch
closes (``core.searches``) is checked on its own at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.slack import messages
from core.searches import SearchGate
from core.thresholds import BUNDLED, MINILM
from index.config import DEFAULT_EMBEDDING_MODEL, IndexConfig
from index.embed import MULTILINGUAL_MODEL_NAME
from index.knowledge_base import KnowledgeBase, ReindexReport
from index.records import DocumentRow
from tests.servers import (
    CHANNEL_ID,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    slash_command_body,
)

pytest.register_assert_rewrite("tests.conftest_bot", "tests.home_tab")

from tests.conftest_bot import ADMIN_ID, IN_DOMAIN, Bot  # noqa: E402
from tests.home_tab import open_home  # noqa: E402

KEPT = "built on all-MiniLM-L6-v2"
MOVED = "moved from all-MiniLM-L6-v2 to multilingual, the default model"

Switch = Callable[[], AbstractContextManager[object]]


@pytest.fixture
async def kept_bot(
    aiohttp_client: Any,
    settings_for: Any,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    fixture_data_dir: Path,
    index_dir: Path,
) -> Bot:
    """The bot on the fixture documents (MiniLM's vectors), started with the default model."""
    from bot.app import create_app

    shutil.copytree(fixture_data_dir, index_dir, dirs_exist_ok=True)
    # No KB_THRESHOLD: each model's own shipped thresholds (core.thresholds) are in force.
    settings = settings_for(
        embedding_model=DEFAULT_EMBEDDING_MODEL, admin_users=ADMIN_ID, threshold=None
    )
    app = create_app(settings)
    bot = Bot(await aiohttp_client(app), app, slack, llm, settings, frozenset(asyncio.all_tasks()))
    bot.services.home.gaps.wait_seconds = 15.0
    return bot


async def _readyz(bot: Bot) -> dict[str, Any]:
    resp = await bot.http.get("/readyz")
    assert resp.status == 200
    return dict(await resp.json())


async def _final_report(bot: Bot) -> str:
    for _ in range(1200):
        texts = [p["text"] for p in bot.slack.responses("r1")]
        if any("Reindex finished" in t for t in texts):
            return texts[-1]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no final report in {bot.slack.responses('r1')}")


def _pausing_before_the_swap(
    kb: KnowledgeBase, reached: threading.Event, release: threading.Event
) -> None:
    """Hold ``kb``'s next reindex where every document is embedded and none swapped yet."""
    real = kb.reindex

    def reindex(*, switch: Switch | None = None, **kwargs: Any) -> ReindexReport:
        assert switch is not None, "a reindex of a kept model is given the bot's switch"

        @contextmanager
        def paused() -> Iterator[None]:
            reached.set()
            assert release.wait(120)
            with switch():
                yield

        return real(switch=paused, **kwargs)

    kb.reindex = reindex  # type: ignore[method-assign]


async def test_an_admins_kb_reindex_moves_the_running_bot_to_the_configured_model(
    kept_bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    bot = kept_bot
    assert (await _readyz(bot))["embedding_model"] == MINILM
    assert KEPT in json.dumps((await open_home(bot, ADMIN_ID))["blocks"])
    engine = bot.services.engine
    assert (engine.config.thresholds_model, engine.config.threshold) == (MINILM, BUNDLED[MINILM][0])
    documents = sum(bot.kb.store.stamped_models().values())

    reached, release = threading.Event(), threading.Event()
    _pausing_before_the_swap(bot.kb, reached, release)
    body = slash_command_body("/kb-reindex", "", ADMIN_ID, CHANNEL_ID, bot.slack.response_url("r1"))
    try:
        resp = await bot.post(body)
        assert resp.status == 200 and await resp.text() == messages.REINDEX_STARTED
        assert await asyncio.to_thread(reached.wait, 120), "every document embedded"

        # Rebuilt beside the live index, nothing swapped: asked now, answered on MiniLM.
        await bot.event(app_mention_event(IN_DOMAIN))
        during = json.dumps(await bot.answer(), ensure_ascii=False)
        assert "Employee handbook" in during and "#char=" in during
        assert bot.kb.embedder.name == MINILM
        assert bot.kb.store.stamped_models() == {MINILM: documents}
    finally:
        release.set()

    final = await _final_report(bot)
    assert MOVED in final and "stale documents before 0, after 0" in final

    # The running bot answers on the preset, at the preset's thresholds, on its vectors alone.
    assert bot.kb.kept_model is None
    assert bot.kb.embedder.name.startswith(MULTILINGUAL_MODEL_NAME + " ")
    assert bot.kb.store.stamped_models() == {bot.kb.embedder.name: documents}
    assert bot.kb.stale_documents() == []
    assert engine.config.thresholds_model == MULTILINGUAL_MODEL_NAME
    assert engine.config.threshold == BUNDLED[MULTILINGUAL_MODEL_NAME][0] != BUNDLED[MINILM][0]
    assert engine.backend is bot.kb.search_index and engine.selector.config is engine.config
    ready = await _readyz(bot)
    assert ready["kept_model"] is None and ready["embedding_model"] == bot.kb.embedder.name
    assert ready["checks"]["index_current"] is True
    home = json.dumps((await open_home(bot, ADMIN_ID))["blocks"], ensure_ascii=False)
    assert KEPT not in home and "`kb reindex`" not in home
    await bot.event(app_mention_event("How many days do I have to submit an expense claim?"))
    after = json.dumps(await bot.answer(count=2), ensure_ascii=False)
    assert "Employee handbook" in after and "#char=" in after

    # A restart finds the knowledge base on the default model and says nothing of another.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        restarted = KnowledgeBase(bot.settings.index_config())
    assert restarted.kept_model is None and restarted.embedder.name == bot.kb.embedder.name
    assert not [r for r in caplog.records if KEPT in r.getMessage()]


async def test_a_document_the_configured_model_cannot_rebuild_keeps_everything_as_it_was(
    kept_bot: Bot,
) -> None:
    bot = kept_bot
    lost = bot.kb.store.find_document("handbook.md")
    bot.kb.store.originals.path(lost.sha256).unlink()  # its stored original is gone
    stamped = bot.kb.store.stamped_models()
    body = slash_command_body("/kb-reindex", "", ADMIN_ID, CHANNEL_ID, bot.slack.response_url("r1"))
    assert await (await bot.post(body)).text() == messages.REINDEX_STARTED

    final = await _final_report(bot)
    assert "stays on all-MiniLM-L6-v2" in final and "nothing was changed" in final
    assert "handbook.md" in final and MOVED not in final
    # Moved, the handbook would not be searched: the bot stays on MiniLM, every vector its.
    assert bot.kb.kept_model is not None and bot.kb.embedder.name == MINILM
    assert bot.kb.store.stamped_models() == stamped
    assert bot.services.engine.config.thresholds_model == MINILM
    assert KEPT in json.dumps((await open_home(bot, ADMIN_ID))["blocks"])
    await bot.event(app_mention_event(IN_DOMAIN))
    answered = json.dumps(await bot.answer(), ensure_ascii=False)
    assert "Employee handbook" in answered and "#char=" in answered


def test_a_document_added_during_the_move_is_moved_with_it_never_mixed(
    fixture_data_dir: Path, index_dir: Path
) -> None:
    shutil.copytree(fixture_data_dir, index_dir, dirs_exist_ok=True)
    # The session's encoder cache (tests/conftest.py): the preset's graphs are built once.
    cache = Path(os.environ["KB_ENCODER_CACHE"])
    config = IndexConfig(
        data_dir=index_dir, embedding_model=DEFAULT_EMBEDDING_MODEL, encoder_cache=cache
    )
    kb = KnowledgeBase(config)
    assert kb.kept_model is not None
    added: list[DocumentRow] = []

    @contextmanager
    def switch() -> Iterator[None]:
        # Every other document is embedded by the preset; this one comes on MiniLM.
        added.append(kb.ingest_bytes(b"# Parking\n\nPark in bay 7.\n", "parking.md").document)
        yield

    report = kb.reindex(switch=switch)
    (parking,) = added
    assert parking.embedding_model == MINILM and parking.state == "indexed"
    assert kb.kept_model is None and kb.embedder.name.startswith(MULTILINGUAL_MODEL_NAME)
    # Rebuilt by the move before it switched: on the preset, searched, nothing stale.
    assert kb.document(parking.id).embedding_model == kb.embedder.name
    assert kb.stale_documents() == [] and report.stale_after == 0
    searched = {c["id"] for c in kb.store.searchable_chunks(kb.embedder.name, kb.embedder.dim)}
    assert {int(c["id"]) for c in kb.chunks(parking.id)} <= searched
    assert kb.store.stamped_models() == {kb.embedder.name: report.documents}
    assert kb.search_index.sync() == kb.store.generation


def test_a_document_added_while_the_move_embeds_is_embedded_before_the_searches_are_held(
    fixture_data_dir: Path, index_dir: Path
) -> None:
    """An upload committed on MiniLM while the move embeds the documents is embedded on the
    preset with them, before ``switch()``: the searches held there wait for commits only."""
    shutil.copytree(fixture_data_dir, index_dir, dirs_exist_ok=True)
    cache = Path(os.environ["KB_ENCODER_CACHE"])
    config = IndexConfig(
        data_dir=index_dir, embedding_model=DEFAULT_EMBEDDING_MODEL, encoder_cache=cache
    )
    kb = KnowledgeBase(config)
    added: list[DocumentRow] = []
    held: list[bool] = []
    embedded_while_held: list[bool] = []
    prepare = kb._prepare

    def recorded(*args: Any, **kwargs: Any) -> Any:
        embedded_while_held.append(bool(held))
        return prepare(*args, **kwargs)

    kb._prepare = recorded  # type: ignore[method-assign]

    def embedding(event: str, detail: dict[str, Any]) -> None:
        if event == "reindex" and not added:
            added.append(kb.ingest_bytes(b"# Parking\n\nPark in bay 7.\n", "parking.md").document)

    @contextmanager
    def switch() -> Iterator[None]:
        held.append(True)
        yield

    report = kb.reindex(switch=switch, progress=embedding)
    (parking,) = added
    assert parking.embedding_model == MINILM and parking.state == "indexed"
    assert held and embedded_while_held and not any(embedded_while_held)
    assert kb.document(parking.id).embedding_model == kb.embedder.name
    assert kb.embedder.name.startswith(MULTILINGUAL_MODEL_NAME) and not report.failed
    assert kb.store.stamped_models() == {kb.embedder.name: report.documents}


async def test_the_search_gate_lets_a_switch_in_only_between_searches() -> None:
    gate = SearchGate()
    leave = await gate.enter()
    closing = asyncio.create_task(gate.close())
    await asyncio.sleep(0)
    assert not closing.done(), "a search under way is waited for"
    leave()
    leave()  # leaving twice counts once
    await asyncio.wait_for(closing, 5)

    entering = asyncio.create_task(gate.enter())
    await asyncio.sleep(0)
    assert not entering.done(), "a new search waits while the switch holds the gate"
    gate.reopen()
    (await asyncio.wait_for(entering, 5))()
    async with gate.searching():
        closing = asyncio.create_task(gate.close())
        await asyncio.sleep(0)
        assert not closing.done()
    await asyncio.wait_for(closing, 5)
