"""The retrieval evaluation behind ``kb eval``: recall, destroyed answers, the gate's cost.

It needs no language model, so it can run on every deploy. Given a corpus
folder, ``questions.jsonl`` (``id``, ``needle``, ``doc_phrasing``,
``ticket_phrasing``) and ``ood.jsonl`` (``id``, ``question``, optional
``kind``), it indexes the corpus in a temporary data dir with the product's
own ingestion (``KnowledgeBase``) and searches it with the product's own
retrieval (``kb.search_index``, exactly the two steps of ``Engine.retrieve``:
embed the query, search), then measures:

* **Recall@1/4/8/20 and MRR** for dense, BM25 and hybrid retrieval. Every
  question is asked twice (documentation phrasing, support-ticket phrasing),
  so ``n = 2 x questions``. A retrieval is correct at ``k`` when one of the
  first ``k`` returned chunks' ``content`` contains the whole needle, as an
  exact substring (no normalisation: a needle that only matches after
  rewriting whitespace is a needle the chunker changed). Proportions carry a
  95 % Wilson interval; MRR (over the top 20) carries a 95 % percentile
  bootstrap interval (2000 resamples of the queries, fixed seed).
* **Destroyed answers**: needles that are in a document's canonical text but
  in no chunk's content, so no retriever can ever find them; needles missing
  from the canonical text altogether are counted apart (that is an error in
  the evaluation set or the extractor, not in chunking). Also the chunks the
  chunker split to fit the encoder window and the chunks whose embedded text
  is still over it (silently truncated by the encoder).
* **The gate's cost**, over a sweep of thresholds, on the product's hybrid
  candidates gated exactly as ``Engine.ask`` does: *bluffs* are
  out-of-domain questions with at least one chunk passing the gate; *refused*
  are in-domain queries with none; *answerable* are in-domain queries whose
  needle is among the kept chunks; *lost* are queries answerable without a
  threshold that the threshold makes unanswerable. Plus the distance
  distributions the threshold separates.
* Optionally the study's six **chunking strategies** (``evaluation.strategies``)
  side by side, each indexed through the same ingestion via the ``chunker``
  hook, with exact two-sided sign tests on the discordant pairs between every
  two strategies at R@4 and R@20.

The question files are read by ``evaluation.inputs``; the result types and the
counting behind them (intervals, sign tests, the threshold sweep) live in
``evaluation.results``.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from core.config import EngineConfig
from core.gate import CANDIDATES_PER_KEPT
from core.retrieve import Candidate, Mode
from core.selection import PassageSelector, retrieval_query
from evaluation.inputs import PHRASINGS, EvalSetError, OODQuestion, Question
from evaluation.kept import measure_kept
from evaluation.outcomes import Replay, related_sweep
from evaluation.results import (
    DEPTH,
    MODES,
    STRATEGY_MODES,
    TEST_KS,
    EvalResult,
    GateAnalysis,
    KeptResult,
    ModeResult,
    PairedTest,
    StrategyResult,
    default_thresholds,
    paired_test,
    strategy_tests,
    sweep,
)
from evaluation.strategies import PRODUCT, STRATEGIES, Chunker, make_chunker
from index.config import IndexConfig
from index.embed import Embedder, passage_budget
from index.errors import KBError
from index.knowledge_base import KnowledgeBase
from index.models import DocState
from index.search import QdrantSearchIndex
from index.storage import Store

__all__ = ["evaluate", "export_disliked", "indexed_corpus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Queries:
    """The evaluation's queries and their vectors, computed once for all indexings."""

    texts: list[str]
    question_index: list[int]
    vectors: np.ndarray
    ood_texts: list[str]
    ood_vectors: np.ndarray


def _encode_queries(
    embedder: Embedder, questions: Sequence[Question], ood: Sequence[OODQuestion], progress: bool
) -> _Queries:
    # Searched in their normal form (full-width letters folded, invisibles gone),
    # as every surface searches a question (``core.selection.retrieval_query``).
    texts = [retrieval_query(t) for q in questions for t in q.phrasings()]
    index = [i for i, _ in enumerate(questions) for _ in PHRASINGS]
    ood_texts = [retrieval_query(o.question) for o in ood]
    # One query at a time with ``encode_query``: the same call the product
    # makes, so the vectors are exactly the product's.
    vecs = [
        embedder.encode_query(t)
        for t in tqdm(texts + ood_texts, desc="embedding queries", unit="q", **_bar(progress))
    ]
    arr = np.vstack(vecs).astype(np.float32)
    return _Queries(texts, index, arr[: len(texts)], ood_texts, arr[len(texts) :])


