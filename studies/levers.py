"""The retrieval levers side by side on one evaluation set: BM25 terms, fields, fusion, feedback.

Measures the local engine's internals (its snapshot, a variant BM25 beside its
FAISS), so it reaches past ``SearchIndex`` on purpose.

Indexes a bundled set once with the product's ingestion, then searches it with
every variant below and prints one table. Each variant changes the BM25 leg's
analysis (``index.search.tokens.Analyzer``), the fusion (``core.retrieve.Fusion``) or
adds pseudo-relevance feedback; the dense leg is the same for all. ``base`` is
the build before these levers (the tokeniser alone, RRF k = 60 with equal
weights); ``product`` is what the bot does now. Every other row is compared
with ``base``, paired over the same queries (exact two-sided sign test on the
discordant pairs), and hybrid with dense alone.

Columns: recall at 1/4/8/20 with a 95 % Wilson interval at 4, MRR over the top
20, R@4 of the support-ticket phrasings alone, *answerable* (the needle among
the passages the gate keeps at the configured threshold, ``top_k`` of
``top_k x 5`` fused candidates, as ``Engine.ask``), then the paired tests.

Run: python -m studies.levers [--set NAME] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from bot.settings import Settings
from core.gate import CANDIDATES_PER_KEPT, gate
from core.retrieve import (
    DEFAULT_DEPTH,
    FUSION,
    Candidate,
    Fusion,
    LocalBackend,
    Mode,
    fuse,
)
from evaluation.inputs import DEFAULT_SET, bundled_set, load_ood, load_questions
from evaluation.results import bootstrap_mean
from evaluation.run import indexed_corpus
from evaluation.stats import hits_at_k, mrr, paired_counts, sign_test, wilson_interval
from index.embed import load_embedder
from index.search.bm25 import DEFAULT_B, DEFAULT_K1, BM25Index
from index.search.derived import Snapshot
from index.search.tokens import (
    ANALYZER,
    LUCENE_STOP_WORDS,
    PLAIN,
    Analyzer,
)

DEPTH = 20


@dataclass(frozen=True)
class Variant:
    """One way of searching: the BM25 analysis, the fusion, optional feedback."""

    name: str
    analyzer: Analyzer = ANALYZER
    fusion: Fusion = FUSION
    # Pseudo-relevance feedback: (chunks, terms, weight) taken from the first pass.
    feedback: tuple[int, int, int] | None = None
    depth: int = DEFAULT_DEPTH
    bm25: tuple[float, float] = (DEFAULT_K1, DEFAULT_B)  # (k1, b)
    # Another normalisation for score fusion, measured here only: "zscore" or "max".
    normalise: str = ""
    note: str = ""


def variants() -> list[Variant]:
    """Today's build, each lever alone on top of it, then combinations, then the product."""
    stem = Analyzer(stop_words=frozenset())
    weighted = Fusion(sparse=0.5)
    score = Fusion(method="score", sparse=0.5)
    return [
        Variant("base", PLAIN, Fusion(), note="tokeniser alone, RRF k=60 1:1 (before)"),
        Variant("stem", stem, Fusion(), note="+ Porter2 stemming"),
        Variant("stem+lucene-stop", Analyzer(stop_words=LUCENE_STOP_WORDS), Fusion()),
        Variant("stem+stop", ANALYZER, Fusion(), note="+ question stop words (queries)"),
        Variant("stem+stop-docs", Analyzer(stop_documents=True), Fusion()),
        Variant("stem+stop+header2", Analyzer(header_weight=2), Fusion()),
        Variant("stem+stop+header3", Analyzer(header_weight=3), Fusion()),
        Variant("plain rrf 1:0.5", PLAIN, weighted),
        Variant("stem+stop rrf 1:0.5", ANALYZER, weighted),
        Variant("stem+stop rrf 1:0.75", ANALYZER, Fusion(sparse=0.75)),
        Variant("stem+stop rrf 1:0.5 k=20", ANALYZER, Fusion(k=20, sparse=0.5)),
        Variant("stem+stop rrf 1:0.5 k=100", ANALYZER, Fusion(k=100, sparse=0.5)),
        Variant("stem+stop score 1:1", ANALYZER, Fusion(method="score")),
        Variant("stem+stop score 1:0.5", ANALYZER, Fusion(method="score", sparse=0.5)),
        Variant("stem+stop score 1:0.3", ANALYZER, Fusion(method="score", sparse=0.3)),
        Variant("plain score 1:1", PLAIN, Fusion(method="score")),
        Variant("plain score 1:0.5", PLAIN, score),
        Variant("stem score 1:0.5", stem, score),
        Variant("stem+lucene-stop score 1:0.5", Analyzer(stop_words=LUCENE_STOP_WORDS), score),
        Variant("stem+stop+header2 score 1:0.5", Analyzer(header_weight=2), score),
        Variant("stem+stop score 1:0.5 prf 5x10", ANALYZER, score, feedback=(5, 10, 1)),
        Variant("stem+stop zscore 1:0.5", ANALYZER, score, normalise="zscore"),
        Variant("stem+stop zscore 1:1", ANALYZER, Fusion(method="score"), normalise="zscore"),
        Variant("stem+stop max 1:0.5", ANALYZER, score, normalise="max"),
        Variant("stem+stop score 1:0.5 bm25 k1=0.9 b=0.4", ANALYZER, score, bm25=(0.9, 0.4)),
        Variant("stem+stop score 1:0.5 bm25 k1=1.2 b=0.5", ANALYZER, score, bm25=(1.2, 0.5)),
        Variant("stem+stop score 1:0.5 bm25 k1=1.5 b=0.75", ANALYZER, score, bm25=(1.5, 0.75)),
        Variant("stem+stop score 1:0.5 depth 50", ANALYZER, score, depth=50),
        Variant("stem+stop score 1:0.5 depth 100", ANALYZER, score, depth=100),
        Variant("stem+stop rrf 1:0.5 prf 3x5", ANALYZER, weighted, feedback=(3, 5, 1)),
        Variant("stem+stop rrf 1:0.5 prf 5x10", ANALYZER, weighted, feedback=(5, 10, 1)),
        Variant("product", ANALYZER, FUSION, note="what the bot does now"),
    ]


