"""What the query map (``index.search.query_map``) costs: its fit, and a hybrid search with and without it.

One data dir per size holds synthetic chunks (``bench.query``: real texts,
then recombined real sentences; real vectors for the first ones, random unit
vectors past them) with 3 random unit sentence vectors each. Per size:

* the fit (``QueryAdapters.refit_if_due(force=True)``): sample, read, fit, store;
* with ``--alone``, the fit of a model that pools its sentence vectors from the
  passage's pass (the multilingual preset): the same with ``ALONE`` sampled
  sentences encoded alone first (``query_map.fit(..., encoder=)``);
* ``LocalSearchIndex.search`` in hybrid mode (both legs, fusion, distances),
  over the bundled questions (both phrasings) and out-of-domain questions, with
  the map and without it, alternating per question so both see the same machine.

The vectors' values do not change what a fit or a search costs, so the timings
hold for a real corpus of that size; the map fitted on random sentences is
meaningless for quality (docs/evaluation.md measures that on real sets).

Run: python -m bench.query_map [--sizes 10000,100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.machine import describe as machine
from bench.query import (
    corpus_chunks,
    ood_questions,
    pct,
    sentence_store,
    synthetic_chunks,
    synthetic_vectors,
)
from evaluation.inputs import DEFAULT_SET, bundled_set, load_questions
from index.config import IndexConfig
from index.embed import Embedder, load_embedder
from index.search.contract import Mode
from index.search.derived import DerivedIndexes
from index.search.local import LocalSearchIndex
from index.search.query_map import QueryAdapters, fit


def questions() -> list[str]:
    """The bundled set's phrasings and its out-of-domain questions."""
    paths = bundled_set(DEFAULT_SET)
    return [t for q in load_questions(paths.questions) for t in q.phrasings()] + ood_questions()


def run_size(
    n: int,
    real: list[str],
    real_vecs: np.ndarray,
    embedder: Embedder,
    repeat: int,
    alone: Embedder | None = None,
) -> dict[str, float]:
    texts, vecs = synthetic_chunks(real, n), synthetic_vectors(real_vecs, n)
    with tempfile.TemporaryDirectory(prefix="kb-bench-map-") as tmp:
        store, _ = sentence_store(Path(tmp), texts, vecs)
        adapters = QueryAdapters(store, embedding_model="bench", dimensions=vecs.shape[1])
        t0 = time.perf_counter()
        adapter = adapters.refit_if_due(force=True)
        fit_s = time.perf_counter() - t0
        assert adapter is not None
        alone_s = alone_anchors = 0.0
        if alone is not None:
            ids, _ = store.searchable_chunk_versions("bench", vecs.shape[1])
            t0 = time.perf_counter()
            fitted = fit(store, "bench", vecs.shape[1], ids, encoder=alone)
            alone_s = time.perf_counter() - t0
            assert fitted is not None
            alone_anchors = fitted.anchors
        indexes = DerivedIndexes(store, embedding_model="bench", dimensions=vecs.shape[1])
        indexes.open()
        plain = LocalSearchIndex(indexes)
        mapped = LocalSearchIndex(indexes, adapters=adapters)
        asked = questions()
        vectors = [embedder.encode_query(q) for q in asked]
        times: dict[str, list[float]] = {"without": [], "with": []}
        for _ in range(repeat):
            for q, v in zip(asked, vectors, strict=True):
                for name, index in (("without", plain), ("with", mapped)):
                    t = time.perf_counter()
                    index.search(v, q, None, 20, Mode.HYBRID)
                    times[name].append((time.perf_counter() - t) * 1000)
        without, with_map = pct(times["without"], 50), pct(times["with"], 50)
        return {
            "chunks": n,
            "sentences": adapter.anchors,
            "fit s": round(fit_s, 2),
            **(
                {"sentences alone": alone_anchors, "fit with them alone s": round(alone_s, 2)}
                if alone is not None
                else {}
            ),
            "map bytes in meta": len(store.get_meta(adapters.map_key) or ""),
            "p50 without ms": round(without, 2),
            "p50 with ms": round(with_map, 2),
            "p95 without ms": round(pct(times["without"], 95), 2),
            "p95 with ms": round(pct(times["with"], 95), 2),
            "ratio p50": round(with_map / without, 3),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--alone", action="store_true", help="also fit encoding sentences alone (multilingual)"
    )
    args = parser.parse_args()
    embedder = load_embedder(IndexConfig())
    alone = load_embedder(IndexConfig(embedding_model="multilingual")) if args.alone else None
    real = corpus_chunks()
    real_vecs = embedder.encode(real)
    print(machine())
    for n in (int(s) for s in args.sizes.split(",")):
        print(json.dumps(run_size(n, real, real_vecs, embedder, args.repeat, alone)))


if __name__ == "__main__":
    main()
