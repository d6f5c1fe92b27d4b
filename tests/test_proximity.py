"""Term proximity: how closely a passage holds the question's terms, a leg of the answer order
once the gate has passed, never of the gate."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.settings import Settings
from core.answer import Engine, Outcome
from core.config import EngineConfig
from core.gate import CANDIDATES_PER_KEPT, gate
from core.proximity import WINDOW, _best_window, term_proximity
from core.retrieve import Candidate, answer_order
from evaluation.kept import measure_kept
from evaluation.outcomes import Replay
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase

# "cache", "build" and "server" together in its first sentence, "expire" far away.
SCATTERED = """# Storage guide

## Housekeeping

The cache of the build server lives on the shared volume and is backed up every night by the
storage team together with the artifact store, the package mirror and the logs of the last thirty
days. Old artifacts are pruned by a job that the release managers own; they also decide which
branches keep their builds and how long a tagged release stays downloadable from the internal
portal. Entries that nobody has asked for in a while expire, and the volume is resized twice a year.
"""
# Closer to the question as a whole, but with only "cache" among its terms.
TOGETHER = """# Build cache

## Lifetime

Cache entries expire after seven days without a hit. Pinned entries never expire; pin one with
the `cache pin` command when a release depends on it.
"""
QUESTION = "cache expiry on the build server"


def test_terms_close_together_score_above_the_same_terms_far_apart() -> None:
    filler = " ".join(["word"] * 40)
    near = f"rotate the signing key every quarter. {filler}"
    far = f"rotate the schedule. {filler} the signing key"
    neither = f"{filler} nothing relevant"
    scores = term_proximity("how do I rotate the signing key", [near, far, neither])
    assert scores[0] > scores[1] > scores[2] == 0.0


def test_a_term_every_candidate_holds_weighs_almost_nothing() -> None:
    texts = ["the deploy token expires", "the deploy window", "the deploy freeze"]
    scores = term_proximity("deploy token", texts)
    # "deploy" is in all three: its weight log(1 + 0.5 / 3.5) is a tenth of "token"'s.
    assert scores[1] == scores[2] == pytest.approx(0.1335, abs=1e-3)
    assert scores[0] > 5 * scores[1]


def test_a_question_without_terms_or_no_texts_scores_nothing() -> None:
    assert term_proximity("how do I", ["how do I do it"]) == [0.0]
    assert term_proximity("signing key", []) == []


def test_the_window_counts_terms_less_than_its_width_apart() -> None:
    weight = {"a": 1.0, "b": 2.0}
    inside = ["a"] + ["x"] * (WINDOW - 2) + ["b"]  # b at position WINDOW - 1
    outside = ["a"] + ["x"] * (WINDOW - 1) + ["b"]  # b at position WINDOW
    assert _best_window(inside, weight, WINDOW) == 3.0
    assert _best_window(outside, weight, WINDOW) == 2.0


def _brute_force(terms: list[str], weight: dict[str, float], window: int) -> float:
    best = 0.0
    for start in range(len(terms)):
        seen = set(terms[start : start + window]) & set(weight)
        best = max(best, sum(weight[t] for t in seen))
    return best


def test_the_sliding_window_matches_every_window_read_one_by_one() -> None:
    rng = random.Random(7)
    weight = {"a": 1.0, "b": 0.5, "c": 2.0, "d": 0.25}
    for _ in range(300):
        terms = [rng.choice("abcdxyz") for _ in range(rng.randint(0, 60))]
        window = rng.randint(1, 12)
        assert _best_window(terms, weight, window) == pytest.approx(
            _brute_force(terms, weight, window)
        )


@pytest.fixture
def kb(tmp_path: Path, index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "scattered.md").write_text(SCATTERED, encoding="utf-8")
    (docs / "together.md").write_text(TOGETHER, encoding="utf-8")
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    kb.ingest_paths([docs])
    return kb


def _heading_of(kb: KnowledgeBase, chunk_id: int) -> str:
    return kb.store.chunks_by_id([chunk_id])[chunk_id].text.split("\n", 1)[0]


def _weights(proximity: float, sentences: float = 0.0) -> dict[str, float]:
    return {"threshold": 0.55, "sentence_weight": sentences, "proximity_weight": proximity}


async def test_proximity_reorders_an_answers_passages_and_nothing_else(
    kb: KnowledgeBase, engine_for: Callable[..., Engine]
) -> None:
    off = await engine_for(**_weights(0.0)).ask(QUESTION)
    on = await engine_for(**_weights(5.0)).ask(QUESTION)
    assert off.outcome == on.outcome == Outcome.ANSWERED
    assert _heading_of(kb, off.kept[0].chunk_id) == "Build cache > Lifetime"
    assert _heading_of(kb, on.kept[0].chunk_id) == "Storage guide > Housekeeping"
    # The same passages pass, each with its own distance: only the order moved.
    assert {(s.chunk_id, s.distance) for s in on.kept} == {
        (s.chunk_id, s.distance) for s in off.kept
    }
    assert "order" in on.timings_ms and "order" not in off.timings_ms


async def test_the_engine_and_the_evaluations_replay_keep_the_same_passages(
    kb: KnowledgeBase, embedder: Embedder, engine_for: Callable[..., Engine]
) -> None:
    engine = engine_for(**_weights(5.0, sentences=0.5))
    answer = await engine.ask(QUESTION)
    cands = engine.retrieve(QUESTION, scopes=None, k=4 * CANDIDATES_PER_KEPT)
    vector = embedder.encode_query(QUESTION)
    ordered = answer_order(
        cands, vector, QUESTION, kb.store, sentence_weight=0.5, proximity_weight=5.0
    )
    fused_first = gate(cands, threshold=0.55, top_k=4, max_kept=8, margin=0.05)[0].chunk_id
    assert ordered[0].chunk_id != fused_first  # the question is one proximity reorders
    expected = gate(ordered, threshold=0.55, top_k=4, max_kept=8, margin=0.05)
    assert [s.chunk_id for s in answer.kept] == [c.chunk_id for c in expected]
    replay = Replay(
        [cands],
        [],
        [{ordered[0].chunk_id}],
        {},
        top_k=4,
        max_kept=8,
        margin=0.05,
        kept_order=[ordered],
    )
    assert replay.outcomes(0.55, 0.7).kept_needle == [True]


async def test_a_refusal_reads_no_passage_text(engine_for: Callable[..., Engine]) -> None:
    answer = await engine_for(**_weights(5.0)).ask("What is the offside rule in football?")
    assert answer.outcome != Outcome.ANSWERED and not answer.kept
    assert "order" not in answer.timings_ms


def test_answer_order_with_both_weights_zero_is_the_fused_order(kb: KnowledgeBase) -> None:
    ids = [int(r[0]) for r in kb.store.db.execute("SELECT id FROM chunks").fetchall()]
    cands = [Candidate(cid, 0.3 + i / 10, 1.0 - i / 10) for i, cid in enumerate(ids)]
    vector = kb.embedder.encode_query(QUESTION)
    assert (
        answer_order(cands, vector, QUESTION, kb.store, sentence_weight=0, proximity_weight=0)
        == cands
    )
    # A chunk the store no longer has counts as holding no term, and is kept.
    gone = [*cands, Candidate(10_000, 0.2, 0.0)]
    ordered = answer_order(
        gone, vector, QUESTION, kb.store, sentence_weight=0, proximity_weight=1.0
    )
    assert sorted(c.chunk_id for c in ordered) == sorted(c.chunk_id for c in gone)
    assert ordered[-1].chunk_id == 10_000


def test_the_weight_is_a_setting_and_zero_turns_it_off() -> None:
    assert Settings().engine_config().proximity_weight == 0.1
    assert Settings(proximity_weight=0).engine_config().proximity_weight == 0
    with pytest.raises(ValueError, match="KB_PROXIMITY_WEIGHT"):
        Settings(proximity_weight=11)


def test_kb_evals_kept_passages_follow_the_same_order(kb: KnowledgeBase) -> None:
    rows = kb.store.db.execute("SELECT id, text FROM chunks").fetchall()
    scattered = {int(cid) for cid, text in rows if text.startswith("Storage guide")}
    vectors = kb.embedder.encode_query(QUESTION)[None, :]

    def first_kept(weight: float) -> list[bool]:
        engine = EngineConfig(threshold=0.55, sentence_weight=0.0, proximity_weight=weight)
        kept = measure_kept(
            kb, [QUESTION], vectors, [scattered], engine, threshold=0.55, reranker=None
        )
        return kept.first

    assert first_kept(0.0) == [False]
    assert first_kept(5.0) == [True]