def _bar(progress: bool) -> dict[str, Any]:
    import sys

    return {"disable": not progress, "file": sys.stderr, "leave": False}


@contextmanager
def indexed_corpus(
    corpus_dir: Path,
    config: IndexConfig,
    embedder: Embedder,
    *,
    chunker: Chunker | None = None,
    label: str = "",
    progress: bool = False,
) -> Iterator[KnowledgeBase]:
    """Index ``corpus_dir`` in a throw-away knowledge base with the product's ingestion.

    Its store is SQLite in a temporary data dir, whatever database ``config``
    names: the corpus never enters the operator's store (where users would
    find it), and no document of that store enters the measurement. The search
    engine is the configured one; on a Qdrant server the new store's id names
    collections of their own, deleted on exit with the rest.

    Args:
        corpus_dir: folder of documents.
        config: the product's ingestion settings (its data dir and database are
            replaced by a temporary SQLite store).
        embedder: the loaded embedder, shared by every indexing.
        chunker: another chunking strategy; ``None`` for the product's.
        label: shown on the progress bar.
        progress: show a progress bar on stderr.

    Yields:
        The knowledge base, deleted on exit.
    """
    with tempfile.TemporaryDirectory(prefix="kb-eval-", ignore_cleanup_errors=True) as tmp:
        own = replace(config, data_dir=Path(tmp), database_url="")
        kb = KnowledgeBase(own, embedder=embedder, chunker=chunker)
        try:
            files = sum(1 for p in Path(corpus_dir).rglob("*") if p.is_file())
            with tqdm(
                total=files, desc=f"indexing {label}".strip(), unit="file", **_bar(progress)
            ) as bar:

                def on_progress(event: str, info: dict[str, Any]) -> None:
                    if event == "file" and info["index"]:
                        bar.update(1)
                    elif event == "embedding":  # a long file: its passages move on
                        bar.set_postfix_str(f"{info['done']:,}/{info['total']:,} passages")

                kb.ingest_paths([Path(corpus_dir)], uploader="kb-eval", progress=on_progress)
                bar.update(bar.total - bar.n)
            yield kb
        finally:
            _discard_search_index(kb)
            kb.store.close()


def _discard_search_index(kb: KnowledgeBase) -> None:
    """Delete what the throw-away knowledge base made in a search engine outside its data dir."""
    index = kb.search_index
    if not isinstance(index, QdrantSearchIndex):
        return  # the local engine's files are in the temporary data dir
    try:
        index.drop_collections()
    except KBError as exc:
        log.warning("the evaluation's Qdrant collections could not be deleted: %s", exc)
    finally:
        index.close()


@dataclass(frozen=True)
class _Index:
    """What the measurements need to know about one indexing."""

    chunk_ids: list[int]
    contents: list[str]
    token_counts: list[int]
    canonical: list[str]
    documents: int
    failed: list[str]
    window_splits: int


def _read_index(store: Store) -> _Index:
    ids: list[int] = []
    contents: list[str] = []
    tokens: list[int] = []
    canonical: list[str] = []
    failed: list[str] = []
    documents = window_splits = 0
    for doc in store.documents():
        if doc.state != DocState.INDEXED:
            failed.append(f"{doc.name}: {doc.failure_reason}")
            continue
        documents += 1
        window_splits += doc.window_splits
        canonical.append(store.canonical_text(doc.id))
        for row in store.chunk_rows(doc.id):
            ids.append(int(row["id"]))
            contents.append(row["content"])
            tokens.append(int(row["token_count"]))
    return _Index(ids, contents, tokens, canonical, documents, failed, window_splits)


def _correct_chunks(index: _Index, needle: str) -> set[int]:
    return {
        cid
        for cid, content in zip(index.chunk_ids, index.contents, strict=True)
        if needle in content
    }


