"""Retrieval levers per language, measured side by side on one indexed evaluation set.

Indexes a bundled set once per embedding model (kept in ``--data-dir``, so a
second run only searches), then for every question phrasing and every lever
runs the product's own search (``LocalSearchIndex``) and counts whether a
passage holding the needle is among the first 4 (R@4), per question language,
phrasing and cross-lingual group. Levers:

    product      the product's search as configured (fusion, language-aware BM25, BM25's
                 hits in other languages than the question's as a list of their own)
    rrf          reciprocal rank fusion (k 60, both legs weight 1) instead of the score fusion
    score-1.0    score fusion with BM25 weighing as much as the dense leg
    own-only     BM25's hits in the question's language only (the others dropped)
    one-list     BM25's hits in every language in one list
    dense        the dense leg alone
    bm25         the BM25 leg alone

The gate is not a lever here (``kb eval`` and ``kb calibrate`` measure it):
only the order of what is retrieved. Prints one table per lever and the
paired wins/losses of each lever against ``product`` on all queries.

Run: python -m bench.languages --set manpages-l10n [--model multilingual] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.machine import describe as machine
from evaluation.set_check import bundled_sets
from index.config import IndexConfig
from index.knowledge_base import KnowledgeBase
from index.search import LocalSearchIndex, Mode
from index.search.fusion import DEFAULT_DEPTH, FUSION, Fusion, fused_candidates

K = 4
Search = Callable[[np.ndarray, str], list[int]]
Lexical = tuple[list[tuple[int, float]], list[tuple[int, float]]]


def _questions(folder: Path) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in (folder / "questions.jsonl").open(encoding="utf-8")]
    return [r for r in rows if r.get("needle")]


def _open(folder: Path, data_dir: Path, model: str) -> KnowledgeBase:
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir, embedding_model=model, min_free_bytes=0))
    if not kb.documents():
        kb.ingest_paths([folder / "corpus"])
    return kb


def _levers(kb: KnowledgeBase) -> dict[str, Search]:
    base = kb.search_index
    assert isinstance(base, LocalSearchIndex)
    snap = base.indexes.snapshot

    def with_fusion(fusion: Fusion, mode: Mode = Mode.HYBRID) -> Search:
        engine = LocalSearchIndex(base.indexes, fusion=fusion, adapters=base.adapters)
        return lambda v, q: [c.chunk_id for c in engine.search(v, q, None, K, mode)]

    def lexical(keep: Callable[[Lexical], Lexical]) -> Search:
        def search(v: np.ndarray, q: str) -> list[int]:
            own, foreign = keep(base._sparse(snap, q, DEFAULT_DEPTH, None))
            dense = snap.vectors.search(v, DEFAULT_DEPTH, None)
            found = fused_candidates(
                dense,
                own,
                FUSION,
                K,
                Mode.HYBRID,
                adapters=base.adapters,
                query_vector=v,
                distances_for=snap.vectors.distances_for,
                foreign=foreign,
            )
            return [c.chunk_id for c in found]

        return search

    def one_list(lists: Lexical) -> Lexical:
        merged = sorted(lists[0] + lists[1], key=lambda hit: -hit[1])[:DEFAULT_DEPTH]
        return merged, []

    return {
        "product": with_fusion(FUSION),
        "rrf": with_fusion(Fusion(method="rrf")),
        "score-1.0": with_fusion(replace(FUSION, sparse=1.0)),
        "own-only": lexical(lambda lists: (lists[0], [])),
        "one-list": lexical(one_list),
        "dense": with_fusion(FUSION, Mode.DENSE),
        "bm25": with_fusion(FUSION, Mode.BM25),
    }


def _groups(row: dict[str, str], phrasing: str) -> list[str]:
    lang = row.get("lang", "")
    doc_lang = row.get("doc_lang", lang)
    groups = ["all", f"{lang}", f"{lang}/{phrasing}", f"all/{phrasing}"]
    if lang != doc_lang:
        groups.append("cross-lingual")
    return groups


def run(set_name: str, model: str, data_dir: Path) -> None:
    folder = bundled_sets()[set_name]
    kb = _open(folder, data_dir, model)
    texts = {cid: row.content for cid, row in _all_chunks(kb).items()}
    levers = _levers(kb)
    hits: dict[str, dict[str, list[bool]]] = {name: defaultdict(list) for name in levers}
    for row in _questions(folder):
        for phrasing in ("doc", "ticket"):
            question = row[f"{phrasing}_phrasing"]
            vector = kb.embedder.encode_query(question)
            for name, search in levers.items():
                found = any(row["needle"] in texts.get(cid, "") for cid in search(vector, question))
                for group in _groups(row, phrasing):
                    hits[name][group].append(found)
    corpus = kb.search_index.indexes.snapshot.corpus_languages  # type: ignore[attr-defined]
    print(f"# {set_name}, {kb.embedder.name}, languages {sorted(corpus)}; {machine()}")
    groups = sorted(hits["product"], key=lambda g: (g.count("/"), g))
    print(f"{'R@4':<10}" + "".join(f"{g:>14}" for g in groups))
    for name, by_group in hits.items():
        print(f"{name:<10}" + "".join(f"{np.mean(by_group[g]):>14.3f}" for g in groups))
    base = hits["product"]["all"]
    for name, by_group in hits.items():
        if name == "product":
            continue
        wins = sum(b and not a for a, b in zip(base, by_group["all"], strict=True))
        losses = sum(a and not b for a, b in zip(base, by_group["all"], strict=True))
        print(f"{name} vs product: +{wins}/-{losses} of {len(base)} queries")


def _all_chunks(kb: KnowledgeBase) -> dict[int, object]:
    ids = [int(i) for i in kb.search_index.indexes.snapshot.chunk_ids]  # type: ignore[attr-defined]
    return kb.store.chunks_by_id(ids)  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--set", default="manpages-l10n")
    parser.add_argument("--model", default="multilingual")
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.data_dir is None:
        with tempfile.TemporaryDirectory() as tmp:
            run(args.set, args.model, Path(tmp))
    else:
        run(args.set, args.model, args.data_dir)


if __name__ == "__main__":
    main()
