"""A second dense search from the first one's passages (pseudo-relevance feedback), replayed per set.

After the product's hybrid search, the question's vector is moved toward the
passages the first pass agrees on (Rocchio):
``q' = normalise(q + a * mean(vectors of m passages))``, ``q`` the vector the
hybrid order's dense leg searches with (the query map's when the knowledge
base has one), the passages either the fused order's first ``m`` (``fused``),
the first ``m`` of it both legs found (``both``) or BM25's first ``m``
(``bm25``). The dense leg is searched again with ``q'`` (one more scan of the
flat index, no model call) and fused with the same BM25 lists. Every
candidate's distance stays the original question's, and the original dense
leg's nearest passage stays among the candidates (in the last place if the
second search would drop it), as the query map keeps it: the gate decides on
the same best distance, so what is answered, refused or bluffed cannot change
(checked per query below, not assumed).

``collect`` reopens (or indexes, on first use) a bundled set's kept data dir
with ``studies.english_e5.open_indexed`` and searches every query (both
phrasings of every in-domain question, then every out-of-domain question) with
each variant, in process: per in-domain query the needle's rank in the fused
order (``top_k x CANDIDATES_PER_KEPT`` = 20 candidates: hybrid R@4) and in the
answer order (``PassageSelector.ordered``: final R@4), and, replayed at the
shipped thresholds (``evaluation.outcomes.Replay``), whether it is answered,
whether the needle is kept (among the passages given to the model) and
shown; per out-of-domain question whether it is bluffed. ``report`` pairs each
variant against the product (exact two-sided sign test), overall, per phrasing
and per language, and sums the English sets (choice) and the multilingual ones
(confirmation).

Run: python -m studies.dense_feedback collect --set NAME [--cache DIR]
     python -m studies.dense_feedback report [--cache DIR] [--variant NAME ...]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from bot.settings import Settings
from core.gate import CANDIDATES_PER_KEPT
from core.retrieve import Candidate, Mode
from core.selection import PassageSelector, retrieval_query
from evaluation.inputs import bundled_set, load_ood, load_questions
from evaluation.outcomes import Replay
from evaluation.stats import hits_at_k, paired_counts, sign_test
from index.search import LocalSearchIndex
from index.search.fusion import fuse, fused_candidates
from studies.english_e5 import open_indexed

Source = Literal["fused", "both", "bm25"]
ENGLISH = ("pip-black", "prometheus")
MULTILINGUAL = ("manpages-l10n", "gimp-help-l10n")
MEASURES = ("hybrid", "final", "kept", "shown")


@dataclass(frozen=True)
class Feedback:
    """One way of moving the dense leg's query: ``a`` toward the mean of ``m`` passages of ``source``."""

    a: float
    m: int
    source: Source

    @property
    def name(self) -> str:
        return f"{self.source} m={self.m} a={self.a}"


def variants() -> list[Feedback]:
    """Every variant of the brief; ``a = 0`` is the control (the second scan alone)."""
    out = [Feedback(0.0, 1, "fused")]
    for source in ("fused", "both", "bm25"):
        for m in (1, 2, 3):
            out += [Feedback(a, m, source) for a in (0.2, 0.4, 0.7)]
    return out


