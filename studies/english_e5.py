"""English under the default model: the fusion and the answer order's levers, replayed per set.

Indexes a bundled set once with the product's ingestion and the configured
model into a data dir kept under ``--cache`` (a second run reopens it), then
searches every in-domain query (both phrasings) with each variant below, in
process: the local engine's fusion and depth (``LocalSearchIndex.fusion``,
``.depth``) and the answer order's weights (``EngineConfig``). A variant may
apply to the questions in English only (``english_only``), the others keeping
the product's settings, as a per-language setting would.

Per variant: hybrid R@4 (the fused order, ``DEPTH`` candidates), final R@4
(the answer order of the ``top_k x CANDIDATES_PER_KEPT`` candidates every
surface fetches, ``PassageSelector.ordered``), the same for the ticket
phrasings alone, and the paired wins/losses against the product with the exact
sign test. Dense and BM25 alone are printed once, for where the loss is.

Run: python -m studies.english_e5 --set NAME [--cache DIR] [--json-out FILE] [--only VARIANT]

(``KB_EMBEDDING_MODEL=bundled:all-MiniLM-L6-v2`` measures the earlier default the same way.)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from bot.settings import Settings
from core.config import EngineConfig
from core.gate import CANDIDATES_PER_KEPT
from core.retrieve import FUSION, Fusion, Mode
from core.selection import PassageSelector, retrieval_query
from evaluation.inputs import bundled_set, load_questions
from evaluation.results import DEPTH
from evaluation.stats import hits_at_k, mrr, paired_counts, sign_test
from index.embed import load_embedder
from index.knowledge_base import KnowledgeBase
from index.search import LocalSearchIndex
from index.search.fusion import DEFAULT_DEPTH


@dataclass(frozen=True)
class Variant:
    """One way of searching and ordering; ``None`` keeps the product's."""

    name: str
    fusion: Fusion | None = None
    depth: int | None = None
    engine: dict[str, float] = field(default_factory=dict)
    english_only: bool = False
    no_map: bool = False


def variants() -> list[Variant]:
    """The product, then each lever alone."""
    out = [Variant("product")]
    for w in (0.25, 0.75, 1.0, 1.5):
        out.append(Variant(f"BM25 weight {w}", fusion=replace(FUSION, sparse=w)))
        out.append(
            Variant(f"BM25 weight {w}, English only", fusion=replace(FUSION, sparse=w),
                    english_only=True)
        )  # fmt: skip
    for k in (10, 60):
        out.append(Variant(f"RRF k={k}", fusion=Fusion(method="rrf", k=k)))
    out.append(Variant("depth 50", depth=50))
    out.append(Variant("depth 15", depth=15))
    out.append(Variant("no query map", no_map=True))
    for name, values in (
        ("latent 0", {"latent_weight": 0.0}),
        ("latent 0.15", {"latent_weight": 0.15}),
        ("latent 0.5", {"latent_weight": 0.5}),
        ("sentence 0", {"sentence_weight": 0.0}),
        ("sentence 0.25", {"sentence_weight": 0.25}),
        ("sentence 1.0", {"sentence_weight": 1.0}),
        ("proximity 0", {"proximity_weight": 0.0}),
        ("proximity 0.4", {"proximity_weight": 0.4}),
    ):
        out.append(Variant(name, engine=values))
        out.append(Variant(name + ", English only", engine=values, english_only=True))
    return out


def open_indexed(name: str, cache: Path, settings: Settings) -> KnowledgeBase:
    """The set's knowledge base under ``cache``, indexed on first use."""
    paths = bundled_set(name)
    config = settings.index_config()
    embedder = load_embedder(config)
    data = cache / name
    fresh = not data.exists()
    kb = KnowledgeBase(replace(config, data_dir=data, database_url=""), embedder=embedder)
    if fresh:
        kb.ingest_paths([paths.corpus], uploader="study")
    return kb


