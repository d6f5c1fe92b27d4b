"""Sentence-level vectors as a ranking signal after the gate, on one evaluation set.

Reads the local engine's snapshot (both legs' raw lists) past ``SearchIndex``,
on purpose: the variants need every candidate's similarities.

The gate keeps judging on the chunk vectors: every variant here only re-orders
the product's own 20 fused candidates (the list ``Engine.ask`` gates), so which
questions are refused or bluffed, and every distance shown or logged, cannot
change. What can change is the order, hence R@1/R@4/R@8, MRR and which passages
the gate keeps (the first ``top_k`` that pass).

Sentences: ``index.ingest.sentences.sentences`` (each chunk's ``content`` cut into
paragraphs and paragraphs at sentence ends with the chunker's own patterns; a
piece under 20 characters joins its neighbour). Each sentence is embedded with the chunk's heading path
(``header + "\\n" + sentence``, the way the chunk itself is embedded). A chunk of
one sentence has no sentence vector of its own: its chunk vector stands in.

Variants (``sim`` is cosine similarity to the query, ``best`` the chunk's best
sentence):

* ``max``: the dense leg scores ``max(sim(chunk), sim(best))``, then the
  product's score fusion with BM25 (1 : 0.5);
* ``mix w``: the dense leg scores ``(1 - w) sim(chunk) + w sim(best)``;
* ``leg w``: a third leg in the product's ``score_fusion``: the candidates by
  ``sim(best)``, weight ``w`` beside dense 1.0 and BM25 0.5.

Weights are chosen on pip-black and confirmed on prometheus (the rule of
docs/evaluation.md). The sentence vectors of a set are embedded once and cached
under ``--cache`` (keyed by the texts), the corpus is indexed by the product's
ingestion on every run.

Run: python -m studies.sentences [--set NAME] [--cache DIR] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bot.settings import Settings
from core.gate import CANDIDATES_PER_KEPT, gate
from core.retrieve import DEFAULT_DEPTH, FUSION, fuse, score_fusion
from evaluation.inputs import DEFAULT_SET, bundled_set, load_ood, load_questions
from evaluation.results import bootstrap_mean
from evaluation.run import indexed_corpus
from evaluation.stats import hits_at_k, mrr, paired_counts, sign_test, wilson_interval
from index.embed import Embedder, load_embedder
from index.ingest.sentences import sentences

POOL = 20  # top_k x CANDIDATES_PER_KEPT: the candidates Engine.ask gates
QUERY_TIMING_CHUNKS = 10_000


@dataclass
class SentenceVectors:
    """Per chunk, its sentence vectors (``None``: one sentence, the chunk vector stands in)."""

    by_chunk: dict[int, np.ndarray]
    count: int
    embed_s: float


def sentence_vectors(
    embedder: Embedder, chunks: dict[int, tuple[str, str]], cache: Path
) -> SentenceVectors:
    """Embed every chunk's sentences with its heading path, length-sorted, cached on disk."""
    owners: list[int] = []
    texts: list[str] = []
    for cid in sorted(chunks):
        header, content = chunks[cid]
        parts = sentences(content)
        if len(parts) < 2:
            continue
        for s in parts:
            owners.append(cid)
            texts.append(f"{header}\n{s}" if header else s)
    key = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
    path = cache / f"sentences-{key}.npy"
    started = time.perf_counter()
    if path.exists():
        vecs = np.load(path)
        took = float(json.loads(path.with_suffix(".json").read_text())["embed_s"])
    else:
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        sorted_vecs = embedder.encode([texts[i] for i in order], batch_size=64)
        vecs = np.empty_like(sorted_vecs)
        vecs[order] = sorted_vecs
        took = time.perf_counter() - started
        cache.mkdir(parents=True, exist_ok=True)
        np.save(path, vecs)
        path.with_suffix(".json").write_text(json.dumps({"embed_s": took, "n": len(texts)}))
    by_chunk: dict[int, list[int]] = {}
    for i, cid in enumerate(owners):
        by_chunk.setdefault(cid, []).append(i)
    return SentenceVectors({c: vecs[ix] for c, ix in by_chunk.items()}, len(texts), took)