def feedback_search(
    index: LocalSearchIndex, vector: np.ndarray, text: str, k: int, fb: Feedback | None
) -> list[Candidate]:
    """The hybrid candidates of the query, the dense leg searched again from ``fb`` (``None``: the product's)."""
    snap = index.indexes.snapshot
    depth = max(k, index.depth)
    dense = snap.vectors.search(vector, depth)
    sparse, foreign = index._sparse(snap, text, depth, None)
    first = fused_candidates(
        dense,
        sparse,
        index.fusion,
        k,
        Mode.HYBRID,
        adapters=index.adapters,
        query_vector=vector,
        distances_for=snap.vectors.distances_for,
        foreign=foreign,
    )
    if fb is None or not dense:
        return first
    if fb.source == "fused":
        ids = [c.chunk_id for c in first[: fb.m]]
    elif fb.source == "both":
        both = [c.chunk_id for c in first if c.dense_rank is not None and c.sparse_rank is not None]
        ids = both[: fb.m]
    else:
        ids = [cid for cid, _ in sparse[: fb.m]]
    adapter = index.adapters.current() if index.adapters is not None else None
    base = adapter.apply(vector) if adapter is not None else np.asarray(vector, dtype=np.float32)
    if ids:
        stored = np.vstack([snap.vectors._index.reconstruct(i) for i in ids])
        moved = base + fb.a * stored.mean(axis=0)
        base = moved / np.linalg.norm(moved)
    leg = snap.vectors.search(base, len(dense))
    fused = fuse(leg, sparse, index.fusion, foreign)
    top = fused[:k]
    nearest = dense[0][0]
    if all(cid != nearest for cid, _ in top):
        top = [*top[: k - 1], (nearest, dict(fused).get(nearest, 0.0))]
    distances = dict(dense)
    missing = [cid for cid, _ in top if cid not in distances]
    if missing:
        distances.update(snap.vectors.distances_for(vector, missing))
    dense_rank = {cid: i for i, (cid, _) in enumerate(dense, start=1)}
    sparse_rank = {cid: i for i, (cid, _) in enumerate(foreign, start=1)}
    sparse_rank |= {cid: i for i, (cid, _) in enumerate(sparse, start=1)}
    return [
        Candidate(cid, float(distances[cid]), score, dense_rank.get(cid), sparse_rank.get(cid))
        for cid, score in top
    ]


def _rank(cands: Sequence[Candidate], ids: set[int]) -> int | None:
    return next((i for i, c in enumerate(cands, 1) if c.chunk_id in ids), None)


def collect(name: str, cache: Path) -> None:
    """Search every query of the set with the product and each variant; save the per-query outcomes."""
    settings = Settings()
    engine = settings.engine_config()
    kb = open_indexed(name, cache, settings)
    paths = bundled_set(name)
    questions = load_questions(paths.questions)
    ood = load_ood(paths.ood)
    index = kb.search_index
    if not isinstance(index, LocalSearchIndex):
        raise SystemExit("the study searches the local engine: unset KB_SEARCH_ENGINE")
    chunks = {
        int(row["id"]): row["content"]
        for doc in kb.store.documents()
        for row in kb.store.chunk_rows(doc.id)
    }
    rows = [
        (retrieval_query(t), q.needle, q.lang or "en", phrasing)
        for q in questions
        for phrasing, t in zip(("doc", "ticket"), q.phrasings(), strict=True)
    ]
    correct = [{cid for cid, body in chunks.items() if needle in body} for _, needle, _, _ in rows]
    texts = [text for text, *_ in rows]
    ood_texts = [retrieval_query(o.question) for o in ood]
    vectors = [kb.embedder.encode_query(t) for t in texts]
    ood_vectors = [kb.embedder.encode_query(t) for t in ood_texts]
    k = engine.top_k * CANDIDATES_PER_KEPT
    selector = PassageSelector(kb, engine)
    sizes = {cid: len(body) for cid, body in chunks.items()}
    out: dict[str, object] = {
        "langs": [lang for _, _, lang, _ in rows],
        "phrasing": [p for *_, p in rows],
        "query_map": index.adapters is not None and index.adapters.current() is not None,
        "variants": {},
    }
    for fb in [None, *variants()]:
        started = time.perf_counter()
        cands = [feedback_search(index, v, t, k, fb) for t, v in zip(texts, vectors, strict=True)]
        ordered = [selector.ordered(t, v, c) for t, v, c in zip(texts, vectors, cands, strict=True)]
        ood_cands = [
            feedback_search(index, v, t, k, fb) for t, v in zip(ood_texts, ood_vectors, strict=True)
        ]
        replay = Replay(
            in_domain=cands,
            ood=ood_cands,
            correct=correct,
            sizes=sizes,
            top_k=engine.top_k,
            max_kept=engine.max_kept,
            margin=engine.keep_margin,
            kept_order=ordered,
        )
        outcomes = replay.outcomes(engine.threshold, engine.related_threshold)
        vname = "product" if fb is None else fb.name
        out["variants"][vname] = {  # type: ignore[index]
            "hybrid": [_rank(c, ids) for c, ids in zip(cands, correct, strict=True)],
            "final": [_rank(c, ids) for c, ids in zip(ordered, correct, strict=True)],
            "answered": outcomes.answered,
            "hard_refused": outcomes.hard_refused,
            "kept": outcomes.kept_needle,
            "shown": outcomes.shown,
            "bluffs": outcomes.bluffs,
            "best": [min((c.distance for c in cs), default=2.0) for cs in cands + ood_cands],
        }
        print(f"{name} {vname}: {time.perf_counter() - started:.1f}s", flush=True)
    kb.store.close()
    (cache / f"{name}.feedback.json").write_text(json.dumps(out))