def _rank(candidates: Sequence[Candidate], correct: set[int]) -> int | None:
    return next((i for i, c in enumerate(candidates, start=1) if c.chunk_id in correct), None)


def _measure(
    name: str,
    kb: KnowledgeBase,
    questions: Sequence[Question],
    queries: _Queries,
    *,
    index_seconds: float,
    modes: Sequence[Mode],
    progress: bool,
) -> tuple[StrategyResult, list[set[int]]]:
    """Recall, MRR and destroyed answers of one indexed corpus."""
    index = _read_index(kb.store)
    correct = [_correct_chunks(index, q.needle) for q in questions]
    in_text = [any(q.needle in text for text in index.canonical) for q in questions]
    backend = kb.search_index
    ranks: dict[str, list[int | None]] = {m.value: [] for m in modes}
    started = time.perf_counter()
    rows = zip(queries.texts, queries.vectors, queries.question_index, strict=True)
    for text, vec, qi in tqdm(
        rows, total=len(queries.texts), desc=f"querying {name}", unit="q", **_bar(progress)
    ):
        for mode in modes:
            found = backend.search(vec, text, None, DEPTH, mode)
            ranks[mode.value].append(_rank(found, correct[qi]))
    query_ms = 1000 * (time.perf_counter() - started) / max(1, len(queries.texts))
    window = kb.embedder.max_tokens
    result = StrategyResult(
        name=name,
        label=STRATEGIES.get(name, name),
        documents=index.documents,
        failed_documents=index.failed,
        chunks=len(index.chunk_ids),
        questions=len(questions),
        destroyed=[
            q.id for q, c, t in zip(questions, correct, in_text, strict=True) if not c and t
        ],
        missing=[q.id for q, t in zip(questions, in_text, strict=True) if not t],
        window=window,
        window_splits=index.window_splits,
        over_window=sum(1 for n in index.token_counts if n > window),
        embedded_tokens=sum(index.token_counts),
        index_seconds=index_seconds,
        query_ms=query_ms,
        modes={m: ModeResult(m, r) for m, r in ranks.items()},
    )
    return result, correct


def _min_distance(kb: KnowledgeBase, vector: np.ndarray, ids: set[int]) -> float | None:
    if not ids:
        return None
    found = kb.search_index.distances_for(vector, sorted(ids))
    return min(float(d) for d in found.values()) if found else None


def _best(cands: Sequence[Candidate]) -> float | None:
    return min((c.distance for c in cands), default=None)


def _analyse_gate(
    kb: KnowledgeBase,
    queries: _Queries,
    ood: Sequence[OODQuestion],
    correct: Sequence[set[int]],
    *,
    threshold: float,
    related_threshold: float,
    engine: EngineConfig,
    thresholds: Sequence[float],
    progress: bool,
) -> GateAnalysis:
    """Hybrid candidates as ``Engine.ask`` fetches them (one per text), gated at every threshold."""
    top_k = engine.top_k
    selector = PassageSelector(kb, engine)
    depth = top_k * CANDIDATES_PER_KEPT
    texts = queries.texts + queries.ood_texts
    vectors = np.vstack([queries.vectors, queries.ood_vectors])
    cands = [
        selector.search(text, vec, None, every_leg=True)
        for text, vec in tqdm(
            list(zip(texts, vectors, strict=True)), desc="gate sweep", unit="q", **_bar(progress)
        )
    ]
    n_in = len(queries.texts)
    per_query_correct = [correct[qi] for qi in queries.question_index]
    ordered = _answer_ordered(kb, cands[:n_in], queries.texts, queries.vectors, engine)
    rows = sweep(
        ordered or cands[:n_in],
        cands[n_in:],
        sorted(set(thresholds) | {round(threshold, 4)}),
        top_k=top_k,
        correct=per_query_correct,
        max_kept=engine.max_kept,
        margin=engine.keep_margin,
        related_threshold=related_threshold,
    )
    replay = _replay(kb, cands[:n_in], cands[n_in:], per_query_correct, engine, ordered)
    rows_by_id = kb.store.chunks_by_id([c[0].chunk_id for c in cands[n_in:] if c])
    ood_rows = []
    for o, cs in zip(ood, cands[n_in:], strict=True):
        top = rows_by_id.get(cs[0].chunk_id) if cs else None
        ood_rows.append(
            {
                "id": o.id,
                "question": o.question,
                "kind": o.kind,
                "best_distance": _best(cs),
                "closest": f"{top.document} > {top.section}" if top else None,
            }
            | ({"lang": o.lang} if o.lang else {})
        )
    return GateAnalysis(
        threshold=threshold,
        top_k=top_k,
        candidates=depth,
        sweep=rows,
        in_domain_correct=[
            _min_distance(kb, v, c) for v, c in zip(queries.vectors, per_query_correct, strict=True)
        ],
        in_domain_best=[_best(c) for c in cands[:n_in]],
        ood_best=[_best(c) for c in cands[n_in:]],
        ood=ood_rows,
        outcomes=replay.outcomes(threshold, related_threshold),
        related_sweep=related_sweep(replay, threshold, thresholds),
        replay=replay,
    )


