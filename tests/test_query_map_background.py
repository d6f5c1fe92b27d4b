"""The server fits its query map in the background: a write returns once its passages are
searchable, the start is ready before the fit ends, requests coalesce, a stop discards.

The fit is held by the model it encodes the sentences alone with (the real bundled model,
waiting on an event the test sets, as a slow model on a loaded machine would); everything
else is the product's own: the knowledge base on a real SQLite file and FAISS, the server
started as ``kb serve`` starts it, through its aiohttp application.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from aiohttp.test_utils import TestClient

from bot.app import create_app
from bot.settings import Settings
from core.answer import build_engine
from core.switch import ModelSwitch
from index.config import DEFAULT_EMBEDDING_MODEL, IndexConfig
from index.embed import Embedder, EmbeddingModelUnavailable
from index.knowledge_base import KnowledgeBase
from index.models import DocState
from index.search.query_map import FIT_NICENESS, BackgroundFits, QueryAdapter, QueryAdapters
from tests.conftest import TEST_EMBEDDING_MODEL

# A test's deadline for what the product does at once, not a measured bound.
WAIT_S = 60.0


class _Held:
    """The real model; each ``encode`` (the fit's sentences alone) waits for ``release`` first.

    ``entered`` is set when a fit is inside the model; ``fails``: the model then refuses.
    """

    def __init__(self, embedder: Embedder, *, fails: bool = False) -> None:
        self.embedder, self.dim, self.fails = embedder, embedder.dim, fails
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls = 0
        self.niceness: list[int] = []  # the calling thread's, at each call (Linux)

    @property
    def loaded(self) -> bool:
        return self.embedder.loaded

    def encode(
        self,
        texts: list[str],
        *,
        role: str = "document",
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        self.calls += 1
        if sys.platform == "linux":
            self.niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        self.entered.set()
        if not self.release.wait(WAIT_S):
            raise AssertionError("the test never let the fit go on")
        if self.fails:
            raise EmbeddingModelUnavailable("The model's files went away while encoding.")
        return self.embedder.encode(texts, role=role, on_batch=on_batch)  # type: ignore[arg-type]


def _document(tag: str, paragraphs: int) -> bytes:
    """A Markdown document of ``paragraphs`` distinct paragraphs, a passage each."""
    body = "\n\n".join(
        f"## {tag} step {i}\n\nThe {tag} rota for week {i} names engineer number {i * 7}. "
        f"Handover notes for week {i} go to the {tag} channel before Friday noon. "
        f"Escalations in week {i} reach the duty manager on extension {4000 + i}."
        for i in range(paragraphs)
    )
    return f"# The {tag} rota\n\n{body}\n".encode()


def _server_kb(index_dir: Path, embedder: Embedder) -> tuple[KnowledgeBase, _Held]:
    """The knowledge base as the server opens it (fits in the background), its fits held."""
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder, fit_in_background=True)
    held = _Held(embedder)
    kb.query_adapters.encoder = held  # type: ignore[assignment]
    return kb, held


def _upload(kb: KnowledgeBase, tag: str, paragraphs: int = 10) -> int:
    """What the Slack uploader does with a file: store it, then index it (refreshing search).

    Ten passages are more than a tenth of the evalmini corpus with the uploads before
    (four of them at most here), so each upload makes a fit due; alone, in an empty
    knowledge base, a fit needs ``MIN_ANCHORS`` sentences: forty passages."""
    added = kb.add_bytes(_document(tag, paragraphs), f"{tag}.md")
    row = kb.index_document(added.document.id)
    assert row.state == DocState.INDEXED
    return row.chunk_count


def _searchable(kb: KnowledgeBase) -> int:
    return kb.store.searchable_chunk_count(kb.embedder.name, kb.embedder.dim)


def _latest(kb: KnowledgeBase) -> Future[QueryAdapter | None]:
    assert kb.fits is not None
    future = kb.fits.latest()
    assert future is not None
    return future


def _until_writing(fits: BackgroundFits, running: Future[QueryAdapter | None]) -> None:
    """Wait until the fit ``running`` is writing its map (``fits.writing`` held)."""
    deadline = time.monotonic() + WAIT_S
    while not fits.writing.locked():
        assert time.monotonic() < deadline and not running.done(), "the fit never wrote"
        time.sleep(0.01)


def _forget_map(kb: KnowledgeBase) -> None:
    """The map gone from the store, as on a knowledge base from before query maps."""
    with kb.store.transaction():
        kb.store.delete_meta(kb.query_adapters.map_key)
        kb.store.delete_meta(kb.query_adapters.stamp_key)
    kb.query_adapters.reload_seconds = 0


def test_an_upload_returns_searchable_before_its_fit_ends_and_the_map_is_swapped_whole(
    evalmini_kb: KnowledgeBase, index_dir: Path, embedder: Embedder
) -> None:
    first = evalmini_kb.query_adapters.current()
    assert first is not None and first.chunks == _searchable(evalmini_kb)
    kb, held = _server_kb(index_dir, embedder)
    kb.query_adapters.reload_seconds = 0

    added = _upload(kb, "pager")  # returns while the fit it asked for is held

    assert held.entered.wait(WAIT_S) and not _latest(kb).done()
    assert _searchable(kb) == first.chunks + added
    vector = embedder.encode_query("pager rota engineer for week 3")
    found = kb.search_index.search(vector, "pager rota engineer for week 3", None, 5)
    assert "pager" in kb.store.chunks_by_id([found[0].chunk_id])[found[0].chunk_id].text
    in_use = kb.query_adapters.current()
    assert in_use is not None and in_use.stamp() == first.stamp()  # searches keep the old map
    held.release.set()
    fitted = _latest(kb).result(WAIT_S)
    assert fitted is not None and fitted.chunks == first.chunks + added
    now = kb.query_adapters.current()
    assert now is not None and now.stamp() == fitted.stamp() != first.stamp()
    assert kb.store.get_meta(kb.query_adapters.stamp_key) == fitted.stamp()


def test_requests_while_a_fit_runs_coalesce_into_one_more_fit(
    evalmini_kb: KnowledgeBase, index_dir: Path, embedder: Embedder
) -> None:
    kb, held = _server_kb(index_dir, embedder)
    _upload(kb, "pager")
    assert held.entered.wait(WAIT_S)
    running = _latest(kb)
    queued: set[Future[QueryAdapter | None]] = set()
    for tag in ("badge", "locker", "parking"):  # each upload alone is due again
        _upload(kb, tag)
        queued.add(_latest(kb))
    for _ in range(5):
        kb.refresh_search()
        queued.add(_latest(kb))
    assert len(queued) == 1 and running not in queued
    assert not running.done()
    held.release.set()
    fitted = queued.pop().result(WAIT_S)
    assert running.result(WAIT_S) is not None
    assert held.calls == 2  # the one running and one more, for all eight requests
    assert fitted is not None and fitted.chunks == _searchable(kb)


def test_the_writers_thread_fits_before_returning_without_background_fits(
    evalmini_kb: KnowledgeBase, embedder: Embedder
) -> None:
    held = _Held(embedder)
    held.release.set()
    evalmini_kb.query_adapters.encoder = held  # type: ignore[assignment]
    assert evalmini_kb.fits is None
    _upload(evalmini_kb, "pager")
    fitted = evalmini_kb.query_adapters.current()
    assert held.calls == 1
    assert fitted is not None and fitted.chunks == _searchable(evalmini_kb)


def test_a_failing_fit_in_the_background_keeps_the_previous_map_and_logs(
    evalmini_kb: KnowledgeBase,
    index_dir: Path,
    embedder: Embedder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = evalmini_kb.query_adapters.current()
    assert first is not None
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder, fit_in_background=True)
    failing = _Held(embedder, fails=True)
    failing.release.set()
    kb.query_adapters.encoder = failing  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="index.search.query_map"):
        _upload(kb, "pager")
        kept = _latest(kb).result(WAIT_S)
    assert kept is not None and kept.stamp() == first.stamp()
    assert failing.calls == 1
    assert "query map not fitted (EmbeddingModelUnavailable" in caplog.text
    assert kb.store.get_meta(kb.query_adapters.stamp_key) == first.stamp()


def test_a_stop_does_not_wait_for_the_fit_and_the_fit_writes_nothing(
    evalmini_kb: KnowledgeBase,
    index_dir: Path,
    embedder: Embedder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = evalmini_kb.query_adapters.current()
    assert first is not None
    kb, held = _server_kb(index_dir, embedder)
    _upload(kb, "pager")
    assert held.entered.wait(WAIT_S)
    running = _latest(kb)
    kb.stop_fitting()  # returns with the fit still held in the model
    assert not running.done()
    kb.refresh_search()  # a write after the stop asks for no fit
    assert _latest(kb) is running
    with caplog.at_level(logging.INFO, logger="index.search.query_map"):
        held.release.set()  # the model finishes its first batch: the fit gives up there
        kept = running.result(WAIT_S)
    assert kept is not None and kept.stamp() == first.stamp()
    assert "query map fit stopped" in caplog.text
    assert kb.store.get_meta(kb.query_adapters.stamp_key) == first.stamp()
    # The next start finds it due again and fits it.
    again = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    refitted = again.query_adapters.refit_if_due()
    assert refitted is not None and refitted.chunks == _searchable(again) != first.chunks


def test_a_fit_of_a_model_replaced_meanwhile_is_never_installed(
    evalmini_kb: KnowledgeBase, embedder: Embedder
) -> None:
    """The knowledge base moved to another model while a fit of the one it left ran."""
    store = evalmini_kb.store
    _forget_map(evalmini_kb)  # due on the model left
    fits = BackgroundFits()
    left = QueryAdapters(
        store, embedding_model=embedder.name, dimensions=embedder.dim, reload_seconds=0, fits=fits
    )
    moved_to = QueryAdapters(
        store, embedding_model="moved-model", dimensions=embedder.dim, reload_seconds=0, fits=fits
    )
    assert (left.map_key, left.stamp_key) != (moved_to.map_key, moved_to.stamp_key)
    held = _Held(embedder)
    left.encoder = held  # type: ignore[assignment]
    left.refit_if_due()
    assert held.entered.wait(WAIT_S)
    running = fits.latest()
    assert running is not None
    left.retire()  # what the knowledge base does once it runs another model (``_run_on``)
    held.release.set()
    assert running.result(WAIT_S) is None
    for adapters in (left, moved_to):
        assert store.get_meta(adapters.stamp_key) is None and adapters.current() is None
    left.refit_if_due()  # a retired map asks for no fit
    assert fits.latest() is running
    fits.close()


def test_a_model_replaced_while_its_fits_write_waits_for_the_store_writes_nothing(
    evalmini_kb: KnowledgeBase, index_dir: Path, embedder: Embedder
) -> None:
    """The move (``_run_on``) retires the map while its fit waits for another writer."""
    store = evalmini_kb.store
    _forget_map(evalmini_kb)
    fits = BackgroundFits()
    left = QueryAdapters(
        store, embedding_model=embedder.name, dimensions=embedder.dim, reload_seconds=0, fits=fits
    )
    held = _Held(embedder)
    left.encoder = held  # type: ignore[assignment]
    left.refit_if_due()
    assert held.entered.wait(WAIT_S)
    running = fits.latest()
    assert running is not None
    other = sqlite3.connect(index_dir / "kb.sqlite", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        held.release.set()
        _until_writing(fits, running)
        left.retire()
    finally:
        other.rollback()
        other.close()
    assert running.result(WAIT_S) is None
    assert store.get_meta(left.stamp_key) is None and left.current() is None
    fits.close()


def test_a_server_moving_to_another_model_never_installs_the_left_models_fit(
    evalmini_kb: KnowledgeBase, index_dir: Path, embedder: Embedder
) -> None:
    """The store moved to the multilingual preset while a fit of MiniLM's map ran."""
    config = IndexConfig(
        data_dir=index_dir,
        embedding_model=TEST_EMBEDDING_MODEL,
        encoder_cache=Path(os.environ["KB_ENCODER_CACHE"]),
    )
    kb = KnowledgeBase(config, embedder=embedder, fit_in_background=True)
    left, held = kb.query_adapters, _Held(embedder)
    left.encoder = held  # type: ignore[assignment]
    _forget_map(kb)
    kb.refresh_search()
    assert held.entered.wait(WAIT_S)
    running = _latest(kb)

    kb.follow_store_model(DEFAULT_EMBEDDING_MODEL)  # what the server does when the store moved
    moved_to = kb.query_adapters
    assert moved_to is not left and moved_to.embedding_model == kb.embedder.name != embedder.name
    held.release.set()
    assert running.result(WAIT_S) is None  # given up: nothing written, nothing installed
    assert kb.store.get_meta(left.stamp_key) is None and left.current() is None
    assert kb.store.get_meta(moved_to.stamp_key) is None and moved_to.current() is None
    kb.stop_fitting()


def test_a_stop_returns_while_the_fits_write_waits_for_another_writer(
    evalmini_kb: KnowledgeBase, index_dir: Path, embedder: Embedder
) -> None:
    """The server's stop runs on its event loop: it must not wait on the store for a fit's write."""
    first = evalmini_kb.query_adapters.current()
    assert first is not None
    kb, held = _server_kb(index_dir, embedder)
    _upload(kb, "pager")
    assert held.entered.wait(WAIT_S) and kb.fits is not None
    running = _latest(kb)
    # Another process writing the store (a ``kb ingest`` in a shell): SQLite's write lock.
    other = sqlite3.connect(index_dir / "kb.sqlite", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        held.release.set()  # the fit ends; its write waits for the other writer
        _until_writing(kb.fits, running)
        kb.stop_fitting()
        assert kb.fits.writing.locked() and not running.done()  # returned without waiting
    finally:
        other.rollback()
        other.close()
    kept = running.result(WAIT_S)  # the store once its own, the fit finds it stopped
    assert kept is not None and kept.stamp() == first.stamp()
    assert kb.store.get_meta(kb.query_adapters.stamp_key) == first.stamp()
    kb.refresh_search()  # and nothing more is fitted once stopped
    assert _latest(kb) is running


def test_a_background_fit_is_stored_whole_and_read_by_another_server_on_the_store(
    index_dir: Path, embedder: Embedder, database_url: str
) -> None:
    """SQLite and Postgres: the fit's thread has its own connection; a replica reloads the map."""
    config = IndexConfig(data_dir=index_dir, database_url=database_url)
    kb = KnowledgeBase(config, embedder=embedder, fit_in_background=True)
    held = _Held(embedder)
    kb.query_adapters.encoder = held  # type: ignore[assignment]
    _upload(kb, "pager", paragraphs=40)
    assert held.entered.wait(WAIT_S)
    replica = KnowledgeBase(config, embedder=embedder)  # another ``kb serve`` on the same store
    replica.query_adapters.reload_seconds = 0
    assert replica.query_adapters.current() is None  # nothing stored while the fit runs
    held.release.set()
    fitted = _latest(kb).result(WAIT_S)
    assert fitted is not None and fitted.chunks == _searchable(kb) > 0
    seen = replica.query_adapters.current()
    assert seen is not None and seen.stamp() == fitted.stamp()
    assert np.array_equal(seen.matrix, fitted.matrix)
    kb.stop_fitting()


async def test_a_server_start_with_a_due_fit_is_ready_before_the_fit_ends(
    evalmini_kb: KnowledgeBase,
    index_dir: Path,
    embedder: Embedder,
    settings_for: Callable[..., Settings],
    aiohttp_client: Callable[..., object],
) -> None:
    kb, held = _server_kb(index_dir, embedder)
    _forget_map(kb)
    app = create_app(settings_for(), kb=kb)
    client: TestClient = await aiohttp_client(app)  # type: ignore[operator]

    resp = await client.get("/readyz")
    assert resp.status == 200 and (await resp.json())["ready"] is True
    assert held.entered.wait(WAIT_S) and not _latest(kb).done()
    assert kb.query_adapters.current() is None  # the model's order until the map is fitted
    held.release.set()
    fitted = _latest(kb).result(WAIT_S)
    assert fitted is not None and fitted.chunks == _searchable(kb)
    now = kb.query_adapters.current()
    assert now is not None and now.stamp() == fitted.stamp()


async def test_a_server_stopping_during_a_fit_stops_at_once_and_writes_no_map(
    evalmini_kb: KnowledgeBase,
    index_dir: Path,
    embedder: Embedder,
    settings_for: Callable[..., Settings],
    aiohttp_client: Callable[..., object],
) -> None:
    kb, held = _server_kb(index_dir, embedder)
    _forget_map(kb)
    client: TestClient = await aiohttp_client(create_app(settings_for(), kb=kb))  # type: ignore[operator]
    assert held.entered.wait(WAIT_S)
    running = _latest(kb)

    await client.close()  # the server's graceful stop, with the fit held in the model
    assert not running.done()
    held.release.set()
    assert running.result(WAIT_S) is None
    assert kb.store.get_meta(kb.query_adapters.stamp_key) is None


def test_a_forced_request_fits_in_the_background_even_when_not_due(
    evalmini_kb: KnowledgeBase, embedder: Embedder
) -> None:
    """A move's fit (``wait=False``) returns at once with the map in use; it fits though not due."""
    first = evalmini_kb.query_adapters.current()
    assert first is not None
    fits = BackgroundFits()
    adapters = QueryAdapters(
        evalmini_kb.store,
        embedding_model=embedder.name,
        dimensions=embedder.dim,
        reload_seconds=0,
        fits=fits,
    )
    held = _Held(embedder)
    adapters.encoder = held  # type: ignore[assignment]
    in_use = adapters.refit_if_due(force=True, wait=False)
    assert in_use is not None and in_use.stamp() == first.stamp()
    assert held.entered.wait(WAIT_S)
    running = fits.latest()
    assert running is not None and not running.done()
    held.release.set()
    fitted = running.result(WAIT_S)
    assert fitted is not None and fitted.stamp() != first.stamp()
    assert fitted.chunks == first.chunks  # not due by the count: fitted because forced
    fits.close()


def _moved_config(index_dir: Path, **changes: object) -> IndexConfig:
    """The store's data dir on the default model (the multilingual preset)."""
    return IndexConfig(
        data_dir=index_dir,
        embedding_model=DEFAULT_EMBEDDING_MODEL,
        encoder_cache=Path(os.environ["KB_ENCODER_CACHE"]),
        **changes,  # type: ignore[arg-type]
    )


def _held_server_on_minilm(index_dir: Path, embedder: Embedder) -> tuple[KnowledgeBase, _Held]:
    """A server on the default model that keeps MiniLM (the store's), its MiniLM map's fit
    due after an upload and held in the model: the fits' one thread is busy until released."""
    kb = KnowledgeBase(_moved_config(index_dir), fit_in_background=True)
    assert kb.kept_model is not None and kb.embedder.name == embedder.name
    held = _Held(kb.embedder)
    kb.query_adapters.encoder = held  # type: ignore[assignment]
    _upload(kb, "pager")
    assert held.entered.wait(WAIT_S)
    return kb, held


def _assert_moved_without_a_map(kb: KnowledgeBase, left: QueryAdapters) -> None:
    """On the preset, searching in its order: the map left behind is in the store, not in use."""
    moved_to = kb.query_adapters
    assert (
        moved_to is not left
        and moved_to.embedding_model == kb.embedder.name != left.embedding_model
    )
    assert kb.store.get_meta(left.stamp_key) is not None  # MiniLM's map stays MiniLM's
    assert kb.store.get_meta(moved_to.stamp_key) is None and moved_to.current() is None
    question = "pager rota engineer for week 3"
    found = kb.search_index.search(kb.question_vector(question), question, None, 5)
    chunks = kb.store.chunks_by_id([f.chunk_id for f in found])
    assert found and {kb.document(c.document_id).embedding_model for c in chunks.values()} == {
        kb.embedder.name
    }


def test_a_move_in_the_server_holds_its_searches_without_waiting_for_the_new_models_fit(
    evalmini_kb: KnowledgeBase, index_dir: Path, embedder: Embedder
) -> None:
    """``/kb-reindex`` moves the server off MiniLM: the switch ends with the new map only asked."""
    kb, held = _held_server_on_minilm(index_dir, embedder)
    left, running = kb.query_adapters, _latest(kb)
    minilm = kb.store.get_meta(left.stamp_key)  # evalmini's map: MiniLM's fit is held
    inside: list[str | None] = []

    @contextmanager
    def switch() -> Iterator[None]:  # where the server holds its searches (``ModelSwitch``)
        yield
        inside.append(kb.store.get_meta(kb.query_adapters.stamp_key))

    report = kb.reindex(switch=switch)  # returns while MiniLM's fit is still held

    assert report.documents > 0 and not running.done()
    assert inside == [None]  # the searches were let through before the preset's map was fitted
    asked = _latest(kb)
    assert asked is not running and not asked.done()  # the preset's fit waits its turn
    _assert_moved_without_a_map(kb, left)
    held.release.set()
    kept = running.result(WAIT_S)  # MiniLM's, retired: gives up, nothing written
    assert kept is not None and kept.stamp() == minilm == kb.store.get_meta(left.stamp_key)
    fitted = asked.result(WAIT_S)
    assert fitted is not None and fitted.embedding_model == kb.embedder.name
    assert fitted.chunks == _searchable(kb)
    now = kb.query_adapters.current()
    assert now is not None and now.stamp() == fitted.stamp()
    kb.stop_fitting()


async def test_a_follower_reopens_its_searches_before_the_new_models_fit_ends(
    evalmini_kb: KnowledgeBase,
    index_dir: Path,
    embedder: Embedder,
    settings_for: Callable[..., Settings],
) -> None:
    """A shell's ``kb reindex`` (its map off) moved the store: the server follows, searches
    reopen at once, and the preset's map is fitted in the background."""
    kb, held = _held_server_on_minilm(index_dir, embedder)
    left, running = kb.query_adapters, _latest(kb)
    settings = settings_for(embedding_model=DEFAULT_EMBEDDING_MODEL, threshold=None)
    engine = build_engine(settings.engine_config(kb.config.embedding_model), kb)
    switch = ModelSwitch(engine, settings.engine_config)
    mover = KnowledgeBase(_moved_config(index_dir, query_adapter=False), keep_earlier_model=False)
    await asyncio.to_thread(mover.reindex)

    assert await switch.follow() is True  # while MiniLM's fit is still held
    assert not engine.searches.closed and not running.done()
    asked = _latest(kb)
    assert asked is not running and not asked.done()
    _assert_moved_without_a_map(kb, left)
    held.release.set()
    fitted = await asyncio.to_thread(asked.result, WAIT_S)
    assert fitted is not None and fitted.embedding_model == kb.embedder.name
    now = kb.query_adapters.current()
    assert now is not None and now.stamp() == fitted.stamp()
    kb.stop_fitting()


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own priority is Linux's")
def test_the_background_fit_encodes_at_a_lower_priority_than_the_questions(
    evalmini_kb: KnowledgeBase, index_dir: Path, embedder: Embedder
) -> None:
    """The fit's thread yields the cores to questions; the questions' threads keep theirs."""
    server = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    kb, held = _server_kb(index_dir, embedder)
    _upload(kb, "pager")
    assert held.entered.wait(WAIT_S)
    question = "pager rota engineer for week 3"
    found = kb.search_index.search(kb.question_vector(question), question, None, 5)
    assert found and os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == server
    assert os.getpriority(os.PRIO_PROCESS, 0) == server  # the process's main thread too
    held.release.set()
    assert _latest(kb).result(WAIT_S) is not None
    assert held.niceness == [min(19, server + FIT_NICENESS)]
    kb.stop_fitting()
