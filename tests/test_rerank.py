"""The cross-encoder reranker (``KB_RERANKER``): after the gate, never past it.

The model is a tiny BERT cross-encoder built here from a config (random
weights, fixed seed) with the bundled MiniLM tokenizer, saved to a temporary
folder and loaded through sentence-transformers like any local model: no
download, and scores that are arbitrary but deterministic, which is what the
plumbing needs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.app import load_reranker
from core.answer import Engine, Outcome, build_engine
from core.config import EngineConfig
from core.gate import CANDIDATES_PER_KEPT
from core.rerank import Reranker, RerankerUnavailable, passage_text, rerank
from core.retrieve import Candidate
from index.knowledge_base import KnowledgeBase
from tests.tiny_models import tiny_cross_encoder as tiny_model

QUESTION = "How do I get reimbursed for a conference ticket?"
OUT_OF_DOMAIN = "What is the offside rule in football?"


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny-cross-encoder"))


@pytest.fixture
def kb(sample_kb: KnowledgeBase) -> KnowledgeBase:
    return sample_kb  # bot/sample ingested (a copy of the session's)


_OPEN: list[Engine] = []


def _engine(kb: KnowledgeBase, **kw: object) -> Engine:
    config = EngineConfig(link_base_url="https://kb.example.com", **kw)  # type: ignore[arg-type]
    engine = build_engine(config, kb)
    _OPEN.append(engine)
    return engine


@pytest.fixture(autouse=True)
async def _close_engines() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().aclose()


def test_the_local_model_scores_pairs_deterministically(tiny_cross_encoder: Path) -> None:
    reranker = Reranker(str(tiny_cross_encoder))
    assert not reranker.loaded and reranker.name == f"local:{tiny_cross_encoder.name}"
    passages = ["Conference tickets are reimbursed.", "Parking is in garage B.", "Bikes go below."]
    first = reranker.scores(QUESTION, passages)
    assert reranker.loaded and len(first) == 3
    assert reranker.scores(QUESTION, passages) == first
    assert len(set(first)) == 3
    assert reranker.scores(QUESTION, []) == []


def test_a_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    reranker = Reranker(str(tmp_path / "no-such-model"))
    with pytest.raises(RerankerUnavailable, match="KB_RERANKER"):
        reranker.scores(QUESTION, ["a passage"])


async def test_it_chooses_among_passing_passages_only(
    kb: KnowledgeBase, tiny_cross_encoder: Path
) -> None:
    reranker = Reranker(str(tiny_cross_encoder))
    # The candidates the engine fetches for two kept passages.
    candidates = _engine(kb).retrieve(QUESTION, scopes=None, k=2 * CANDIDATES_PER_KEPT)
    rows = kb.store.chunks_by_id([c.chunk_id for c in candidates])
    scores = reranker.scores(QUESTION, [passage_text(rows[c.chunk_id]) for c in candidates])
    by_score = [c for _, c in sorted(zip(scores, candidates, strict=True), key=lambda p: -p[0])]
    closest = min(candidates, key=lambda c: c.distance)
    # The reranker's favourite that is not the closest passage: a threshold just
    # under its distance turns it away while the closest still passes.
    favourite = next(c for c in by_score if c.chunk_id != closest.chunk_id)
    threshold = favourite.distance - 1e-6
    passing = [c for c in candidates if c.distance <= threshold]
    assert closest in passing and favourite not in passing

    chosen = rerank(reranker, QUESTION, candidates, rows, threshold=threshold, keep=2)
    assert chosen == [c for c in by_score if c.distance <= threshold][:2]
    assert favourite not in chosen

    # The engine keeps as many as the gate alone does, chosen by the reranker.
    plain = await _engine(kb, threshold=threshold, top_k=2).ask(QUESTION)
    engine = _engine(kb, threshold=threshold, top_k=2, reranker=str(tiny_cross_encoder))
    answer = await engine.ask(QUESTION)
    expected = [c for c in by_score if c.distance <= threshold][: len(plain.kept)]
    assert [s.chunk_id for s in answer.kept] == [c.chunk_id for c in expected]
    assert all(s.distance <= threshold for s in answer.kept)
    assert favourite.chunk_id not in {s.chunk_id for s in answer.kept}
    assert "rerank" in answer.timings_ms


async def test_it_reorders_what_the_gate_kept(kb: KnowledgeBase, tiny_cross_encoder: Path) -> None:
    plain = await _engine(kb, threshold=1.0, top_k=3).ask(QUESTION)
    reranked = await _engine(kb, threshold=1.0, top_k=3, reranker=str(tiny_cross_encoder)).ask(
        QUESTION
    )
    # The gate decides how many; the reranker which ones and in what order.
    assert len(reranked.kept) == len(plain.kept) >= 3
    assert [s.chunk_id for s in reranked.kept] != [s.chunk_id for s in plain.kept]
    assert [s.n for s in reranked.kept] == list(range(1, len(plain.kept) + 1))


async def test_a_refusal_never_loads_or_calls_the_reranker(
    kb: KnowledgeBase, tiny_cross_encoder: Path
) -> None:
    engine = _engine(kb, threshold=0.2, reranker=str(tiny_cross_encoder))
    answer = await engine.ask(OUT_OF_DOMAIN)
    assert answer.kept == [] and answer.model_called is False
    assert answer.outcome != Outcome.ANSWERED
    assert engine.reranker is not None and not engine.reranker.loaded
    assert "rerank" not in answer.timings_ms


async def test_a_broken_reranker_keeps_the_fused_order(kb: KnowledgeBase, tmp_path: Path) -> None:
    plain = await _engine(kb, threshold=1.0).ask(QUESTION)
    broken = await _engine(kb, threshold=1.0, reranker=str(tmp_path / "missing")).ask(QUESTION)
    assert [s.chunk_id for s in broken.kept] == [s.chunk_id for s in plain.kept]
    assert broken.outcome == plain.outcome


def test_nothing_to_keep_asks_nothing(tiny_cross_encoder: Path) -> None:
    reranker = Reranker(str(tiny_cross_encoder))
    far = [Candidate(chunk_id=1, distance=0.9, score=0.1)]
    assert rerank(reranker, QUESTION, far, {}, threshold=0.5, keep=4) == []
    assert not reranker.loaded


def test_a_server_loads_the_reranker_at_start(
    kb: KnowledgeBase, tiny_cross_encoder: Path, tmp_path: Path
) -> None:
    assert load_reranker(_engine(kb)) is False
    ready = _engine(kb, reranker=str(tiny_cross_encoder))
    assert load_reranker(ready) is True and ready.reranker is not None and ready.reranker.loaded
    # One that cannot load does not stop the server: answers keep the fused order.
    assert load_reranker(_engine(kb, reranker=str(tmp_path / "missing"))) is False
