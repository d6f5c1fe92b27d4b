"""What the query map is fitted on, replayed on one indexing of a set (studies/2026-12-07-query-map-sentences.md).

Indexes a bundled set once with the product's ingestion, then for each
variant installs another query map (or engine setting) and measures the set as
``kb eval`` does, writing a ``kb eval --json``-shaped file per variant, to be
paired with ``python -m studies.query_map_sentences --pair A.json B.json``.

    python -m studies.query_map_sentences --set manpages-l10n --out /tmp/qm pooled alone-query
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bot.settings import Settings
from core.config import EngineConfig
from evaluation.compare import compare, load_result, render_comparison
from evaluation.inputs import bundled_set, load_ood, load_questions
from evaluation.results import EvalResult, default_thresholds
from evaluation.run import (
    MODES,
    PRODUCT,
    _analyse_gate,
    _encode_queries,
    _measure,
    _measure_kept,
    _mode_tests,
    indexed_corpus,
)
from index.embed import Embedder, load_embedder, passage_budget
from index.ingest import from_blob
from index.ingest.sentences import sentence_texts
from index.knowledge_base import KnowledgeBase
from index.search.query_map import MAX_CHUNKS, SEED, QueryAdapter, fit, fit_matrix


def alone_map(
    kb: KnowledgeBase, embedder: Embedder, *, most: int, role: str, header: bool
) -> tuple[np.ndarray, int, float]:
    """A map fitted on at most ``most`` sentences encoded alone; its matrix, anchors, seconds."""
    started = time.perf_counter()
    store, dim = kb.store, embedder.dim
    ids, _ = store.searchable_chunk_versions(embedder.name, dim)
    rng = np.random.default_rng(SEED)
    sample = ids if len(ids) <= MAX_CHUNKS else np.sort(rng.choice(ids, MAX_CHUNKS, replace=False))
    vectors = {
        int(r["id"]): from_blob(r["vector"], dim)[0]
        for r in store.searchable_chunks(embedder.name, dim, [int(c) for c in sample])
    }
    rows = store.chunks_by_id(list(vectors))
    row = {c: i for i, c in enumerate(vectors)}
    pairs: list[tuple[int, str]] = []
    for c in vectors:
        chunk = rows[c]
        texts = sentence_texts(chunk.text, chunk.content)
        if not header:
            texts = [t.split("\n", 1)[-1] for t in texts]
        pairs += [(row[c], t) for t in texts]
    if len(pairs) > most:
        keep = np.sort(rng.choice(len(pairs), most, replace=False))
        pairs = [pairs[i] for i in keep]
    anchors = embedder.encode([t for _, t in pairs], role=role)  # type: ignore[arg-type]
    positives = np.array([p for p, _ in pairs])
    chunks = np.vstack(list(vectors.values()))
    matrix = fit_matrix(np.asarray(anchors, dtype=np.float32), positives, chunks)
    return matrix, len(pairs), time.perf_counter() - started


def install(kb: KnowledgeBase, matrix: np.ndarray | None, anchors: int) -> None:
    """``matrix`` as the knowledge base's map (``None``: no map)."""
    adapters = kb.query_adapters
    adapters.enabled = matrix is not None
    if matrix is None:
        return
    adapter = QueryAdapter(
        matrix=matrix,
        embedding_model=adapters.embedding_model,
        chunks=0,
        anchors=anchors,
        fitted_at=time.time(),
    )
    kb.store.set_meta(adapters.map_key, adapter.to_meta())
    kb.store.set_meta(adapters.stamp_key, adapter.stamp())
    adapters._checked = float("-inf")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", dest="set_name")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--pair", nargs=2, type=Path)
    parser.add_argument("variants", nargs="*")
    args = parser.parse_args()
    if args.pair:
        a, b = (load_result(p, p.stem) for p in args.pair)
        print(render_comparison(compare(a, b)))
        return
    settings = Settings()
    index, engine = settings.index_config(), settings.engine_config()
    paths = bundled_set(args.set_name)
    questions, ood = load_questions(paths.questions), load_ood(paths.ood)
    embedder = load_embedder(index)
    queries = _encode_queries(embedder, questions, ood, False)
    args.out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    with indexed_corpus(paths.corpus, index, embedder) as kb:
        seconds = time.perf_counter() - t
        ids, _ = kb.store.searchable_chunk_versions(embedder.name, embedder.dim)
        pooled = fit(kb.store, embedder.name, embedder.dim, ids)
        for name in args.variants:
            # name: map[+engine], map one of pooled, none, alone-ROLE[-hdr]-N
            # engine one of nosent, nolatent
            map_name, _, engine_name = name.partition("+")
            note: dict[str, object] = {}
            if map_name == "pooled":
                assert pooled is not None
                install(kb, pooled.matrix, pooled.anchors)
            elif map_name == "none":
                install(kb, None, 0)
            else:
                _, role, *rest = map_name.split("-")
                most = int(rest[-1])
                matrix, n, secs = alone_map(
                    kb, embedder, most=most, role=role, header="hdr" in rest
                )
                note = {"anchors": n, "fit_seconds": round(secs, 1)}
                install(kb, matrix, n)
            eng: EngineConfig = engine
            if engine_name == "nosent":
                eng = replace(engine, sentence_weight=0.0)
            elif engine_name == "nolatent":
                eng = replace(engine, latent_weight=0.0)
            result = measure(kb, embedder, questions, ood, queries, eng, index, seconds)
            data = result.to_dict() | {"study": note}
            (args.out / f"{name}.json").write_text(json.dumps(data), encoding="utf-8")
            print(name, note, file=sys.stderr, flush=True)


def measure(kb, embedder, questions, ood, queries, engine, index, seconds):  # type: ignore[no-untyped-def]
    product, correct = _measure(
        PRODUCT, kb, questions, queries, index_seconds=seconds, modes=MODES, progress=False
    )
    gate = _analyse_gate(
        kb,
        queries,
        ood,
        correct,
        threshold=engine.threshold,
        related_threshold=engine.related_threshold,
        engine=engine,
        thresholds=default_thresholds(engine.threshold),
        progress=False,
    )
    kept = _measure_kept(kb, queries, correct, engine, engine.threshold, None)
    return EvalResult(
        corpus=str(kb.config.data_dir),
        questions=list(questions),
        ood_questions=list(ood),
        embedding_model=embedder.name,
        chunk_budget=passage_budget(index, embedder),
        product=product,
        query_map=kb.query_adapters.status(),
        mode_tests=_mode_tests(product),
        gate=gate,
        kept=kept,
    )


if __name__ == "__main__":
    main()
