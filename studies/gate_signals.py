"""Which cheap signal best tells in-domain from out-of-domain questions, on every bundled set.

Searches through the configured search index; the corpus-wide signals read the
local engine's snapshot (its vectors) directly, so this runs on the local engine.

The refusal gate decides on the best candidate's cosine distance. This measures
other model-free signals, each cheap at query time, against it:

* ``best``: the best of the fused candidates' distances (the gate today);
* ``best - typical``: the margin between the best distance and the query's
  typical distance to the corpus (``1 - q . mean vector``, one dot product),
  with weights 1 and 0.5;
* ``best - mean top100``, ``best - d@10``, ``z top100``: the margin to the
  query's own nearest neighbours;
* ``legs disagree``: +0.05 when the dense leg's best chunk is not in BM25's top 5;
* ``bm25 / term``: the best BM25 score per query term.

For each: ROC AUC (in-domain queries against out-of-domain questions; lower
signal = in-domain), with a 95 % paired bootstrap interval of its difference
to ``best``, and the in-domain queries refused at the largest cut that lets at
most 2 out-of-domain questions through, with the exact sign test on the
queries only one of the two refuses.

Run: python -m studies.gate_signals [--set NAME ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bot.settings import Settings
from core.retrieve import Mode
from evaluation.inputs import bundled_set, bundled_sets, load_ood, load_questions
from evaluation.run import indexed_corpus
from evaluation.stats import sign_test
from index.embed import load_embedder
from index.knowledge_base import KnowledgeBase
from index.search.tokens import tokenize

BLUFFS = 2
RESAMPLES = 1000


@dataclass(frozen=True)
class Query:
    """What the signals are computed from, for one query."""

    in_domain: bool
    best: float
    typical: float
    dense: np.ndarray  # the 100 nearest distances, nearest first
    dense_top: int
    sparse_top5: frozenset[int]
    bm25_per_term: float


SIGNALS: dict[str, Callable[[Query], float]] = {
    "best (the gate)": lambda q: q.best,
    "best - typical": lambda q: q.best - q.typical,
    "best - 0.5 typical": lambda q: q.best - 0.5 * q.typical,
    "best - mean top100": lambda q: q.best - float(q.dense.mean()),
    "best - d@10": lambda q: q.best - float(q.dense[9]),
    "z top100": lambda q: (q.best - float(q.dense.mean())) / (float(q.dense.std()) + 1e-9),
    "best + 0.05 legs disagree": lambda q: q.best + 0.05 * (q.dense_top not in q.sparse_top5),
    "-bm25 / term": lambda q: -q.bm25_per_term,
}


def _queries(kb: KnowledgeBase, texts: list[str], in_domain: bool) -> list[Query]:
    snap = kb.indexes.snapshot
    backend = kb.search_index
    out = []
    for text in texts:
        vec = kb.embedder.encode_query(text)
        fused = backend.search(vec, text, None, 20, Mode.HYBRID)
        dense = snap.vectors.search(vec, len(snap))
        distances = np.array([d for _, d in dense])
        sparse = snap.bm25.search(text, 5)
        terms = max(1, len(set(tokenize(text))))
        out.append(
            Query(
                in_domain=in_domain,
                best=min(c.distance for c in fused),
                # The mean distance to every chunk is 1 - q . (mean of the chunk vectors).
                typical=float(distances.mean()),
                dense=distances[:100],
                dense_top=dense[0][0],
                sparse_top5=frozenset(cid for cid, _ in sparse),
                bm25_per_term=(sparse[0][1] if sparse else 0.0) / terms,
            )
        )
    return out


def _auc(pos: np.ndarray, neg: np.ndarray) -> float:
    less = (pos[:, None] < neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(less / (pos.size * neg.size))


def _refused(pos: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """In-domain queries refused at the largest cut letting at most BLUFFS through."""
    return pos >= np.sort(neg)[BLUFFS]


def measure(name: str) -> None:
    """Print the table of one bundled set."""
    paths = bundled_set(name)
    config = Settings().index_config()
    embedder = load_embedder(config)
    questions = load_questions(paths.questions)
    ood = load_ood(paths.ood)
    with indexed_corpus(paths.corpus, config, embedder) as kb:
        texts = [t for q in questions for t in q.phrasings()]
        queries = _queries(kb, texts, True) + _queries(kb, [o.question for o in ood], False)
    inside = np.array([q.in_domain for q in queries])
    base = np.array([SIGNALS["best (the gate)"](q) for q in queries])
    rng = np.random.default_rng(0)
    pos_i, neg_i = np.flatnonzero(inside), np.flatnonzero(~inside)
    draws = [
        (rng.choice(pos_i, pos_i.size), rng.choice(neg_i, neg_i.size)) for _ in range(RESAMPLES)
    ]
    print(f"\n{name}: {inside.sum()} in-domain queries, {(~inside).sum()} out-of-domain")
    print(f"{'signal':28s} {'AUC':>6} {'vs best, 95 %':>18} {'refused@<=2':>11} {'vs best':>16}")
    base_refused = _refused(base[inside], base[~inside])
    for label, fn in SIGNALS.items():
        s = np.array([fn(q) for q in queries])
        auc = _auc(s[inside], s[~inside])
        diffs = [_auc(s[p], s[n]) - _auc(base[p], base[n]) for p, n in draws]
        low, high = np.percentile(diffs, [2.5, 97.5])
        refused = _refused(s[inside], s[~inside])
        fewer = int((base_refused & ~refused).sum())
        more = int((~base_refused & refused).sum())
        print(
            f"{label:28s} {auc:6.3f} [{low:+.3f}, {high:+.3f}] {int(refused.sum()):11d} "
            f"+{fewer}/-{more} p={sign_test(fewer, more):.2g}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="sets", action="append", help="bundled set (default: all)")
    args = parser.parse_args()
    for name in args.sets or bundled_sets():
        measure(name)


if __name__ == "__main__":
    main()
