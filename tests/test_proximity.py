"""Term proximity: how closely a passage holds the question's terms, a leg of the answer order
once the gate has passed, never of the gate."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

import core.retrieve
from bot.settings import Settings
from core.answer import Engine, Outcome
from core.config import EngineConfig
from core.gate import CANDIDATES_PER_KEPT, gate
from core.proximity import WINDOW, _best_window, term_proximity
from core.retrieve import Candidate, Mode, answer_order
from evaluation.kept import measure_kept
from evaluation.outcomes import Replay
from evaluation.run import _answer_ordered
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase

# "cache", "build" and "server" together in its first sentence ("expire" is not
# "expiry": they stem apart).
SCATTERED = """# Storage guide

## Housekeeping

The cache of the build server lives on the shared volume and is backed up every night by the
storage team together with the artifact store, the package mirror and the logs of the last thirty
days. Old artifacts are pruned by a job that the release managers own; they also decide which
branches keep their builds and how long a tagged release stays downloadable from the internal
portal. Entries that nobody has asked for in a while expire, and the volume is resized twice a year.
"""
# Closer to the question as a whole, but holding only "build" (in its heading) and "cache".
TOGETHER = """# Build cache

## Lifetime

Cache entries expire after seven days without a hit. Pinned entries never expire; pin one with
the `cache pin` command when a release depends on it.
"""
# A third candidate: "server" and "cache" a sentence apart.
PROXY = """# Proxy

## Responses

The proxy answers repeated requests itself. Its cache holds a response for an hour, and the
origin server is asked again after that.
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
    # "deploy" is in all three texts, "token" in one: weights log(1 + 0.5 / 3.5)
    # and log(1 + 2.5 / 1.5), so "deploy" alone holds an eighth of the question.
    deploy, token = math.log1p(0.5 / 3.5), math.log1p(2.5 / 1.5)
    assert scores[0] == 1.0
    assert scores[1] == scores[2] == pytest.approx(deploy / (deploy + token))


def test_a_term_weighs_by_the_texts_holding_it_not_by_its_repeats() -> None:
    # "cache" and "server" are each in two of the three texts: equal weights,
    # however often the first text repeats "cache".
    scores = term_proximity("cache server", ["cache cache cache cache", "server", "cache server"])
    assert scores == [0.5, 0.5, 1.0]


def test_a_window_must_span_a_term() -> None:
    with pytest.raises(ValueError, match="at least 1 term"):
        term_proximity("cache", ["cache"], window=0)


def test_a_question_without_terms_or_no_texts_scores_nothing() -> None:
    assert term_proximity("how do I", ["how do I do it"]) == [0.0]
    assert term_proximity("signing key", []) == []


def test_the_window_counts_terms_less_than_its_width_apart() -> None:
    weight = {"a": 1.0, "b": 2.0}
    inside = ["a"] + ["x"] * (WINDOW - 2) + ["b"]  # b at position WINDOW - 1
    outside = ["a"] + ["x"] * (WINDOW - 1) + ["b"]  # b at position WINDOW
    assert _best_window(inside, weight, WINDOW) == 3.0
    assert _best_window(outside, weight, WINDOW) == 2.0


def test_the_question_scores_its_terms_within_the_window_only() -> None:
    inside = "signing " + "x " * (WINDOW - 2) + "key"
    outside = "signing " + "x " * (WINDOW - 1) + "key"
    # Each term is in both texts, so each weighs half the question.
    assert term_proximity("signing key", [inside, outside]) == [1.0, 0.5]


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


