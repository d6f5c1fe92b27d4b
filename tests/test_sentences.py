"""Sentence vectors: cut and embedded with their chunk, stored beside it, used to order an answer's
passages once the gate has passed, never by the gate."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from bot.settings import Settings
from core.answer import Engine, Outcome, build_engine
from core.config import EngineConfig, LLMConfig
from core.gate import CANDIDATES_PER_KEPT, gate
from core.retrieve import Candidate, sentence_order
from evaluation.outcomes import Replay
from index.config import IndexConfig
from index.embed import Embedder
from index.ingest.pipeline import PIPELINE_VERSION
from index.ingest.sentences import SENTENCES_VERSION, from_blob, sentence_texts, sentences, to_blob
from index.knowledge_base import KnowledgeBase
from index.models import Chunk
from index.records import Stamp
from index.storage.store import NewDocument, Store
from tests.servers import OpenAICompatServer

SAMPLE = Path(__file__).resolve().parents[1] / "bot" / "sample"


def test_a_chunk_is_cut_at_paragraphs_and_sentence_ends() -> None:
    content = (
        "Install it with pip. Then run\nthe formatter on every file!\n\n"
        "Use the --check option in CI. It exits 1 when a file would change.\n\n"
        "See e.g. the guide for more. Done."
    )
    assert sentences(content) == [
        "Install it with pip.",
        "Then run the formatter on every file!",
        "Use the --check option in CI.",
        "It exits 1 when a file would change.",
        # A piece under 20 characters is no sentence of its own: it joins its neighbour.
        "See e.g. the guide for more. Done.",
    ]


def test_sentences_are_embedded_with_the_heading_path_and_one_sentence_is_none() -> None:
    content = "Reset the VPN password in the portal. It takes five minutes to apply."
    assert sentence_texts(f"Guide > VPN\n{content}", content) == [
        "Guide > VPN\nReset the VPN password in the portal.",
        "Guide > VPN\nIt takes five minutes to apply.",
    ]
    assert sentence_texts("Guide > VPN\nOne sentence only.", "One sentence only.") == []
    assert sentence_texts(content, content)[0] == "Reset the VPN password in the portal."


def _cand(cid: int, distance: float, score: float) -> Candidate:
    return Candidate(cid, distance, score)


def test_sentence_order_is_a_third_leg_that_only_reorders() -> None:
    query = np.array([1.0, 0.0], dtype=np.float32)
    cands = [_cand(1, 0.30, 1.2), _cand(2, 0.35, 1.0), _cand(3, 0.40, 0.9)]
    # Chunk 3 holds a sentence right on the question; chunk 1 none better than itself.
    vectors = {3: np.array([[0.0, 1.0], [1.0, 0.0]], dtype=np.float32)}
    ordered = sentence_order(cands, query, vectors, 0.5)
    # best: 1 -> 0.70 (its own), 2 -> 0.65, 3 -> 1.0; normalised 0.14, 0, 1.
    assert [c.chunk_id for c in ordered] == [3, 1, 2]
    assert ordered[0] is cands[2]  # distances and scores as they were: the gate judges alike
    assert [c.chunk_id for c in sentence_order(cands, query, vectors, 0.2)] == [1, 3, 2]
    assert sentence_order(cands, query, vectors, 0.0) == cands
    assert sentence_order(cands, query, {}, 0.5) == cands  # no sentences: the chunk's own order


def test_reordering_never_changes_whether_a_question_is_refused() -> None:
    query = np.array([1.0, 0.0], dtype=np.float32)
    cands = [_cand(1, 0.50, 1.0), _cand(2, 0.70, 0.5)]
    vectors = {2: np.array([[1.0, 0.0]], dtype=np.float32)}
    ordered = sentence_order(cands, query, vectors, 5.0)
    assert [c.chunk_id for c in ordered] == [2, 1]
    for threshold in (0.4, 0.6, 0.8):
        assert bool(gate(ordered, threshold=threshold, top_k=1)) == bool(
            gate(cands, threshold=threshold, top_k=1)
        )
    assert [c.chunk_id for c in gate(ordered, threshold=0.6, top_k=1)] == [1]


def test_sentence_vectors_are_stored_with_their_chunk(index_dir: Path) -> None:
    store = Store(index_dir)
    doc_id = store.insert_document(NewDocument(name="g", sha256="g", size=1, scope="*"))
    chunks = [Chunk(i, 0, 1, "x", "x", "") for i in range(2)]
    sentence = np.array([[0.6, 0.8, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32)
    ids = store.commit_indexed(
        doc_id,
        chunks,
        np.eye(2, 3, dtype=np.float32),
        [1, 1],
        canonical_text="xx",
        stamp=Stamp("m", 3, PIPELINE_VERSION, "1"),
        window_splits=0,
        sentence_vectors=[sentence, None],
    )
    found = store.sentence_vectors(ids)
    assert list(found) == [ids[0]]
    np.testing.assert_array_equal(found[ids[0]], sentence)
    assert to_blob(None) is None and to_blob(np.zeros((0, 3))) is None
    np.testing.assert_array_equal(from_blob(to_blob(sentence) or b"", 3), sentence)
    # Indexed again: the old chunks go, and their sentence vectors with them.
    store.commit_indexed(
        doc_id,
        chunks[:1],
        np.eye(1, 3, dtype=np.float32),
        [1],
        canonical_text="x",
        stamp=Stamp("m", 3, PIPELINE_VERSION, "1"),
        window_splits=0,
    )
    assert store.sentence_vectors(ids) == {}


@pytest.fixture
def kb(index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    kb.ingest_paths([SAMPLE / "vpn.md", SAMPLE / "expenses.md"])
    return kb


def test_ingestion_embeds_each_sentence_with_its_heading_path(
    kb: KnowledgeBase, embedder: Embedder
) -> None:
    assert PIPELINE_VERSION.endswith(f"sentences-{SENTENCES_VERSION}")
    rows = kb.store.db.execute("SELECT id, text, content FROM chunks").fetchall()
    found = kb.store.sentence_vectors([int(r[0]) for r in rows])
    several = [r for r in rows if len(sentences(r[2])) > 1]
    assert several and set(found) == {int(r[0]) for r in several}
    cid, text, content = several[0]
    expected = embedder.encode(sentence_texts(text, content))
    np.testing.assert_allclose(found[int(cid)], expected, atol=1e-4)


_OPEN: list[Engine] = []


@pytest.fixture(autouse=True)
async def _close_engines() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().aclose()


def _engine(kb: KnowledgeBase, url: str, weight: float, threshold: float = 0.55) -> Engine:
    config = EngineConfig(
        llm=LLMConfig(base_url=url, max_retries=0, timeout=2.0),
        threshold=threshold,
        sentence_weight=weight,
        proximity_weight=0.0,  # the sentence leg alone (tests/test_proximity.py: both)
    )
    engine = build_engine(config, kb)
    _OPEN.append(engine)
    return engine


async def test_an_answer_keeps_its_passages_in_sentence_order(
    kb: KnowledgeBase, embedder: Embedder, openai_server: OpenAICompatServer
) -> None:
    # A question three passages answer, whose best sentences order them otherwise
    # than the fusion (looser threshold: more than one passage kept to order).
    question, threshold = "How do I get paid back for a conference?", 0.7
    engine = _engine(kb, openai_server.url, 0.5, threshold)
    answer = await engine.ask(question)
    assert answer.outcome == Outcome.ANSWERED and "order" in answer.timings_ms
    cands = engine.retrieve(question, scopes=None, k=4 * CANDIDATES_PER_KEPT)
    vector = embedder.encode_query(question)
    found = kb.store.sentence_vectors([c.chunk_id for c in cands])
    ordered = sentence_order(cands, vector, found, 0.5)
    expected = gate(ordered, threshold=threshold, top_k=4, max_kept=8, margin=0.05)
    assert [s.chunk_id for s in answer.kept] == [c.chunk_id for c in expected]
    by_id = {c.chunk_id: c.distance for c in cands}
    assert all(s.distance == pytest.approx(by_id[s.chunk_id], abs=1e-4) for s in answer.kept)
    off = await _engine(kb, openai_server.url, 0.0, threshold).ask(question)
    fused = gate(cands, threshold=threshold, top_k=4, max_kept=8, margin=0.05)
    assert [s.chunk_id for s in off.kept] == [c.chunk_id for c in fused]
    assert {s.chunk_id for s in off.kept} == {s.chunk_id for s in answer.kept}
    # On this question the sentences do change the order, so the test sees them used.
    assert [s.chunk_id for s in off.kept] != [s.chunk_id for s in answer.kept]
    assert "order" not in off.timings_ms


async def test_a_refusal_never_reads_sentence_vectors(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> None:
    answer = await _engine(kb, openai_server.url, 0.5).ask("What is the offside rule in football?")
    assert answer.outcome != Outcome.ANSWERED and not answer.kept
    assert "order" not in answer.timings_ms


def test_kb_eval_replays_kept_passages_in_sentence_order_and_related_in_fused_order() -> None:
    def cands(*pairs: tuple[int, float]) -> list[Candidate]:
        return [Candidate(cid, d, 1.0 / (i + 1)) for i, (cid, d) in enumerate(pairs)]

    fused = [cands((1, 0.30), (2, 0.35), (3, 0.50)), cands((4, 0.45), (5, 0.48))]
    # The sentence order puts chunk 2 first for the answered query; the refused
    # one stays refused, its related passages shown as before.
    order = [cands((2, 0.35), (1, 0.30), (3, 0.50)), cands((5, 0.48), (4, 0.45))]
    correct = [{2}, {4}]
    plain = Replay(fused, [], correct, {}, top_k=1, max_kept=1, margin=0.0)
    replay = Replay(fused, [], correct, {}, top_k=1, max_kept=1, margin=0.0, kept_order=order)
    before, after = plain.outcomes(0.4, 0.6), replay.outcomes(0.4, 0.6)
    assert (before.kept_needle, after.kept_needle) == ([False, False], [True, False])
    assert before.answered == after.answered == [True, False]
    assert before.shown[1] and after.shown[1]  # still shown among the related passages


def test_the_weight_is_a_setting_and_zero_turns_it_off() -> None:
    assert Settings(sentence_weight=0).engine_config().sentence_weight == 0
    assert Settings().engine_config().sentence_weight == 0.5
    with pytest.raises(ValueError, match="KB_SENTENCE_WEIGHT"):
        Settings(sentence_weight=-1)
