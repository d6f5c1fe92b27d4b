"""Qdrant shared by replicas: one collection id per store, one rebuild at a time, health that
asks the engine.

Real parts: stores on SQLite and on Postgres (each "replica" is a store handle of its own,
with its own connections and locks), qdrant-client's local mode and Edge as the engine, a
closed port and a local HTTP server answering 503 for a Qdrant server that is down.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.search.qdrant.client import ClientEngine
from index.search.qdrant.engine import QdrantPoint
from index.search.qdrant.engines import open_engine
from index.search.qdrant.index import KB_ID_KEY, QdrantSearchIndex, collection_name
from index.storage.store import Store
from tests.evalmini import EVALMINI
from tests.servers import closed_port_url, threaded_http_server
from tests.test_search_index_contract import _add

REPLICAS = 4


def _qdrant(store: Store, embedder: Embedder, **kwargs: object) -> QdrantSearchIndex:
    return QdrantSearchIndex(
        store,
        embedding_model=embedder.name,
        dimensions=embedder.dim,
        **kwargs,  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------ one collection id


def test_replicas_starting_together_agree_on_one_collection(
    index_dir: Path, embedder: Embedder, database_url: str
) -> None:
    stores = [Store(index_dir, database_url=database_url) for _ in range(REPLICAS)]
    with ThreadPoolExecutor(REPLICAS) as pool:
        for _ in range(20):  # a race: several rounds, each on a store without an id
            with stores[0].transaction() as db:
                db.execute("DELETE FROM meta WHERE key = ?", [KB_ID_KEY])
            indexes = [_qdrant(s, embedder) for s in stores]
            barrier = threading.Barrier(REPLICAS)

            def start(index: QdrantSearchIndex, barrier: threading.Barrier = barrier) -> str:
                barrier.wait()
                return index.alias

            aliases = set(pool.map(start, indexes))
            kb_id = stores[0].get_meta(KB_ID_KEY)
            assert kb_id is not None
            assert aliases == {collection_name(kb_id, embedder.name, embedder.dim)}


def test_setdefault_meta_keeps_the_first_value(index_dir: Path, database_url: str) -> None:
    store = Store(index_dir, database_url=database_url)
    assert store.setdefault_meta("k", "first") == "first"
    assert store.setdefault_meta("k", "second") == "first"
    assert store.get_meta("k") == "first"


# ------------------------------------------------------------------ one rebuild at a time


class _Paused(ClientEngine):
    """The real engine (the same client), whose first upsert waits until the test lets it go:
    a rebuild caught while it fills its new collection."""

    def __init__(self, real: ClientEngine) -> None:
        super().__init__(real.client, indexed=real.indexed)
        self.filling = threading.Event()
        self.go = threading.Event()

    def upsert(self, name: str, points: Sequence[QdrantPoint]) -> None:
        if not self.filling.is_set():
            self.filling.set()
            self.go.wait(60)
        super().upsert(name, points)


def test_one_rebuild_at_a_time_and_the_other_follows_it(
    index_dir: Path, embedder: Embedder, database_url: str
) -> None:
    first = Store(index_dir, database_url=database_url)
    second = Store(index_dir, database_url=database_url)  # another replica on the same store
    _add(first, embedder, ["Expenses are approved by a manager.", "The office opens at nine."])
    real = open_engine("", "", index_dir)  # both replicas' engine: one Qdrant
    assert isinstance(real, ClientEngine)
    paused = _Paused(real)
    a, b = _qdrant(first, embedder, engine=paused), _qdrant(second, embedder, engine=real)
    errors: list[Exception] = []

    def rebuild(index: QdrantSearchIndex) -> None:
        try:
            index.rebuild()
        except Exception as exc:
            errors.append(exc)

    ta = threading.Thread(target=rebuild, args=(a,))
    ta.start()
    try:
        assert paused.filling.wait(60)
        added = _add(second, embedder, ["Travel is booked through the portal."])
        tb = threading.Thread(target=rebuild, args=(b,))
        tb.start()
        tb.join(1.5)
        waited = tb.is_alive()  # the second rebuild waits for the first
    finally:
        paused.go.set()
    ta.join(60)
    tb.join(60)
    assert not errors, errors
    assert waited
    target = real.alias_target(a.alias)
    assert target is not None and real.builds(a.alias) == [target]  # the first's build, kept
    # The second synced the first's build to the store, the chunk added meanwhile included.
    assert b.generation == second.generation
    assert set(added) <= {cid for cid, _ in real.scan(a.alias)}
    assert b.check()["in_sync"] is True and a.check()["in_sync"] is True


class _Held(ClientEngine):
    """The real engine, whose next call of ``method`` waits, once armed, until the test lets it go."""

    def __init__(self, real: ClientEngine, method: str) -> None:
        super().__init__(real.client, indexed=real.indexed)
        self.method, self.armed, self.reached, self.go = (
            method,
            False,
            threading.Event(),
            threading.Event(),
        )

    def _hold(self, method: str) -> None:
        if self.armed and method == self.method:
            self.armed = False
            self.reached.set()
            self.go.wait(60)

    def move_alias(self, alias: str, collection: str) -> None:
        self._hold("move_alias")
        super().move_alias(alias, collection)

    def upsert(self, name: str, points: Sequence[QdrantPoint]) -> None:
        self._hold("upsert")
        super().upsert(name, points)


def test_a_sync_caught_by_another_replicas_rebuild_never_marks_the_new_build_current(
    index_dir: Path, embedder: Embedder
) -> None:
    first, second = Store(index_dir), Store(index_dir)  # two replicas on one store
    # Texts of four terms each: the average length holds, so no sync re-weights every
    # chunk (a full pass would hide what this test looks for).
    _add(first, embedder, ["Expenses need manager approval."])
    real = open_engine("", "", index_dir)
    assert isinstance(real, ClientEngine)
    held_a, held_b = _Held(real, "move_alias"), _Held(real, "upsert")
    a, b = _qdrant(first, embedder, engine=held_a), _qdrant(second, embedder, engine=held_b)
    b.open()
    # A rebuilds: it has read the rows and filled its build, and is about to move the alias.
    held_a.armed = True
    ta = threading.Thread(target=a.rebuild)
    ta.start()
    assert held_a.reached.wait(60)
    # Meanwhile B syncs a new chunk into the build the alias still names ...
    early = _add(second, embedder, ["Office opens nine daily."])
    b.sync()
    # ... and starts its next sync, which A's alias move overtakes before B writes.
    late = _add(second, embedder, ["Travel booking uses portals."])
    held_b.armed = True
    errors: list[Exception] = []

    def sync_b() -> None:
        try:
            b.sync()
        except Exception as exc:  # writing to the build A dropped may fail: retried below
            errors.append(exc)

    tb = threading.Thread(target=sync_b)
    tb.start()
    assert held_b.reached.wait(60)
    held_a.go.set()
    ta.join(60)
    held_b.go.set()
    tb.join(60)
    b.sync()  # the next sync of the follow loop
    held = {cid for cid, _ in real.scan(a.alias)}
    assert set(early) | set(late) <= held, "a chunk went missing from the new build"
    assert b.check()["in_sync"] is True and a.check()["in_sync"] is True


# ------------------------------------------------------------------ health asks the engine


def test_an_engine_gone_after_a_sync_is_not_ready(index_dir: Path, embedder: Embedder) -> None:
    from bot.server.routes import DEFAULT_MAX_BEHIND_SECONDS, _readiness

    config = IndexConfig(data_dir=index_dir, search_engine="qdrant", qdrant_url=":memory:")
    kb = KnowledgeBase(config, embedder=embedder)  # ":memory:": an engine of its own
    kb.ingest_paths([EVALMINI / "corpus"])
    assert _readiness(kb, DEFAULT_MAX_BEHIND_SECONDS)["checks"]["index_current"] is True
    index = kb.search_index
    assert isinstance(index, QdrantSearchIndex) and isinstance(index.engine, ClientEngine)
    index.engine.client.close()  # the engine stops answering after the index synced
    index._probe = None  # the next probe, not the answer cached a moment ago
    health = index.health()
    assert health["in_sync"] is False and health["behind_s"] is None
    assert health["reachable"] is False and "does not answer" in str(health["engine_error"])
    ready = _readiness(kb, DEFAULT_MAX_BEHIND_SECONDS)
    assert ready["checks"]["index_current"] is False  # /readyz answers 503
    assert ready["index"]["reachable"] is False


def test_a_server_on_a_closed_port_is_reported_within_the_probe(
    index_dir: Path, embedder: Embedder
) -> None:
    import time

    url = closed_port_url("")
    index = _qdrant(Store(index_dir), embedder, url=url)
    started = time.monotonic()
    health = index.health()
    assert time.monotonic() - started < 5
    assert health["reachable"] is False and health["in_sync"] is False
    assert url.removeprefix("http://") in str(health["engine_error"])


class _Counting(BaseHTTPRequestHandler):
    """A Qdrant server that is down behind its proxy: 503 to every request, counted."""

    requests = 0

    def do_GET(self) -> None:
        type(self).requests += 1
        body = b'{"status": {"error": "unavailable"}}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass


@pytest.fixture
def unavailable_server() -> Iterator[str]:
    _Counting.requests = 0
    with threaded_http_server(_Counting) as port:
        yield f"http://127.0.0.1:{port}"


def test_health_asks_the_engine_once_per_few_seconds(
    index_dir: Path, embedder: Embedder, unavailable_server: str
) -> None:
    index = _qdrant(Store(index_dir), embedder, url=unavailable_server)
    first, second = index.health(), index.health()
    assert first["reachable"] is False and second["reachable"] is False
    assert "503" in str(first["engine_error"])
    assert _Counting.requests == 1  # /readyz probes stay cheap


@pytest.mark.parametrize("url", ["", "edge"])
def test_an_embedded_engine_answers(index_dir: Path, embedder: Embedder, url: str) -> None:
    store = Store(index_dir)
    _add(store, embedder, ["Expenses are approved by a manager."])
    index = _qdrant(store, embedder, url=url)
    index.open()
    health = index.health()
    assert health["reachable"] is True and health["engine_error"] is None
    assert health["in_sync"] is True


# ------------------------------------------------------------------ a throw-away knowledge base


@pytest.mark.parametrize("url", ["", "edge"])
def test_a_throw_away_knowledge_base_drops_only_its_own_collections(
    tmp_path: Path, embedder: Embedder, url: str
) -> None:
    production = Store(tmp_path / "production")
    kept = _add(production, embedder, ["Expenses are approved by a manager."])
    mine = _qdrant(production, embedder, url=url)
    mine.open()
    engine = mine.engine  # one engine for both, as one Qdrant server would be
    scratch = Store(tmp_path / "kb-eval")  # a new store: a new id, collections of its own
    _add(scratch, embedder, ["The office opens at nine."])
    theirs = _qdrant(scratch, embedder, engine=engine)
    theirs.open()
    assert theirs.alias != mine.alias and engine.builds(theirs.alias)
    target = engine.alias_target(mine.alias)
    theirs.drop_collections()
    assert engine.builds(theirs.alias) == [] and engine.alias_target(theirs.alias) is None
    assert engine.alias_target(mine.alias) == target
    assert {cid for cid, _ in engine.scan(mine.alias)} == set(kept)