async def test_a_refusal_never_scores_term_proximity(
    engine_for: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def counted(
        question: str,
        texts: Sequence[str],
        window: int = WINDOW,
        languages: Sequence[str | None] | None = None,
    ) -> list[float]:
        calls.append(question)
        return term_proximity(question, texts, window, languages)

    # Observed, not replaced: the real function still gives every score.
    monkeypatch.setattr(core.retrieve, "term_proximity", counted)
    engine = engine_for(**_weights(5.0))
    refused = await engine.ask("What is the offside rule in football?")
    assert refused.outcome != Outcome.ANSWERED and not refused.kept
    assert calls == [] and "order" not in refused.timings_ms
    answered = await engine.ask(QUESTION)
    assert answered.outcome == Outcome.ANSWERED and calls == [QUESTION]


def test_answer_order_with_both_weights_zero_is_the_fused_order(kb: KnowledgeBase) -> None:
    ids = [int(r[0]) for r in kb.store.db.execute("SELECT id FROM chunks").fetchall()]
    cands = [Candidate(cid, 0.3 + i / 10, 1.0 - i / 10) for i, cid in enumerate(ids)]
    vector = kb.embedder.encode_query(QUESTION)
    assert (
        answer_order(cands, vector, QUESTION, kb.store, sentence_weight=0, proximity_weight=0)
        == cands
    )
    # A chunk the store no longer has holds no term: first by its fused score
    # alone, it falls behind the others' proximity, and stays a candidate.
    gone = [Candidate(10_000, 0.2, 2.0), *cands]
    ordered = answer_order(
        gone, vector, QUESTION, kb.store, sentence_weight=0, proximity_weight=5.0
    )
    assert sorted(c.chunk_id for c in ordered) == sorted(c.chunk_id for c in gone)
    assert ordered[0].chunk_id != 10_000


def _ordered_by(cands: list[Candidate], legs: list[tuple[list[float], float]]) -> list[int]:
    total = [c.score + sum(w * values[i] for values, w in legs) for i, c in enumerate(cands)]
    return [cands[i].chunk_id for i in sorted(range(len(cands)), key=lambda i: -total[i])]


def test_both_legs_add_their_weighted_values_to_the_fused_score(
    kb: KnowledgeBase, tmp_path: Path
) -> None:
    (tmp_path / "proxy.md").write_text(PROXY, encoding="utf-8")
    kb.ingest_paths([tmp_path / "proxy.md"])
    ids = [int(r[0]) for r in kb.store.db.execute("SELECT id FROM chunks").fetchall()]
    assert len(ids) == 3
    vector = kb.embedder.encode_query(QUESTION)
    found = kb.store.sentence_vectors(ids)
    rows = kb.store.chunks_by_id(ids)
    # Every candidate at distance 0.3: one without sentence vectors counts 0.7.
    near = [float((found[cid] @ vector).max()) if cid in found else 0.7 for cid in ids]
    sentences = [(v - min(near)) / (max(near) - min(near)) for v in near]
    proximity = term_proximity(QUESTION, [rows[cid].text for cid in ids])
    rng = random.Random(3)
    differs = 0
    for _ in range(40):
        cands = [Candidate(cid, 0.3, rng.random()) for cid in ids]
        w_s, w_p = rng.uniform(0.1, 2.0), rng.uniform(0.1, 2.0)
        both = _ordered_by(cands, [(sentences, w_s), (proximity, w_p)])
        got = answer_order(
            cands, vector, QUESTION, kb.store, sentence_weight=w_s, proximity_weight=w_p
        )
        assert [c.chunk_id for c in got] == both
        alone = (_ordered_by(cands, [(sentences, w_s)]), _ordered_by(cands, [(proximity, w_p)]))
        differs += both not in alone
    assert differs  # some draws need both legs, so the check above has teeth


def test_kb_evals_gate_replay_orders_by_proximity_alone(kb: KnowledgeBase) -> None:
    vector = kb.embedder.encode_query(QUESTION)
    cands = kb.search_index.search(vector, QUESTION, None, 20, Mode.HYBRID)
    engine = EngineConfig(sentence_weight=0.0, proximity_weight=5.0)
    replayed = _answer_ordered(kb, [cands], [QUESTION], vector[None, :], engine)
    expected = answer_order(
        cands, vector, QUESTION, kb.store, sentence_weight=0.0, proximity_weight=5.0
    )
    assert replayed == [expected] and expected[0].chunk_id != cands[0].chunk_id
    assert (
        _answer_ordered(
            kb,
            [cands],
            [QUESTION],
            vector[None, :],
            EngineConfig(sentence_weight=0.0, proximity_weight=0.0),
        )
        is None
    )


def test_the_weight_is_a_setting_and_zero_turns_it_off() -> None:
    assert Settings().engine_config().proximity_weight == 0.2
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
