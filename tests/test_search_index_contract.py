"""The search-index contract: the same cases against every engine the knowledge base can use.

An engine is one entry of ``ENGINES`` (a name and how to build it over a
store); each case below runs against each entry. Real SQLite, the bundled
model, a few small documents.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from index.embed import Embedder
from index.models import Chunk
from index.records import Stamp
from index.search import open_search_index
from index.search.contract import Mode, SearchIndex
from index.search.derived import OnlyScopes
from index.search.query_map import QueryAdapter, QueryAdapters
from index.storage.store import NewDocument, Store

Factory = Callable[..., SearchIndex]


def _local(store: Store, embedder: Embedder, adapters: QueryAdapters | None = None) -> SearchIndex:
    return open_search_index(
        store,
        embedding_model=embedder.name,
        dimensions=embedder.dim,
        engine="local",
        adapters=adapters,
    )


def _qdrant(store: Store, embedder: Embedder, adapters: QueryAdapters | None = None) -> SearchIndex:
    """Qdrant through qdrant-client's local mode, embedded in the data dir (the empty QDRANT_URL)."""
    return open_search_index(
        store,
        embedding_model=embedder.name,
        dimensions=embedder.dim,
        engine="qdrant",
        adapters=adapters,
    )


def _qdrant_edge(
    store: Store, embedder: Embedder, adapters: QueryAdapters | None = None
) -> SearchIndex:
    """Qdrant's in-process engine (qdrant-edge-py) in the data dir (QDRANT_URL=edge)."""
    return open_search_index(
        store,
        embedding_model=embedder.name,
        dimensions=embedder.dim,
        engine="qdrant",
        qdrant_url="edge",
        adapters=adapters,
    )


ENGINES: dict[str, Factory] = {"local": _local, "qdrant": _qdrant, "qdrant-edge": _qdrant_edge}

QUESTION = "How is a travel expense reimbursement approved?"
_names = itertools.count()
# The vectors of the texts tests add, by model: every engine's run of a test adds the same
# texts, and encoding them again (forty passages on the worker's one thread) was most of
# its time. The model is deterministic: a vector from here is the one encoding gives.
_vectors: dict[tuple[str, tuple[str, ...]], np.ndarray] = {}


def _encoded(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """``embedder.encode(texts)``, encoded once per module run."""
    key = (embedder.name, tuple(texts))
    if key not in _vectors:
        _vectors[key] = embedder.encode(texts)
    return _vectors[key].copy()


def _stamp(embedder: Embedder, model: str | None = None) -> Stamp:
    return Stamp(model or embedder.name, embedder.dim, "pipeline-1", "extractor-1")


def _add(
    store: Store,
    embedder: Embedder,
    texts: list[str],
    *,
    scope: str = "*",
    model: str | None = None,
    language: str | None = None,
) -> list[int]:
    """A document of ``texts`` (one chunk each, in ``language``), indexed; its chunk ids."""
    name = f"doc{next(_names)}"
    doc_id = store.insert_document(NewDocument(name=name, sha256=name, size=1, scope=scope))
    chunks = [Chunk(i, 0, len(t), t, t, "", language=language) for i, t in enumerate(texts)]
    return store.commit_indexed(
        doc_id,
        chunks,
        _encoded(embedder, texts),
        [len(t.split()) for t in texts],
        canonical_text="",
        stamp=_stamp(embedder, model),
        window_splits=0,
    )


def _doc_of(store: Store, chunk_ids: list[int]) -> int:
    return next(iter(store.chunks_by_id(chunk_ids).values())).document_id


def _company_texts(n: int) -> list[str]:
    return [
        f"Travel expense reimbursement policy, section {i}: approved by finance." for i in range(n)
    ]


@pytest.fixture
def store(index_dir: Path) -> Store:
    return Store(index_dir)


@pytest.fixture(params=sorted(ENGINES))
def make(request: pytest.FixtureRequest, embedder: Embedder) -> Callable[..., SearchIndex]:
    factory = ENGINES[request.param]
    return lambda store, adapters=None: factory(store, embedder, adapters)


def _direct(embedder: Embedder, text: str, question: str = QUESTION) -> float:
    """The cosine distance of a text's vector to the question's, computed here."""
    return float(1.0 - embedder.encode([text])[0] @ embedder.encode_query(question))


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_a_small_scope_gets_its_full_top_k(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex], mode: str
) -> None:
    _add(store, embedder, _company_texts(40))
    channel = _add(
        store,
        embedder,
        [f"Reimbursement of a channel's travel expense, note {i}." for i in range(5)],
        scope="C1",
    )
    index = make(store)
    index.open()
    vector = embedder.encode_query(QUESTION)
    everyone = index.search(vector, QUESTION, None, 30, Mode(mode))
    assert sum(c.chunk_id in channel for c in everyone) < 4  # crowded out without a scope
    found = index.search(vector, QUESTION, OnlyScopes({"C1"}), 4, Mode(mode))
    assert len(found) == 4
    assert {c.chunk_id for c in found} <= set(channel)