@dataclass(frozen=True)
class Lists:
    """What the product's search saw for one query, and each candidate's similarities."""

    dense: list[tuple[int, float]]  # (id, distance), the dense leg
    sparse: list[tuple[int, float]]  # (id, BM25 score)
    chunk_sim: dict[int, float]  # every id of either leg
    best_sim: dict[int, float]  # its best sentence (the chunk itself for one sentence)


Rerank = Callable[[Lists, list[int]], list[int]]


def product_pool(lists: Lists) -> list[int]:
    """The product's fused order, the pool every variant re-orders."""
    return [cid for cid, _ in fuse(lists.dense, lists.sparse, FUSION)[:POOL]]


def _refused_dense(lists: Lists, score: Callable[[int], float], pool: list[int]) -> list[int]:
    dense = [(cid, score(cid)) for cid, _ in lists.dense]
    fused = score_fusion([dense, lists.sparse], [FUSION.dense, FUSION.sparse])
    keep = set(pool)
    return [cid for cid, _ in fused if cid in keep]


def rerank_max(lists: Lists, pool: list[int]) -> list[int]:
    return _refused_dense(lists, lambda c: max(lists.chunk_sim[c], lists.best_sim[c]), pool)


def rerank_mix(w: float) -> Rerank:
    def rerank(lists: Lists, pool: list[int]) -> list[int]:
        return _refused_dense(
            lists, lambda c: (1 - w) * lists.chunk_sim[c] + w * lists.best_sim[c], pool
        )

    return rerank


def rerank_leg(w: float) -> Rerank:
    def rerank(lists: Lists, pool: list[int]) -> list[int]:
        similarity = [(cid, -d) for cid, d in lists.dense]
        leg = sorted(((c, lists.best_sim[c]) for c in pool), key=lambda kv: -kv[1])
        fused = score_fusion([similarity, lists.sparse, leg], [FUSION.dense, FUSION.sparse, w])
        keep = set(pool)
        return [cid for cid, _ in fused if cid in keep]

    return rerank


def variants() -> list[tuple[str, Rerank | None]]:
    """The product, then each way of using the sentence vectors."""
    out: list[tuple[str, Rerank | None]] = [("product", None), ("max", rerank_max)]
    out += [(f"mix {w}", rerank_mix(w)) for w in (0.25, 0.5, 0.75)]
    out += [(f"leg {w}", rerank_leg(w)) for w in (0.25, 0.5, 1.0)]
    return out


@dataclass
class Row:
    name: str
    ranks: list[int | None] = field(default_factory=list)
    answerable: list[bool] = field(default_factory=list)
    refused: list[bool] = field(default_factory=list)
    bluffs: list[bool] = field(default_factory=list)


def _best(vec: np.ndarray, cid: int, sv: SentenceVectors, chunk_sim: float) -> float:
    mat = sv.by_chunk.get(cid)
    return chunk_sim if mat is None else float((mat @ vec).max())


def collect(snap: object, sv: SentenceVectors, vec: np.ndarray, text: str) -> Lists:
    """The two legs as ``LocalBackend.search`` gets them, with every candidate's similarities."""
    dense = snap.vectors.search(vec, DEFAULT_DEPTH)  # type: ignore[attr-defined]
    sparse = snap.bm25.search(text, DEFAULT_DEPTH)  # type: ignore[attr-defined]
    dist = dict(dense)
    missing = [cid for cid, _ in sparse if cid not in dist]
    if missing:
        dist.update(snap.vectors.distances_for(vec, missing))  # type: ignore[attr-defined]
    chunk_sim = {c: 1.0 - float(d) for c, d in dist.items()}
    best = {c: _best(vec, c, sv, s) for c, s in chunk_sim.items()}
    return Lists(list(dense), list(sparse), chunk_sim, best)


def _rank(ids: Sequence[int], correct: set[int]) -> int | None:
    return next((i for i, c in enumerate(ids, start=1) if c in correct), None)