def _replay(
    kb: KnowledgeBase,
    in_domain: list[list[Candidate]],
    ood: list[list[Candidate]],
    correct: list[set[int]],
    engine: EngineConfig,
    kept_order: list[list[Candidate]] | None = None,
) -> Replay:
    ids = {c.chunk_id for cands in (*in_domain, *ood) for c in cands}
    sizes = {cid: len(row.content) for cid, row in kb.store.chunks_by_id(sorted(ids)).items()}
    return Replay(
        in_domain,
        ood,
        correct,
        sizes,
        top_k=engine.top_k,
        max_kept=engine.max_kept,
        margin=engine.keep_margin,
        kept_order=kept_order,
    )


def _answer_ordered(
    kb: KnowledgeBase,
    cands: list[list[Candidate]],
    texts: Sequence[str],
    vectors: np.ndarray,
    engine: EngineConfig,
) -> list[list[Candidate]] | None:
    """The candidates in the order an answer keeps them (``PassageSelector`` after the gate)."""
    selector = PassageSelector(kb, engine)
    if not selector.reorders():
        return None
    return [
        selector.ordered(text, vec, cs) for cs, text, vec in zip(cands, texts, vectors, strict=True)
    ]


def _mode_tests(product: StrategyResult) -> list[PairedTest]:
    pairs = [(Mode.HYBRID, Mode.DENSE), (Mode.HYBRID, Mode.BM25), (Mode.DENSE, Mode.BM25)]
    return [
        paired_test(
            a.value, b.value, product.modes[a.value], product.modes[b.value], k=k, mode=PRODUCT
        )
        for a, b in pairs
        for k in TEST_KS
    ]


def evaluate(
    corpus_dir: Path,
    questions: Sequence[Question],
    ood: Sequence[OODQuestion],
    *,
    embedder: Embedder,
    index: IndexConfig,
    engine: EngineConfig,
    strategies: Sequence[str] = (),
    thresholds: Sequence[float] | None = None,
    threshold: float | None = None,
    related_threshold: float | None = None,
    progress: bool = False,
    on_stage: Callable[[str], None] | None = None,
) -> EvalResult:
    """Index ``corpus_dir`` with the product's code and measure retrieval and the gate.

    Args:
        corpus_dir: folder of documents.
        questions: in-domain questions with needles.
        ood: questions the knowledge base should refuse.
        embedder: the loaded embedding model (shared by every strategy).
        index: the product's ingestion settings (chunk budget, embedding model).
        engine: the product's gate (``top_k``, threshold).
        strategies: letters of the study's strategies to compare too (``A``-``F``);
            empty for the product's chunker only.
        thresholds: the sweep (default ``default_thresholds``).
        threshold: the threshold to evaluate (default ``engine.threshold``).
        related_threshold: the related threshold to evaluate (default
            ``engine.related_threshold``).
        progress: show progress bars on stderr.
        on_stage: told the name of each stage as it starts (for logs).

    Returns:
        Every number, as an ``EvalResult``.
    """
    started = time.perf_counter()
    current = engine.threshold if threshold is None else threshold
    grid = list(thresholds) if thresholds is not None else default_thresholds(current)
    names = [s.upper() for s in strategies]
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise EvalSetError(
            f"Unknown chunking strategy {', '.join(unknown)}; choose from {', '.join(STRATEGIES)}."
        )
    queries = _encode_queries(embedder, questions, ood, progress)
    if on_stage:
        on_stage(PRODUCT)
    t = time.perf_counter()
    with indexed_corpus(corpus_dir, index, embedder, label=PRODUCT, progress=progress) as kb:
        seconds = time.perf_counter() - t
        product, correct = _measure(
            PRODUCT, kb, questions, queries, index_seconds=seconds, modes=MODES, progress=progress
        )
        gate_result = _analyse_gate(
            kb,
            queries,
            ood,
            correct,
            threshold=current,
            related_threshold=(
                engine.related_threshold if related_threshold is None else related_threshold
            ),
            engine=engine,
            thresholds=grid,
            progress=progress,
        )
        kept = _measure_kept(kb, queries, correct, engine, current, on_stage)
        query_map = kb.query_adapters.status()
    compared = _compare_strategies(
        corpus_dir, names, product, questions, queries, embedder, index, progress, on_stage
    )
    return EvalResult(
        corpus=str(corpus_dir),
        questions=list(questions),
        ood_questions=list(ood),
        embedding_model=embedder.name,
        chunk_budget=passage_budget(index, embedder),
        product=product,
        query_map=query_map,
        mode_tests=_mode_tests(product),
        gate=gate_result,
        strategies=compared,
        strategy_tests=strategy_tests(compared) if len(compared) > 1 else [],
        seconds=time.perf_counter() - started,
        kept=kept,
    )