def _hits(saved: dict[str, list], measure: str) -> list[bool]:
    if measure in ("hybrid", "final"):
        return hits_at_k(saved[measure], 4)
    return [bool(x) for x in saved[measure]]


def _cell(a: Sequence[bool], b: Sequence[bool]) -> str:
    w, lo = paired_counts(a, b)
    p = sign_test(w, lo)
    mark = "**" if p < 0.05 else ""
    return f"{sum(a)} ({mark}+{w}/-{lo}{mark}" + (f", p {p:.3f})" if p < 0.2 else ")")


def report(cache: Path, chosen: Sequence[str]) -> None:
    """Tables: every variant on each set group, then the chosen ones per set, phrasing and language."""
    data = {
        name: json.loads((cache / f"{name}.feedback.json").read_text())
        for name in (*ENGLISH, *MULTILINGUAL)
        if (cache / f"{name}.feedback.json").exists()
    }
    # The gate's decision per query, against the product's: must be identical.
    for name, d in data.items():
        base = d["variants"]["product"]
        for vname, v in d["variants"].items():
            for what in ("answered", "hard_refused", "bluffs", "best"):
                if v[what] != base[what]:
                    print(f"GATE CHANGED: {name} {vname} {what}")
    groups = {"English": ENGLISH, "multilingual": MULTILINGUAL}
    names = list(next(iter(data.values()))["variants"])
    for group, sets in groups.items():
        present = [s for s in sets if s in data]
        if not present:
            continue
        print(f"\n## {group} ({', '.join(present)}), paired against the product\n")
        print("| variant | " + " | ".join(MEASURES) + " |")
        print("|---|" + "---|" * len(MEASURES))
        for vname in names:
            cells = []
            for measure in MEASURES:
                a: list[bool] = []
                b: list[bool] = []
                for s in present:
                    a += _hits(data[s]["variants"][vname], measure)
                    b += _hits(data[s]["variants"]["product"], measure)
                cells.append(_cell(a, b))
            print(f"| {vname} | " + " | ".join(cells) + " |")
    for vname in chosen:
        print(f"\n## {vname}, per set, phrasing and language\n")
        print("| set | slice | n | " + " | ".join(MEASURES) + " |")
        print("|---|---|---|" + "---|" * len(MEASURES))
        for name, d in data.items():
            v, base = d["variants"][vname], d["variants"]["product"]
            slices: list[tuple[str, list[bool]]] = [("all", [True] * len(d["langs"]))]
            slices += [(p, [x == p for x in d["phrasing"]]) for p in ("doc", "ticket")]
            langs = sorted(set(d["langs"]))
            if len(langs) > 1:
                slices += [(lang, [x == lang for x in d["langs"]]) for lang in langs]
            for label, mask in slices:
                cells = []
                for measure in MEASURES:
                    a = [h for h, m in zip(_hits(v, measure), mask, strict=True) if m]
                    b = [h for h, m in zip(_hits(base, measure), mask, strict=True) if m]
                    cells.append(_cell(a, b))
                print(f"| {name} | {label} | {sum(mask)} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--set", dest="sets", action="append", required=True)
    c.add_argument("--cache", type=Path, default=Path("/tmp/dense-feedback"))
    r = sub.add_parser("report")
    r.add_argument("--cache", type=Path, default=Path("/tmp/dense-feedback"))
    r.add_argument("--variant", action="append", default=[])
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    if args.command == "collect":
        for name in args.sets:
            collect(name, args.cache)
    else:
        report(args.cache, args.variant)


if __name__ == "__main__":
    main()
