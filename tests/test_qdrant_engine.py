"""The Qdrant engine beyond the contract: rankings equal to the local engine's, BM25 as
stored, resumable sync, rebuild behind the alias, a server's API key, a missing client.

Real parts: the knowledge base's own ingestion of ``tests/data/evalmini``, qdrant-client's
local mode (embedded in the data dir, as with an empty ``QDRANT_URL``), a local HTTP server
standing in for an unreachable Qdrant server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from index.config import IndexConfig
from index.embed import Embedder
from index.errors import KBError
from index.knowledge_base import KnowledgeBase
from index.search import open_search_index
from index.search.contract import Candidate, Mode, SearchIndex
from index.search.qdrant.engine import QdrantPoint, SearchEngineUnavailable
from index.search.qdrant.index import AVGDL_TOLERANCE, QdrantSearchIndex, collection_name
from index.storage.store import Store
from tests.evalmini import EVALMINI
from tests.servers import threaded_http_server
from tests.test_search_index_contract import _add

API_KEY = "qdrant-key-canary-7f3a"


def _questions() -> list[str]:
    out: list[str] = []
    for line in (EVALMINI / "questions.jsonl").read_text().splitlines():
        row = json.loads(line)
        out += [row["doc_phrasing"], row["ticket_phrasing"]]
    out += [
        json.loads(line)["question"] for line in (EVALMINI / "ood.jsonl").read_text().splitlines()
    ]
    return out


@pytest.fixture
def qdrant_kb(index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    """The evalmini corpus ingested by a knowledge base searching with Qdrant (embedded)."""
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir, search_engine="qdrant"), embedder=embedder)
    kb.search_index.open()
    summary = kb.ingest_paths([EVALMINI / "corpus"])
    assert len(summary.indexed) == 3
    return kb


def _local(store: Store, embedder: Embedder) -> SearchIndex:
    index = open_search_index(store, embedding_model=embedder.name, dimensions=embedder.dim)
    index.open()
    return index


def _ids(found: list[Candidate]) -> list[int]:
    return [c.chunk_id for c in found]


def test_top_4_equals_the_local_engine_and_both_legs_match(
    qdrant_kb: KnowledgeBase, embedder: Embedder
) -> None:
    # Every engine with the knowledge base's query map, as the knowledge base's own index has it.
    adapters = qdrant_kb.query_adapters
    assert adapters.current() is not None
    local = open_search_index(
        qdrant_kb.store, embedding_model=embedder.name, dimensions=embedder.dim, adapters=adapters
    )
    local.open()
    edge = QdrantSearchIndex(
        qdrant_kb.store,
        embedding_model=embedder.name,
        dimensions=embedder.dim,
        url="edge",
        adapters=adapters,
    )
    edge.open()
    assert isinstance(qdrant_kb.search_index, QdrantSearchIndex)
    questions = _questions()
    for qdrant in (qdrant_kb.search_index, edge):
        same = 0
        for q in questions:
            vector = embedder.encode_query(q)
            top_q, top_l = qdrant.search(vector, q, None, 4), local.search(vector, q, None, 4)
            same += _ids(top_q) == _ids(top_l)
            for mine, theirs in zip(top_q, top_l, strict=False):
                if mine.chunk_id == theirs.chunk_id:
                    assert mine.distance == pytest.approx(theirs.distance, abs=1e-5)
            for mode in (Mode.DENSE, Mode.BM25):
                legs = (
                    qdrant.search(vector, q, None, 25, mode),
                    local.search(vector, q, None, 25, mode),
                )
                assert _ids(legs[0]) == _ids(legs[1]), (qdrant, q, mode)
                # Equal min-max normalised scores: raw scores agree up to scale and shift.
                assert [c.score for c in legs[0]] == pytest.approx(
                    [c.score for c in legs[1]], abs=1e-4
                )
        assert same / len(questions) >= 0.95, qdrant


# The embedded engines: qdrant-client's local mode, and Qdrant's in-process engine (Edge).
EMBEDDED = ["", "edge"]


def _qdrant(
    store: Store, embedder: Embedder, model: str | None = None, url: str = ""
) -> QdrantSearchIndex:
    return QdrantSearchIndex(
        store, embedding_model=model or embedder.name, dimensions=embedder.dim, url=url
    )


@pytest.mark.parametrize("url", EMBEDDED)
def test_bm25_values_follow_the_average_length_as_the_corpus_grows(
    index_dir: Path, embedder: Embedder, url: str
) -> None:
    store = Store(index_dir)
    _add(store, embedder, ["Expense form.", "Expense receipts for travel."])
    index = _qdrant(store, embedder, url=url)
    index.open()
    first = index.engine.marker(index.alias)["avgdl"]
    long = (
        "Expense receipts for travel are scanned, signed and filed by the finance team each month."
    )
    _add(store, embedder, [long] * 6)
    index.sync()
    marker = index.engine.marker(index.alias)
    assert marker["generation"] == store.generation
    assert abs(marker["avgdl"] - first) > AVGDL_TOLERANCE * first  # the values were rewritten
    local, q = _local(store, embedder), "expense receipts"
    vector = embedder.encode_query(q)
    mine = index.search(vector, q, None, 8, Mode.BM25)
    theirs = local.search(vector, q, None, 8, Mode.BM25)
    assert _ids(mine) == _ids(theirs)
    assert [c.score for c in mine] == pytest.approx([c.score for c in theirs], abs=1e-4)


QUESTION_TEXT = "How is an expense approved?"


@pytest.mark.parametrize("url", EMBEDDED)
def test_a_sync_interrupted_by_a_crash_resumes(
    index_dir: Path, embedder: Embedder, url: str
) -> None:
    store = Store(index_dir)
    kept = _add(
        store, embedder, ["Expenses are approved by a manager.", "The office opens at nine."]
    )
    first = _qdrant(store, embedder, url=url)
    first.open()
    engine, alias = first.engine, first.alias
    # What a process killed mid-sync leaves: part of a change written, the marker not.
    engine.delete(alias, [kept[1]])
    stray = QdrantPoint(999_999, [0.1] * embedder.dim, [1], [1.0], {"version": 0.0, "length": 1})
    engine.upsert(alias, [stray])
    added = _add(store, embedder, ["Travel is booked through the portal."])
    restarted = _qdrant(store, embedder, url=url)  # a new process on the same engine
    assert restarted.open() == store.generation
    assert restarted.check()["in_sync"] is True
    assert {cid for cid, _ in engine.scan(alias)} == {*kept, *added}


@pytest.mark.parametrize("url", EMBEDDED)
def test_rebuild_fills_a_new_collection_then_moves_the_alias(
    index_dir: Path, embedder: Embedder, url: str
) -> None:
    store = Store(index_dir)
    _add(store, embedder, ["Expenses are approved by a manager."])
    index = _qdrant(store, embedder, url=url)
    index.open()
    engine, alias = index.engine, index.alias
    before = engine.alias_target(alias)
    # A rebuild that crashed before its alias moved leaves a collection nobody reads.
    engine.create(f"{alias}-crashed0", embedder.dim)
    vector = embedder.encode_query(QUESTION_TEXT)
    found = index.search(vector, QUESTION_TEXT, None, 4)
    assert index.rebuild() == store.generation
    after = engine.alias_target(alias)
    assert after is not None and after != before
    assert engine.builds(alias) == [after]  # the old build and the crashed one are gone
    assert index.search(vector, QUESTION_TEXT, None, 4) == found


@pytest.mark.parametrize("url", EMBEDDED)
def test_a_collection_of_another_analysis_is_rebuilt(
    index_dir: Path, embedder: Embedder, url: str
) -> None:
    store = Store(index_dir)
    _add(store, embedder, ["Expenses are approved by a manager."])
    index = _qdrant(store, embedder, url=url)
    index.open()
    engine, alias = index.engine, index.alias
    before = engine.alias_target(alias)
    engine.set_marker(alias, {**engine.marker(alias), "tokenizer": "1:an-older-analysis"})
    again = _qdrant(store, embedder, url=url)
    assert again.open() == store.generation
    assert engine.alias_target(alias) != before
    assert again.check()["in_sync"] is True


def test_each_model_has_its_own_collection(index_dir: Path, embedder: Embedder) -> None:
    store = Store(index_dir)
    mine = _add(store, embedder, ["Expenses are approved by a manager."])
    theirs = _add(store, embedder, ["Expenses of another model."], model="other/model")
    a, b = _qdrant(store, embedder), _qdrant(store, embedder, model="other/model")
    a.open(), b.open()
    assert a.alias != b.alias
    kb_id = store.get_meta("search_collection_id")
    assert kb_id and a.alias == collection_name(kb_id, embedder.name, embedder.dim)
    vector = embedder.encode_query(QUESTION_TEXT)
    assert _ids(a.search(vector, QUESTION_TEXT, None, 4)) == mine
    assert _ids(b.search(vector, QUESTION_TEXT, None, 4)) == theirs


class _Refusing(BaseHTTPRequestHandler):
    """A server that answers every request 503 and remembers the headers it got."""

    seen: list[dict[str, str]] = []

    def _refuse(self) -> None:
        type(self).seen.append(dict(self.headers))
        body = b'{"status": {"error": "unavailable"}}'
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _refuse

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        pass


@pytest.fixture
def refusing_server() -> Iterator[str]:
    with threaded_http_server(_Refusing) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection")
def test_a_failing_server_gets_the_key_and_no_message_shows_it(
    index_dir: Path, embedder: Embedder, refusing_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    _Refusing.seen.clear()
    url = refusing_server.replace("http://", "http://admin:hunter2-canary@")
    index = QdrantSearchIndex(
        Store(index_dir),
        embedding_model=embedder.name,
        dimensions=embedder.dim,
        url=url,
        api_key=API_KEY,
    )
    with pytest.raises(SearchEngineUnavailable) as caught:
        index.open()
    message = str(caught.value)
    assert refusing_server.removeprefix("http://") in message and "QDRANT_URL" in message
    assert API_KEY not in message and "hunter2" not in message
    assert index.health()["refresh_error"] and API_KEY not in str(index.health())
    assert "hunter2" not in str(index.health()) and API_KEY not in repr(index)
    assert any(h.get("api-key") == API_KEY for h in _Refusing.seen)
    assert API_KEY not in caplog.text


def test_without_qdrant_client_the_error_names_the_extra(index_dir: Path) -> None:
    # A fresh interpreter where the package cannot be imported, as without the extra.
    script = f"""