def run(name: str, cache: Path, only: frozenset[str] = frozenset()) -> dict[str, object]:
    settings = Settings()
    base_engine = settings.engine_config()
    kb = open_indexed(name, cache, settings)
    questions = load_questions(bundled_set(name).questions)
    chunks = {
        int(row["id"]): row["content"]
        for doc in kb.store.documents()
        for row in kb.store.chunk_rows(doc.id)
    }
    rows = [
        (retrieval_query(t), q.needle, (q.lang or "en") == "en", phrasing)
        for q in questions
        for phrasing, t in zip(("doc", "ticket"), q.phrasings(), strict=True)
    ]
    correct = [{cid for cid, body in chunks.items() if needle in body} for _, needle, _, _ in rows]
    vectors = np.vstack([kb.embedder.encode_query(text) for text, *_ in rows])
    index = kb.search_index
    if not isinstance(index, LocalSearchIndex):
        raise SystemExit("the study varies the local engine's fusion: unset KB_SEARCH_ENGINE")
    adapters = index.adapters

    def rank(found: list, ids: set[int]) -> int | None:
        return next((i for i, c in enumerate(found, 1) if c.chunk_id in ids), None)

    legs = {}
    for mode in (Mode.DENSE, Mode.BM25, Mode.HYBRID):
        legs[mode.value] = [
            rank(index.search(v, text, None, DEPTH, mode), ids)
            for (text, *_), v, ids in zip(rows, vectors, correct, strict=True)
        ]
    results: dict[str, dict[str, list[int | None]]] = {}
    for variant in variants():
        if only and variant.name not in only | {"product"}:
            continue
        hybrid: list[int | None] = []
        final: list[int | None] = []
        for (text, _, english, _), v, ids in zip(rows, vectors, correct, strict=True):
            applies = english or not variant.english_only
            index.fusion = (variant.fusion or FUSION) if applies else FUSION
            index.depth = (variant.depth or DEFAULT_DEPTH) if applies else DEFAULT_DEPTH
            index.adapters = None if (variant.no_map and applies) else adapters
            engine = _with(base_engine, variant.engine) if applies else base_engine
            hybrid.append(rank(index.search(v, text, None, DEPTH, Mode.HYBRID), ids))
            selector = PassageSelector(kb, engine)
            cands = index.search(v, text, None, engine.top_k * CANDIDATES_PER_KEPT, Mode.HYBRID)
            final.append(rank(selector.ordered(text, v, cands), ids))
        results[variant.name] = {"hybrid": hybrid, "final": final}
        index.fusion, index.depth, index.adapters = FUSION, DEFAULT_DEPTH, adapters
    kb.store.close()
    ticket = [p == "ticket" for *_, p in rows]
    report(name, legs, results, ticket)
    return {"legs": legs, "results": results, "ticket": ticket,
            "english": [e for _, _, e, _ in rows]}  # fmt: skip


def _with(engine: EngineConfig, weights: dict[str, float]) -> EngineConfig:
    """``engine`` with the answer order's weights in ``weights`` changed."""
    return replace(
        engine,
        sentence_weight=weights.get("sentence_weight", engine.sentence_weight),
        proximity_weight=weights.get("proximity_weight", engine.proximity_weight),
        latent_weight=weights.get("latent_weight", engine.latent_weight),
    )


def report(
    name: str,
    legs: dict[str, list[int | None]],
    results: dict[str, dict[str, list[int | None]]],
    ticket: list[bool],
) -> None:
    n = len(ticket)
    print(f"\n## {name} ({n} queries)\n")
    for mode, ranks in legs.items():
        r4 = hits_at_k(ranks, 4)
        t4 = [h for h, t in zip(r4, ticket, strict=True) if t]
        print(f"{mode}: R@4 {sum(r4) / n:.3f}, ticket {sum(t4) / len(t4):.3f}, "
              f"MRR {mrr(ranks):.3f}")  # fmt: skip
    base = results["product"]
    print("\n| variant | hybrid R@4 | vs product | final R@4 | vs product | final ticket R@4 |")
    print("|---|---|---|---|---|---|")
    for vname, r in results.items():
        cells = []
        for kind in ("hybrid", "final"):
            a, b = hits_at_k(r[kind], 4), hits_at_k(base[kind], 4)
            w, lo = paired_counts(a, b)
            cells += [f"{sum(a) / n:.3f}", f"+{w}/-{lo} p {sign_test(w, lo):.2f}"]
        f4 = hits_at_k(r["final"], 4)
        t4 = [h for h, t in zip(f4, ticket, strict=True) if t]
        print(f"| {vname} | " + " | ".join(cells) + f" | {sum(t4) / len(t4):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="sets", action="append", required=True)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/english-e5"))
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--only", action="append", default=[], help="a variant's name (repeatable)")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    only = frozenset(args.only)
    out = {name: run(name, args.cache, only) for name in args.sets}
    if args.json_out:
        args.json_out.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