def _kept(order: list[int], lists: Lists, threshold: float, top_k: int) -> list[int]:
    from core.retrieve import Candidate

    cands = [Candidate(c, 1.0 - lists.chunk_sim[c], 0.0) for c in order]
    return [c.chunk_id for c in gate(cands, threshold=threshold, top_k=top_k)]


def rerank_timing(sv: SentenceVectors, dim: int, seed: int = 3) -> dict[str, float]:
    """The re-ranking's own cost for one answered question, with a 10k-chunk sentence store."""
    rng = np.random.default_rng(seed)
    per_chunk = sv.count / max(1, len(sv.by_chunk))
    sizes = rng.poisson(per_chunk, QUERY_TIMING_CHUNKS).clip(2)
    store = {i: rng.standard_normal((int(n), dim)).astype(np.float32) for i, n in enumerate(sizes)}
    mem = sum(m.nbytes for m in store.values())
    times = []
    for _ in range(300):
        vec = rng.standard_normal(dim).astype(np.float32)
        pool = [int(x) for x in rng.choice(QUERY_TIMING_CHUNKS, POOL, replace=False)]
        started = time.perf_counter()
        _ = {c: float((store[c] @ vec).max()) for c in pool}
        times.append((time.perf_counter() - started) * 1000)
    return {
        "sentences_10k": float(sizes.sum()),
        "mb_10k": mem / 1e6,
        "p50_ms": float(np.percentile(times, 50)),
        "p95_ms": float(np.percentile(times, 95)),
    }


def run(set_name: str, cache: Path) -> tuple[list[Row], dict[str, object]]:
    """Index the set with the product, embed its sentences, and re-rank with every variant."""
    settings = Settings()
    embedder = load_embedder(settings.index_config())
    engine = settings.engine_config()
    paths = bundled_set(set_name)
    questions, ood = load_questions(paths.questions), load_ood(paths.ood)
    texts_in = [t for q in questions for t in q.phrasings()]
    qindex = [i for i, _ in enumerate(questions) for _ in range(2)]
    started = time.perf_counter()
    with indexed_corpus(paths.corpus, settings.index_config(), embedder) as kb:
        index_s = time.perf_counter() - started
        snap = kb.indexes.snapshot
        live = set(snap.chunk_ids.tolist())
        db = kb.store.db.execute("SELECT id, text, content FROM chunks").fetchall()
        chunks = {}
        for cid, text, content in db:
            if int(cid) in live:
                header = text[: len(text) - len(content)].rstrip("\n")
                chunks[int(cid)] = (header, content)
        correct = [{c for c, (_, body) in chunks.items() if q.needle in body} for q in questions]
        sv = sentence_vectors(embedder, chunks, cache)
        qvecs = [embedder.encode_query(t) for t in texts_in]
        ovecs = [embedder.encode_query(o.question) for o in ood]
        in_lists = [collect(snap, sv, v, t) for v, t in zip(qvecs, texts_in, strict=True)]
        ood_lists = [collect(snap, sv, v, o.question) for v, o in zip(ovecs, ood, strict=True)]
    rows = []
    top_k = engine.top_k
    assert top_k * CANDIDATES_PER_KEPT == POOL
    for name, rerank in variants():
        row = Row(name)
        for lists, qi in zip(in_lists, qindex, strict=True):
            pool = product_pool(lists)
            order = pool if rerank is None else rerank(lists, pool)
            assert sorted(order) == sorted(pool)
            row.ranks.append(_rank(order, correct[qi]))
            kept = _kept(order, lists, engine.threshold, top_k)
            row.refused.append(not kept)
            row.answerable.append(any(c in correct[qi] for c in kept))
        for lists in ood_lists:
            pool = product_pool(lists)
            order = pool if rerank is None else rerank(lists, pool)
            row.bluffs.append(bool(_kept(order, lists, engine.threshold, top_k)))
        rows.append(row)
    info: dict[str, object] = {
        "set": set_name,
        "chunks": len(chunks),
        "chunks_split": len(sv.by_chunk),
        "sentences": sv.count,
        "sentence_mb": sv.count * embedder.dim * 4 / 1e6,
        "chunk_index_s": index_s,
        "sentence_embed_s": sv.embed_s,
        "queries": len(texts_in),
        "ood": len(ood),
        "threshold": engine.threshold,
        "timing": rerank_timing(sv, embedder.dim),
    }
    return rows, info