@dataclass
class Row:
    """One variant's per-query results."""

    variant: Variant
    ranks: list[int | None] = field(default_factory=list)
    answerable: list[bool] = field(default_factory=list)
    refused: list[bool] = field(default_factory=list)
    bluffs: list[bool] = field(default_factory=list)
    ms: float = 0.0


class _Fixed:
    """A snapshot holder for ``LocalBackend`` (the variant's BM25 beside the shared FAISS)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot


def _rank(ids: Sequence[int], correct: set[int]) -> int | None:
    return next((i for i, c in enumerate(ids, start=1) if c in correct), None)


def _feedback_search(
    snap: Snapshot, texts: dict[int, str], variant: Variant
) -> Callable[[np.ndarray, str, int], list[Candidate]]:
    """A search that re-runs BM25 with the best terms of the first pass's top chunks."""
    assert variant.feedback is not None
    chunks, n_terms, weight = variant.feedback
    bm25, analyzer = snap.bm25, variant.analyzer
    df: Counter[str] = Counter()
    for text in texts.values():
        df.update(set(analyzer.document_terms(text)))
    n = len(texts)

    def search(vec: np.ndarray, query: str, k: int) -> list[Candidate]:
        dense = snap.vectors.search(vec, max(k, variant.depth))
        terms = analyzer.query_terms(query)
        first = fuse(dense, bm25.search_terms(terms, max(k, variant.depth)), variant.fusion)
        counts: Counter[str] = Counter()
        for cid, _ in first[:chunks]:
            counts.update(analyzer.document_terms(texts[cid]))
        scored = {t: c * np.log1p((n - df[t] + 0.5) / (df[t] + 0.5)) for t, c in counts.items()}
        extra = [t for t, _ in sorted(scored.items(), key=lambda kv: -kv[1]) if t not in terms]
        expanded = terms * weight + extra[:n_terms]
        fused = fuse(dense, bm25.search_terms(expanded, max(k, variant.depth)), variant.fusion)[:k]
        dist = dict(snap.vectors.distances_for(vec, [cid for cid, _ in fused]))
        return [Candidate(cid, float(dist[cid]), s) for cid, s in fused]

    return search