import sys
sys.modules["qdrant_client"] = None
from index.search import open_search_index
from index.search.qdrant import SearchEngineUnavailable
from index.storage.store import Store
try:
    open_search_index(Store({str(index_dir)!r}), embedding_model="m", dimensions=3, engine="qdrant").open()
except SearchEngineUnavailable as exc:
    print(exc)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert "pip install -e '.[scale]'" in done.stdout, done.stderr


def test_settings_choose_qdrant_and_keep_its_key_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.settings import Settings

    monkeypatch.setenv("KB_SEARCH_ENGINE", "qdrant")
    monkeypatch.setenv("QDRANT_URL", "http://qdrant:6333")
    monkeypatch.setenv("QDRANT_API_KEY", API_KEY)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    config = settings.index_config()
    assert (config.search_engine, config.qdrant_url, config.qdrant_api_key) == (
        "qdrant",
        "http://qdrant:6333",
        API_KEY,
    )
    assert API_KEY not in repr(settings) + repr(config)
    assert API_KEY in settings.secret_values()


@pytest.mark.parametrize("url", EMBEDDED)
def test_search_errors_are_the_products(index_dir: Path, embedder: Embedder, url: str) -> None:
    index = _qdrant(Store(index_dir), embedder, url=url)
    index.open()
    index.engine.drop(str(index.engine.alias_target(index.alias)))  # dropped behind our back
    with pytest.raises(KBError, match="Qdrant engine at .* failed"):
        index.search(embedder.encode_query(QUESTION_TEXT), QUESTION_TEXT, None, 4)