def _test(a: Sequence[bool], b: Sequence[bool]) -> str:
    wins, losses = paired_counts(a, b)
    return f"+{wins}/-{losses} p={sign_test(wins, losses):.3g}"


def _mrr_pairs(a: Sequence[int | None], b: Sequence[int | None]) -> str:
    better = sum(1 for x, y in zip(a, b, strict=True) if (x or 99) < (y or 99))
    worse = sum(1 for x, y in zip(a, b, strict=True) if (x or 99) > (y or 99))
    return f"+{better}/-{worse} p={sign_test(better, worse):.3g}"


def table(rows: list[Row], info: dict[str, object]) -> str:
    """The Markdown table of every variant, paired with the product."""
    base = rows[0]
    n = len(base.ranks)
    t = info["timing"]
    assert isinstance(t, dict)
    lines = [
        f"Set `{info['set']}`: {info['chunks']} chunks ({info['chunks_split']} of more than one "
        f"sentence), {info['sentences']} sentence vectors "
        f"({info['sentences'] / info['chunks']:.2f} per chunk, "  # type: ignore[operator]
        f"{info['sentence_mb']:.1f} MB float32); chunk indexing {info['chunk_index_s']:.0f} s, "
        f"sentence embedding {info['sentence_embed_s']:.0f} s. Re-ranking 20 candidates with a "
        f"10k-chunk store ({t['sentences_10k']:.0f} sentences, {t['mb_10k']:.0f} MB): "
        f"p50 {t['p50_ms']:.3f} ms, p95 {t['p95_ms']:.3f} ms. "
        f"{n} queries, {info['ood']} out-of-domain, gate at {info['threshold']}.",
        "",
        "| variant | R@1 | R@4 | R@8 | R@20 | MRR | ticket R@4 | answerable | refused | bluffs "
        "| R@1 vs product | R@4 vs product | MRR vs product | answerable vs product |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        h = {k: hits_at_k(r.ranks, k) for k in (1, 4, 8, 20)}
        lo, hi = wilson_interval(sum(h[4]), n)
        m = bootstrap_mean([1.0 / x if x else 0.0 for x in r.ranks])
        ticket = h[4][1::2]
        first = r is base
        cells = [
            r.name,
            f"{sum(h[1]) / n:.3f}",
            f"{sum(h[4]) / n:.3f} [{lo:.2f}, {hi:.2f}]",
            f"{sum(h[8]) / n:.3f}",
            f"{sum(h[20]) / n:.3f}",
            f"{mrr(r.ranks):.3f} [{m.low:.2f}, {m.high:.2f}]",
            f"{sum(ticket) / len(ticket):.3f}",
            f"{sum(r.answerable)}/{n}",
            f"{sum(r.refused)}/{n}",
            f"{sum(r.bluffs)}/{len(r.bluffs)}",
            "" if first else _test(h[1], hits_at_k(base.ranks, 1)),
            "" if first else _test(h[4], hits_at_k(base.ranks, 4)),
            "" if first else _mrr_pairs(r.ranks, base.ranks),
            "" if first else _test(r.answerable, base.answerable),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    """Measure every variant on one set and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default=DEFAULT_SET, help="a bundled evaluation set")
    parser.add_argument("--cache", default="/tmp/kb-bench-sentences", help="sentence vectors")
    parser.add_argument("--json-out", default=None, help="also write per-query ranks here")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows, info = run(args.set, Path(args.cache))
    print(table(rows, info))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if args.json_out:
        data = {**info, "variants": [{"name": r.name, "ranks": r.ranks} for r in rows]}
        Path(args.json_out).write_text(json.dumps(data), encoding="utf-8")


if __name__ == "__main__":
    main()