def _normalised(values: list[float], how: str) -> list[float]:
    arr = np.asarray(values, dtype=np.float64)
    if not arr.size:
        return []
    if how == "zscore":
        return list((arr - arr.mean()) / (arr.std() or 1.0))
    return list(arr / (arr.max() or 1.0))  # "max": a fraction of the best, 0 stays 0


def _normalised_search(
    snap: Snapshot, variant: Variant
) -> Callable[[np.ndarray, str, int], list[Candidate]]:
    """Score fusion with another per-list normalisation; an absent item gets the list's least."""

    def search(vec: np.ndarray, query: str, k: int) -> list[Candidate]:
        dense = snap.vectors.search(vec, max(k, variant.depth))
        sparse = snap.bm25.search(query, max(k, variant.depth))
        legs = [
            ([c for c, _ in dense], _normalised([1.0 - d for _, d in dense], variant.normalise)),
            ([c for c, _ in sparse], _normalised([s for _, s in sparse], variant.normalise)),
        ]
        weights = (variant.fusion.dense, variant.fusion.sparse)
        ids = list(dict.fromkeys([c for c, _ in dense] + [c for c, _ in sparse]))
        total = dict.fromkeys(ids, 0.0)
        for (leg_ids, values), w in zip(legs, weights, strict=True):
            floor = min(values, default=0.0) if variant.normalise == "zscore" else 0.0
            got = dict(zip(leg_ids, values, strict=True))
            for c in ids:
                total[c] += w * got.get(c, floor)
        fused = sorted(total.items(), key=lambda kv: -kv[1])[:k]
        dist = dict(snap.vectors.distances_for(vec, [c for c, _ in fused]))
        return [Candidate(c, float(dist[c]), s) for c, s in fused]

    return search


def run(set_name: str) -> tuple[list[Row], dict[str, object]]:
    """Index the set once and search it with every variant."""
    settings = Settings()
    embedder = load_embedder(settings.index_config())
    paths = bundled_set(set_name)
    questions, ood = load_questions(paths.questions), load_ood(paths.ood)
    engine = settings.engine_config()
    texts_in = [t for q in questions for t in q.phrasings()]
    qindex = [i for i, _ in enumerate(questions) for _ in range(2)]
    vectors = [embedder.encode_query(t) for t in texts_in]
    ood_vectors = [embedder.encode_query(o.question) for o in ood]
    rows: list[Row] = []
    with indexed_corpus(paths.corpus, settings.index_config(), embedder) as kb:
        snap = kb.indexes.snapshot
        db_rows = kb.store.db.execute("SELECT id, text, content FROM chunks").fetchall()
        texts = {int(r[0]): r[1] for r in db_rows if int(r[0]) in set(snap.chunk_ids.tolist())}
        contents = {cid: r[2] for r in db_rows if (cid := int(r[0])) in texts}
        correct = [{c for c, body in contents.items() if q.needle in body} for q in questions]
        ids = sorted(texts)
        built: dict[tuple[Analyzer, tuple[float, float]], BM25Index] = {}
        dense_row = Row(Variant("dense only"))
        dense_backend = LocalBackend(_Fixed(snap))  # type: ignore[arg-type]
        for vec, qi in zip(vectors, qindex, strict=True):
            found = dense_backend.search(vec, "", None, DEPTH, Mode.DENSE)
            dense_row.ranks.append(_rank([c.chunk_id for c in found], correct[qi]))
        for v in variants():
            key = (v.analyzer, v.bm25)
            if key not in built:
                k1, b = v.bm25
                chunk_texts = [texts[i] for i in ids]
                built[key] = BM25Index(ids, chunk_texts, k1=k1, b=b, analyzer=v.analyzer)
            vsnap = replace(snap, bm25=built[key])
            if v.feedback:
                search = _feedback_search(vsnap, texts, v)
            elif v.normalise:
                search = _normalised_search(vsnap, v)
            else:
                backend = LocalBackend(
                    _Fixed(vsnap),  # type: ignore[arg-type]
                    depth=v.depth,
                    fusion=v.fusion,
                )

                def search(vec: np.ndarray, q: str, k: int, b: LocalBackend = backend) -> list:
                    return b.search(vec, q, None, k, Mode.HYBRID)

            rows.append(
                _measure(
                    v,
                    search,
                    texts_in,
                    vectors,
                    qindex,
                    correct,
                    ood,
                    ood_vectors,
                    engine.threshold,
                    engine.top_k,
                )
            )
        info = {
            "set": set_name,
            "chunks": len(ids),
            "queries": len(texts_in),
            "ood": len(ood),
            "threshold": engine.threshold,
            "top_k": engine.top_k,
        }
        rows.insert(0, dense_row)
    return rows, info