def _measure_kept(
    kb: KnowledgeBase,
    queries: _Queries,
    correct: Sequence[set[int]],
    engine: EngineConfig,
    threshold: float,
    on_stage: Callable[[str], None] | None,
) -> KeptResult:
    """The kept passages as ``Engine.ask`` chooses them, with the configured reranker."""
    from core.rerank import Reranker  # loads a model only when one is configured

    if on_stage and engine.reranker:
        on_stage(f"reranker {engine.reranker}")
    return measure_kept(
        kb,
        queries.texts,
        queries.vectors,
        [correct[qi] for qi in queries.question_index],
        engine,
        threshold=threshold,
        reranker=Reranker(engine.reranker) if engine.reranker else None,
    )


def _compare_strategies(
    corpus_dir: Path,
    names: Sequence[str],
    product: StrategyResult,
    questions: Sequence[Question],
    queries: _Queries,
    embedder: Embedder,
    index: IndexConfig,
    progress: bool,
    on_stage: Callable[[str], None] | None,
) -> dict[str, StrategyResult]:
    out: dict[str, StrategyResult] = {}
    for name in sorted(set(names)):
        if name == PRODUCT:
            out[name] = product  # the product's run is strategy E, already measured
            continue
        if on_stage:
            on_stage(name)
        chunker = make_chunker(
            name,
            budget=passage_budget(index, embedder),
            count_tokens=embedder.count_tokens,
            max_tokens=embedder.max_tokens,
        )
        t = time.perf_counter()
        with indexed_corpus(
            corpus_dir, index, embedder, chunker=chunker, label=name, progress=progress
        ) as kb:
            seconds = time.perf_counter() - t
            out[name], _ = _measure(
                name,
                kb,
                questions,
                queries,
                index_seconds=seconds,
                modes=STRATEGY_MODES,
                progress=progress,
            )
    return out


# ---------------------------------------------------------------------- feedback loop


def export_disliked(store: Store, path: Path) -> int:
    """Write thumbs-down questions from the query log as candidate evaluation questions.

    Each line is ``{"id", "question", "needle": "", "doc_phrasing": question,
    "ticket_phrasing": "", "label": "todo"}``: an admin fills in the needle
    (the verbatim passage that answers it) and a second phrasing, or marks it
    out of domain, before it joins ``questions.jsonl`` / ``ood.jsonl``.

    Returns:
        The number of questions written.
    """
    rows = store.feedback.disliked_questions()
    lines = [
        json.dumps(
            {
                "id": f"log-{row['id']}",
                "question": row["question"],
                "needle": "",
                "doc_phrasing": row["question"],
                "ticket_phrasing": "",
                "label": "todo",
            },
            ensure_ascii=False,
        )
        for row in rows
    ]
    try:
        Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    except OSError as exc:
        raise EvalSetError(f"Cannot write {path}: {exc.strerror or exc}.") from exc
    return len(lines)