def test_bm25_only_hits_carry_their_dense_distance(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    texts = ["Reimbursement form ERR_42 for expenses.", "Holiday calendar for the office."]
    ids = _add(store, embedder, texts)
    index = make(store)
    index.open()
    vector = embedder.encode_query(QUESTION)
    found = index.search(vector, "ERR_42", None, 4, Mode.BM25)
    assert [c.chunk_id for c in found] == [ids[0]]
    assert found[0].dense_rank is None
    assert found[0].distance == pytest.approx(_direct(embedder, texts[0]), abs=1e-5)


def test_a_cutoff_changes_nothing_within_it_and_keeps_the_nearest_miss(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    _add(store, embedder, [*_company_texts(12), "Holiday calendar ERR_42 for the office."])
    index = make(store)
    index.open()
    for question in (QUESTION, "ERR_42 holiday", "how do I renew my spanish passport"):
        vector = embedder.encode_query(question)
        full = index.search(vector, question, None, 10)
        nearest = min(c.distance for c in full)
        # A cutoff the nearest passage is just within changes nothing.
        loose = index.search(vector, question, None, 10, cutoff=nearest + 1e-4)
        assert [c.chunk_id for c in loose] == [c.chunk_id for c in full]
        assert [c.distance for c in loose] == pytest.approx([c.distance for c in full], abs=1e-6)
        below = index.search(vector, question, None, 10, cutoff=nearest - 0.01)
        assert below and not [c for c in below if c.distance <= nearest - 0.01]
        assert min(c.distance for c in below) == pytest.approx(nearest, abs=1e-6)


def test_the_local_engine_skips_bm25_when_nothing_is_within_the_cutoff(
    store: Store, embedder: Embedder
) -> None:
    _add(store, embedder, ["Holiday calendar ERR_42 for the office.", *_company_texts(3)])
    index = _local(store, embedder)
    index.open()
    vector = embedder.encode_query("ERR_42")
    assert index.search(vector, "ERR_42", None, 4)[0].sparse_rank == 1
    skipped = index.search(vector, "ERR_42", None, 4, cutoff=0.01)
    assert skipped == index.search(vector, "ERR_42", None, 4, Mode.DENSE)
    assert all(c.sparse_rank is None for c in skipped)


def _stored_map(store: Store, embedder: Embedder, matrix: np.ndarray) -> QueryAdapters:
    """A query map written to the store as a fit would, and the cache that reads it."""
    adapter = QueryAdapter(matrix.astype(np.float32), embedder.name, 13, 100, 1.0)
    adapters = QueryAdapters(store, embedding_model=embedder.name, dimensions=embedder.dim)
    store.set_meta(adapters.map_key, adapter.to_meta())
    store.set_meta(adapters.stamp_key, adapter.stamp())
    return adapters


def test_a_query_map_orders_the_hybrid_fusion_and_never_a_distance(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    texts = [*_company_texts(12), "Holiday calendar for the office."]
    ids = _add(store, embedder, texts)
    vector = embedder.encode_query(QUESTION)
    plain = make(store)
    plain.open()
    before = {m: plain.search(vector, QUESTION, None, 5, m) for m in Mode}
    assert before[Mode.HYBRID][0].chunk_id != ids[-1]
    # A map sending this question onto the unrelated holiday chunk: only the map can put it first.
    holiday = embedder.encode([texts[-1]])[0]
    matrix = 10 * np.outer(holiday, vector) + 0.01 * np.eye(embedder.dim)
    mapped = make(store, _stored_map(store, embedder, matrix))
    mapped.open()
    after = mapped.search(vector, QUESTION, None, 5, Mode.HYBRID)
    assert after[0].chunk_id == ids[-1]
    for c in after:  # the gate's distances stay the model's own
        assert c.distance == pytest.approx(
            _direct(embedder, texts[ids.index(c.chunk_id)]), abs=1e-5
        )
    for mode in (Mode.DENSE, Mode.BM25):  # only the hybrid fusion is mapped
        again = mapped.search(vector, QUESTION, None, 5, mode)
        assert [c.chunk_id for c in again] == [c.chunk_id for c in before[mode]]
        assert [c.distance for c in again] == pytest.approx([c.distance for c in before[mode]])
    # The model's nearest chunk is never dropped: the gate refuses on the model's distances.
    two = mapped.search(vector, QUESTION, None, 2, Mode.HYBRID)
    assert {c.chunk_id for c in two} == {ids[-1], before[Mode.DENSE][0].chunk_id}
    # The map re-scores only what each leg found within the asker's scopes.
    private = _add(store, embedder, [texts[-1]], scope="C1")  # as close to the map as the first
    mapped.sync()
    outside = mapped.search(vector, QUESTION, frozenset({"C2"}), 20, Mode.HYBRID)
    assert outside and not {c.chunk_id for c in outside} & set(private)


def test_distances_for_given_ids(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    texts = ["Expenses are approved by a manager.", "The office opens at nine."]
    ids = _add(store, embedder, texts)
    stale = _add(store, embedder, ["Expenses of another model."], model="other/model")
    index = make(store)
    index.open()
    found = index.distances_for(embedder.encode_query(QUESTION), [*ids, *stale])
    assert set(found) == set(ids)  # a chunk of another model has no distance here
    for cid, text in zip(ids, texts, strict=True):
        assert found[cid] == pytest.approx(_direct(embedder, text), abs=1e-5)


def test_sync_follows_add_replace_and_remove(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    index = make(store)
    assert index.open() == store.generation
    vector = embedder.encode_query(QUESTION)
    old = _add(store, embedder, ["Expense reimbursement needs a receipt."])
    assert index.sync() == store.generation == index.generation
    assert [c.chunk_id for c in index.search(vector, QUESTION, None, 4)] == old

    new = _add(store, embedder, ["Expense reimbursement needs a receipt and approval."])
    store.supersede([_doc_of(store, old)], by=_doc_of(store, new))
    assert index.sync() == store.generation
    assert [c.chunk_id for c in index.search(vector, QUESTION, None, 4)] == new

    store.delete_document(_doc_of(store, new))
    assert index.sync() == store.generation
    assert index.search(vector, QUESTION, None, 4) == []
    assert index.distances_for(vector, [*old, *new]) == {}


def test_rebuild_from_the_store(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    _add(store, embedder, _company_texts(6))
    index = make(store)
    index.open()
    vector = embedder.encode_query(QUESTION)
    before = index.search(vector, QUESTION, None, 4)
    assert index.rebuild() == store.generation
    assert index.search(vector, QUESTION, None, 4) == before
    assert index.check()["in_sync"] is True
    assert index.check()["searchable_chunks"] == 6


def test_chunks_of_another_model_are_never_returned(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    current = _add(store, embedder, ["The office opens at nine."])
    _add(store, embedder, [QUESTION], model="other/model")  # the exact question, stale
    index = make(store)
    index.open()
    vector = embedder.encode_query(QUESTION)
    for mode in Mode:
        assert [c.chunk_id for c in index.search(vector, QUESTION, None, 4, mode)] in (
            current,
            [],
        )


def test_health_reports_the_generation_and_the_lag(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    _add(store, embedder, ["Expenses are approved by a manager."])
    index = make(store)
    index.open()
    health = index.health()
    assert health["in_sync"] is True
    assert health["generation"] == store.generation
    _add(store, embedder, ["The office opens at nine."])
    behind = index.health()
    assert behind["in_sync"] is False
    assert behind["lag"] == 1
    index.sync()
    assert index.health()["in_sync"] is True


def test_the_engine_is_chosen_by_configuration(
    store: Store, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic import ValidationError

    from bot.settings import Settings

    monkeypatch.setenv("KB_SEARCH_ENGINE", "local")
    assert Settings(_env_file=None).index_config().search_engine == "local"  # type: ignore[call-arg]
    monkeypatch.setenv("KB_SEARCH_ENGINE", "elsewhere")
    with pytest.raises(ValidationError, match="KB_SEARCH_ENGINE"):
        Settings(_env_file=None)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="Unknown search engine 'elsewhere'"):
        open_search_index(store, embedding_model=embedder.name, dimensions=1, engine="elsewhere")


@pytest.mark.parametrize("mode", ["bm25", "hybrid"])
def test_a_passage_in_another_language_sharing_the_command_is_not_crowded_out(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex], mode: str
) -> None:
    # Forty French passages share the question's French words, more than BM25's
    # depth (each a little longer: scores in a strict order); one Danish passage
    # shares only the command.
    _add(
        store,
        embedder,
        [f"Les droits des fichiers changent{' aussi' * i}." for i in range(40)],
        language="fr",
    )
    (danish,) = _add(
        store, embedder, ["Kommandoen chmod ændrer filernes adgangsrettigheder."], language="da"
    )
    index = make(store)
    index.open()
    question = "Comment changer les droits des fichiers avec chmod ?"
    found = index.search(embedder.encode_query(question), question, None, 30, Mode(mode))
    assert danish in [c.chunk_id for c in found]
    french = [c for c in found if c.chunk_id != danish]
    # The French passages' own BM25 list is intact beside it.
    assert len(french) == 29
    assert all(c.sparse_rank is not None for c in french[:20])


def test_the_other_languages_search_keeps_to_the_askers_scopes(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    _add(store, embedder, ["Les droits des fichiers changent avec chmod."], language="fr")
    (danish,) = _add(
        store,
        embedder,
        ["Kommandoen chmod ændrer filernes adgangsrettigheder."],
        scope="C1",
        language="da",
    )
    index = make(store)
    index.open()
    question = "Comment changer les droits des fichiers avec chmod ?"
    vector = embedder.encode_query(question)
    for mode in (Mode.BM25, Mode.HYBRID):
        elsewhere = index.search(vector, question, frozenset({"C2"}), 10, mode)
        assert danish not in [c.chunk_id for c in elsewhere]
        member = index.search(vector, question, frozenset({"C1"}), 10, mode)
        assert danish in [c.chunk_id for c in member]


def test_the_dense_leg_searched_again_keeps_to_the_askers_scopes(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    public = _add(store, embedder, [*_company_texts(3), "The office opens at nine."])
    # The same text as the question's best passage, in a channel the asker is not in:
    # the nearest of all to the vector the second search moves toward it.
    (private,) = _add(store, embedder, [_company_texts(1)[0]], scope="C1")
    index = make(store)
    index.open()
    vector = embedder.encode_query(QUESTION)
    found = index.search(vector, QUESTION, frozenset({"C2"}), 5, Mode.HYBRID)
    assert {c.chunk_id for c in found} == set(public)
    for c in found:  # the distances the gate judges are the question's own
        assert c.distance == pytest.approx(
            _direct(
                embedder,
                [*_company_texts(3), "The office opens at nine."][public.index(c.chunk_id)],
            ),
            abs=1e-5,
        )
    member = index.search(vector, QUESTION, frozenset({"C1"}), 5, Mode.HYBRID)
    assert private in {c.chunk_id for c in member}


def test_passages_in_the_questions_language_are_not_crowded_out_by_a_shared_command(
    store: Store, embedder: Embedder, make: Callable[..., SearchIndex]
) -> None:
    # Thirty Danish passages each match the rare command; sixty French ones the
    # question's French words, which score lower.
    _add(store, embedder, [f"Kommandoen chmod nummer {i}." for i in range(30)], language="da")
    french = _add(
        store,
        embedder,
        [f"Les fichiers du système sont rangés dans un dossier, note {i}." for i in range(60)],
        language="fr",
    )
    index = make(store)
    index.open()
    question = "Comment changer les droits des fichiers avec chmod ?"
    vector = embedder.encode_query(question)
    found = index.search(vector, question, None, 20, Mode.BM25)
    assert sum(c.chunk_id in french for c in found) >= 8