def _measure(
    v: Variant,
    search: Callable[[np.ndarray, str, int], list[Candidate]],
    texts: list[str],
    vectors: list[np.ndarray],
    qindex: list[int],
    correct: list[set[int]],
    ood: Sequence[object],
    ood_vectors: list[np.ndarray],
    threshold: float,
    top_k: int,
) -> Row:
    row = Row(v)
    started = time.perf_counter()
    for text, vec, qi in zip(texts, vectors, qindex, strict=True):
        cands = search(vec, text, max(DEPTH, top_k * CANDIDATES_PER_KEPT))
        row.ranks.append(_rank([c.chunk_id for c in cands], correct[qi]))
        kept = gate(cands, threshold=threshold, top_k=top_k)
        row.refused.append(not kept)
        row.answerable.append(any(c.chunk_id in correct[qi] for c in kept))
    row.ms = 1000 * (time.perf_counter() - started) / max(1, len(texts))
    for o, vec in zip(ood, ood_vectors, strict=True):
        cands = search(vec, o.question, top_k * CANDIDATES_PER_KEPT)  # type: ignore[attr-defined]
        row.bluffs.append(bool(gate(cands, threshold=threshold, top_k=top_k)))
    return row


def _test(a: Sequence[bool], b: Sequence[bool]) -> str:
    wins, losses = paired_counts(a, b)
    return f"+{wins}/-{losses} p={sign_test(wins, losses):.3g}"


def table(rows: list[Row], info: dict[str, object]) -> str:
    """The Markdown table of every variant."""
    base = next(r for r in rows if r.variant.name == "base")
    dense = rows[0]
    n = len(base.ranks)
    lines = [
        f"Set `{info['set']}`: {info['chunks']} chunks, {n} queries, {info['ood']} out-of-domain; "
        f"gate at {info['threshold']} keeps {info['top_k']}.",
        "",
        "| variant | R@1 | R@4 | R@8 | R@20 | MRR | ticket R@4 | answerable | bluffs "
        "| R@4 vs base | R@1 vs base | R@4 vs dense | ms/q |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        h = {k: hits_at_k(r.ranks, k) for k in (1, 4, 8, 20)}
        lo, hi = wilson_interval(sum(h[4]), n)
        ticket = h[4][1::2]
        m = bootstrap_mean([1.0 / x if x else 0.0 for x in r.ranks])
        cells = [
            r.variant.name,
            f"{sum(h[1]) / n:.3f}",
            f"{sum(h[4]) / n:.3f} [{lo:.2f}, {hi:.2f}]",
            f"{sum(h[8]) / n:.3f}",
            f"{sum(h[20]) / n:.3f}",
            f"{mrr(r.ranks):.3f} [{m.low:.2f}, {m.high:.2f}]",
            f"{sum(ticket) / len(ticket):.3f}",
            f"{sum(r.answerable)}/{n}" if r.answerable else "",
            f"{sum(r.bluffs)}/{len(r.bluffs)}" if r.bluffs else "",
            _test(h[4], hits_at_k(base.ranks, 4)) if r is not dense else "",
            _test(h[1], hits_at_k(base.ranks, 1)) if r is not dense else "",
            _test(h[4], hits_at_k(dense.ranks, 4)) if r is not dense else "",
            f"{r.ms:.1f}" if r.ms else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    """Measure every variant on one set and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default=DEFAULT_SET, help="a bundled evaluation set")
    parser.add_argument("--json-out", default=None, help="also write per-query ranks here")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows, info = run(args.set)
    print(table(rows, info))
    if args.json_out:
        data = {
            **info,
            "variants": [
                {"name": r.variant.name, "ranks": r.ranks, "answerable": r.answerable} for r in rows
            ],
        }
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(data, f)


if __name__ == "__main__":
    main()
