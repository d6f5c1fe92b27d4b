"""The retrieval evaluation behind ``kb eval``: recall, destroyed answers, the gate's cost.

It needs no language model, so it can run on every deploy. Given a corpus
folder, ``questions.jsonl`` (``id``, ``needle``, ``doc_phrasing``,
``ticket_phrasing``) and ``ood.jsonl`` (``id``, ``question``, optional
``kind``), it indexes the corpus in a temporary data dir with the product's
own ingestion (``KnowledgeBase``) and searches it with the product's own
retrieval (``LocalBackend``, exactly the two steps of ``Engine.retrieve``:
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
* Optionally the study's six **chunking strategies** (``index.strategies``)
  side by side, each indexed through the same ingestion via the ``chunker``
  hook, with exact two-sided sign tests on the discordant pairs between every
  two strategies at R@4 and R@20.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from core.answer import CANDIDATES_PER_KEPT
from core.evalset_check import BUNDLED_EVALSET
from core.gate import gate
from core.retrieve import Candidate, LocalBackend, Mode
from core.stats import hits_at_k, paired_counts, sign_test, wilson_interval
from index.embed import Embedder
from index.errors import KBError
from index.knowledge_base import KnowledgeBase
from index.models import DocState
from index.settings import Settings
from index.store import Store
from index.strategies import PRODUCT, STRATEGIES, Chunker, make_chunker

RECALL_KS = (1, 4, 8, 20)
"""The cut-offs recall is reported at."""
DEPTH = max(RECALL_KS)
"""How many chunks each query retrieves for recall and MRR."""
TEST_KS = (4, 20)
"""The cut-offs of the paired sign tests."""
MODES = (Mode.DENSE, Mode.BM25, Mode.HYBRID)
STRATEGY_MODES = (Mode.HYBRID, Mode.DENSE)
"""Modes measured for every chunking strategy (BM25 is reported for the product only)."""
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
PHRASINGS = ("doc", "ticket")

BUNDLED_CORPUS = BUNDLED_EVALSET / "corpus"
BUNDLED_QUESTIONS = BUNDLED_EVALSET / "questions.jsonl"
BUNDLED_OOD = BUNDLED_EVALSET / "ood.jsonl"


class EvalSetError(KBError):
    """An evaluation file is missing, malformed or unlabelled."""


# ---------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Question:
    """An in-domain question and the verbatim passage that answers it."""

    id: str
    needle: str
    doc_phrasing: str
    ticket_phrasing: str

    def phrasings(self) -> tuple[str, str]:
        """The two ways the question is asked, in ``PHRASINGS`` order."""
        return self.doc_phrasing, self.ticket_phrasing


@dataclass(frozen=True)
class OODQuestion:
    """A question the knowledge base should refuse."""

    id: str
    question: str
    kind: str = ""


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The objects of a JSON-lines file with their line numbers; blank lines skipped.

    Raises:
        EvalSetError: the file cannot be read or a line is not a JSON object.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvalSetError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    rows: list[tuple[int, dict[str, Any]]] = []
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalSetError(f"{path}:{no}: not valid JSON ({exc.msg}).") from exc
        if not isinstance(obj, dict):
            raise EvalSetError(f"{path}:{no}: expected a JSON object.")
        rows.append((no, obj))
    return rows


def _fields(path: Path, no: int, obj: dict[str, Any], names: Sequence[str]) -> list[str]:
    values = []
    for name in names:
        value = obj.get(name)
        if not isinstance(value, str) or not value.strip():
            hint = " (label exported candidates before using them)" if obj.get("label") else ""
            raise EvalSetError(f"{path}:{no}: field {name!r} must be a non-empty string{hint}.")
        values.append(value if name == "needle" else value.strip())
    return values


def _unique(path: Path, ids: list[str]) -> None:
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise EvalSetError(f"{path}: id {i!r} appears twice.")
        seen.add(i)


def load_questions(path: Path) -> list[Question]:
    """Read ``questions.jsonl``.

    Raises:
        EvalSetError: a required field is missing or empty, or an id repeats.
    """
    out = []
    for no, obj in read_jsonl(path):
        qid, needle, doc, ticket = _fields(
            path, no, obj, ("id", "needle", "doc_phrasing", "ticket_phrasing")
        )
        out.append(Question(qid, needle, doc, ticket))
    _unique(path, [q.id for q in out])
    if not out:
        raise EvalSetError(f"{path} holds no questions.")
    return out


def load_ood(path: Path) -> list[OODQuestion]:
    """Read ``ood.jsonl``.

    Raises:
        EvalSetError: a required field is missing or empty, or an id repeats.
    """
    out = []
    for no, obj in read_jsonl(path):
        qid, question = _fields(path, no, obj, ("id", "question"))
        out.append(OODQuestion(qid, question, str(obj.get("kind") or "")))
    _unique(path, [q.id for q in out])
    if not out:
        raise EvalSetError(f"{path} holds no out-of-domain questions.")
    return out


# ---------------------------------------------------------------------- results


@dataclass(frozen=True)
class Proportion:
    """``successes / n`` with its 95 % Wilson interval."""

    successes: int
    n: int

    @property
    def value(self) -> float:
        """The point estimate (0 when ``n == 0``)."""
        return self.successes / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        """The 95 % Wilson score interval."""
        return wilson_interval(self.successes, self.n)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        low, high = self.interval
        return {"k": self.successes, "n": self.n, "value": self.value, "ci95": [low, high]}


@dataclass(frozen=True)
class MeanCI:
    """A mean with a 95 % percentile-bootstrap interval."""

    mean: float
    low: float
    high: float
    method: str = f"percentile bootstrap, {BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"value": self.mean, "ci95": [self.low, self.high], "method": self.method}


def bootstrap_mean(values: Sequence[float]) -> MeanCI:
    """Mean of ``values`` with a 95 % percentile bootstrap interval (deterministic)."""
    if not values:
        return MeanCI(0.0, 0.0, 1.0)
    arr = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = arr[rng.integers(0, arr.size, size=(BOOTSTRAP_RESAMPLES, arr.size))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return MeanCI(float(arr.mean()), float(low), float(high))


@dataclass
class ModeResult:
    """Recall and MRR of one retrieval mode.

    Attributes:
        mode: ``dense``, ``bm25`` or ``hybrid``.
        ranks: per query, the 1-based rank of the first correct chunk within
            the top ``DEPTH``, or ``None``.
    """

    mode: str
    ranks: list[int | None]

    @property
    def n(self) -> int:
        """Number of queries."""
        return len(self.ranks)

    def hits(self, k: int) -> list[bool]:
        """Per-query success at ``k``."""
        return hits_at_k(self.ranks, k)

    def recall(self, k: int) -> Proportion:
        """Recall@k with its Wilson interval."""
        return Proportion(sum(self.hits(k)), self.n)

    @property
    def mrr(self) -> MeanCI:
        """Mean reciprocal rank over the top ``DEPTH`` (0 for a miss)."""
        return bootstrap_mean([1.0 / r if r else 0.0 for r in self.ranks])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "n": self.n,
            "recall": {str(k): self.recall(k).to_dict() for k in RECALL_KS},
            "mrr": self.mrr.to_dict(),
            "ranks": self.ranks,
        }


@dataclass
class StrategyResult:
    """Everything measured on one indexing of the corpus.

    Attributes:
        name: strategy letter (``E`` is the product's chunker).
        label: short description.
        documents: documents indexed.
        failed_documents: ``name: reason`` of documents that failed to index.
        chunks: chunks indexed.
        questions: number of questions (needles).
        destroyed: ids of questions whose needle is in the corpus but in no chunk.
        missing: ids of questions whose needle is in no document's canonical text.
        window: the encoder window in word-pieces.
        window_splits: chunks the chunker split to fit the window (sum over documents).
        over_window: chunks whose embedded text is longer than the window.
        embedded_tokens: word-pieces embedded over the whole index.
        index_seconds: time to ingest the corpus.
        query_ms: mean time of one search (all modes together), embedding excluded.
        modes: recall and MRR per retrieval mode.
    """

    name: str
    label: str
    documents: int
    failed_documents: list[str]
    chunks: int
    questions: int
    destroyed: list[str]
    missing: list[str]
    window: int
    window_splits: int
    over_window: int
    embedded_tokens: int
    index_seconds: float
    query_ms: float
    modes: dict[str, ModeResult]

    def destroyed_share(self) -> Proportion:
        """Destroyed needles over all questions."""
        return Proportion(len(self.destroyed), self.questions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "label": self.label,
            "documents": self.documents,
            "failed_documents": self.failed_documents,
            "chunks": self.chunks,
            "questions": self.questions,
            "destroyed": {**self.destroyed_share().to_dict(), "ids": self.destroyed},
            "missing_from_corpus": self.missing,
            "window": self.window,
            "window_splits": self.window_splits,
            "over_window": self.over_window,
            "embedded_tokens": self.embedded_tokens,
            "index_seconds": round(self.index_seconds, 2),
            "query_ms": round(self.query_ms, 2),
            "modes": {m: r.to_dict() for m, r in self.modes.items()},
        }


@dataclass(frozen=True)
class PairedTest:
    """An exact two-sided sign test: ``first`` against ``second`` on the same queries."""

    first: str
    second: str
    mode: str
    k: int
    wins: int
    losses: int
    p: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def paired_test(
    first: str, second: str, a: ModeResult, b: ModeResult, *, k: int, mode: str
) -> PairedTest:
    """Sign test of ``a`` against ``b`` at ``k`` over their discordant queries."""
    wins, losses = paired_counts(a.hits(k), b.hits(k))
    return PairedTest(first, second, mode, k, wins, losses, sign_test(wins, losses))


@dataclass(frozen=True)
class SweepRow:
    """What one threshold costs.

    Attributes:
        threshold: the cosine-distance cut.
        bluffs: out-of-domain questions with at least one chunk passing the gate.
        refused: in-domain queries with no chunk passing.
        answerable: in-domain queries whose needle is among the kept chunks
            (``None`` when the questions have no needles, as in a labelled log).
        lost: queries answerable without a threshold and not at this one.
    """

    threshold: float
    bluffs: Proportion
    refused: Proportion
    answerable: Proportion | None = None
    lost: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "threshold": self.threshold,
            "bluffs": self.bluffs.to_dict(),
            "refused": self.refused.to_dict(),
            "answerable": self.answerable.to_dict() if self.answerable else None,
            "lost": self.lost,
        }


NO_THRESHOLD = 2.0
"""The largest cosine distance: a gate at 2.0 keeps every candidate."""


def default_thresholds(current: float) -> list[float]:
    """0.30 to 0.90 in steps of 0.025, plus the configured threshold."""
    grid = {round(0.30 + 0.025 * i, 4) for i in range(25)}
    return sorted(grid | {round(current, 4)})


def sweep(
    in_domain: Sequence[Sequence[Candidate]],
    ood: Sequence[Sequence[Candidate]],
    thresholds: Sequence[float],
    *,
    top_k: int,
    correct: Sequence[set[int]] | None = None,
) -> list[SweepRow]:
    """Gate every query's candidates at every threshold and count the outcomes.

    Args:
        in_domain: per in-domain query, its fused candidates (best first).
        ood: per out-of-domain question, its fused candidates.
        thresholds: the thresholds to try.
        top_k: the gate's ``top_k``.
        correct: per in-domain query, the chunk ids containing its needle;
            without it ``answerable`` and ``lost`` are not computed.

    Returns:
        One row per threshold, in increasing order.
    """

    def kept(cands: Sequence[Candidate], t: float) -> list[Candidate]:
        return gate(cands, threshold=t, top_k=top_k)

    def answers(i: int, t: float) -> bool:
        assert correct is not None
        return any(c.chunk_id in correct[i] for c in kept(in_domain[i], t))

    ungated = [answers(i, NO_THRESHOLD) for i in range(len(in_domain))] if correct else []
    rows = []
    for t in sorted(set(thresholds)):
        bluffs = sum(1 for cands in ood if kept(cands, t))
        refused = sum(1 for cands in in_domain if not kept(cands, t))
        row = SweepRow(t, Proportion(bluffs, len(ood)), Proportion(refused, len(in_domain)))
        if correct is not None:
            ok = [answers(i, t) for i in range(len(in_domain))]
            lost = sum(1 for before, now in zip(ungated, ok, strict=True) if before and not now)
            row = SweepRow(
                row.threshold, row.bluffs, row.refused, Proportion(sum(ok), len(ok)), lost
            )
        rows.append(row)
    return rows


@dataclass
class GateAnalysis:
    """The refusal gate on the product's index: the sweep and the distances behind it.

    Attributes:
        threshold: the threshold being evaluated (the configured one unless overridden).
        top_k: the gate's ``top_k``.
        candidates: fused candidates the gate looks at (``top_k * 5``, as ``Engine.ask``).
        sweep: one row per threshold.
        in_domain_correct: per in-domain query, the smallest cosine distance
            to any chunk containing its needle (``None`` if destroyed).
        in_domain_best: per in-domain query, the smallest distance among its candidates.
        ood_best: per out-of-domain question, the smallest distance among its candidates.
        ood: per out-of-domain question: id, question, kind, best distance and
            the document / section of its closest candidate.
    """

    threshold: float
    top_k: int
    candidates: int
    sweep: list[SweepRow]
    in_domain_correct: list[float | None]
    in_domain_best: list[float | None]
    ood_best: list[float | None]
    ood: list[dict[str, Any]]

    @property
    def current(self) -> SweepRow:
        """The sweep row of the evaluated threshold."""
        return next(r for r in self.sweep if abs(r.threshold - round(self.threshold, 4)) < 1e-9)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "threshold": self.threshold,
            "top_k": self.top_k,
            "candidates": self.candidates,
            "current": self.current.to_dict(),
            "sweep": [r.to_dict() for r in self.sweep],
            "distances": {
                "in_domain_correct": self.in_domain_correct,
                "in_domain_best": self.in_domain_best,
                "ood_best": self.ood_best,
            },
            "ood": self.ood,
        }


@dataclass
class EvalResult:
    """Everything ``kb eval`` measured (``to_dict`` is what ``--json`` prints)."""

    corpus: str
    questions: list[Question]
    ood_questions: list[OODQuestion]
    embedding_model: str
    chunk_budget: int
    product: StrategyResult
    mode_tests: list[PairedTest]
    gate: GateAnalysis
    strategies: dict[str, StrategyResult] = field(default_factory=dict)
    strategy_tests: list[PairedTest] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def n_queries(self) -> int:
        """In-domain queries asked: two phrasings per question."""
        return len(self.questions) * len(PHRASINGS)

    def queries(self) -> list[dict[str, str]]:
        """The in-domain queries in evaluation order (question id, phrasing, text)."""
        return [
            {"question_id": q.id, "phrasing": p, "text": text}
            for q in self.questions
            for p, text in zip(PHRASINGS, q.phrasings(), strict=True)
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form of every number."""
        return {
            "corpus": self.corpus,
            "embedding_model": self.embedding_model,
            "chunk_budget": self.chunk_budget,
            "questions": len(self.questions),
            "queries": self.n_queries,
            "ood_questions": len(self.ood_questions),
            "recall_ks": list(RECALL_KS),
            "depth": DEPTH,
            "product": self.product.to_dict(),
            "mode_tests": [t.to_dict() for t in self.mode_tests],
            "gate": self.gate.to_dict(),
            "strategies": {n: s.to_dict() for n, s in self.strategies.items()},
            "strategy_tests": [t.to_dict() for t in self.strategy_tests],
            "query_order": self.queries(),
            "seconds": round(self.seconds, 2),
        }


# ---------------------------------------------------------------------- running


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
    texts = [t for q in questions for t in q.phrasings()]
    index = [i for i, _ in enumerate(questions) for _ in PHRASINGS]
    ood_texts = [o.question for o in ood]
    # One query at a time with ``encode_query``: the same call ``Engine.retrieve``
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
    settings: Settings,
    embedder: Embedder,
    *,
    chunker: Chunker | None = None,
    label: str = "",
    progress: bool = False,
) -> Iterator[KnowledgeBase]:
    """Index ``corpus_dir`` in a throw-away data dir with the product's ingestion.

    Args:
        corpus_dir: folder of documents.
        settings: product settings (its data dir is replaced by a temporary one).
        embedder: the loaded embedder, shared by every indexing.
        chunker: another chunking strategy; ``None`` for the product's.
        label: shown on the progress bar.
        progress: show a progress bar on stderr.

    Yields:
        The knowledge base, deleted on exit.
    """
    with tempfile.TemporaryDirectory(prefix="kb-eval-", ignore_cleanup_errors=True) as tmp:
        kb = KnowledgeBase(
            settings.model_copy(update={"data_dir": Path(tmp)}), embedder=embedder, chunker=chunker
        )
        files = sum(1 for p in Path(corpus_dir).rglob("*") if p.is_file())
        with tqdm(
            total=files, desc=f"indexing {label}".strip(), unit="file", **_bar(progress)
        ) as bar:

            def on_progress(event: str, info: dict[str, Any]) -> None:
                if event == "file" and info["index"]:
                    bar.update(1)

            kb.ingest_paths([Path(corpus_dir)], uploader="kb-eval", progress=on_progress)
            bar.update(bar.total - bar.n)
        try:
            yield kb
        finally:
            kb.store.db.conn.close()


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
        if doc["state"] != DocState.INDEXED.value:
            failed.append(f"{doc['name']}: {doc['failure_reason']}")
            continue
        documents += 1
        window_splits += int(doc["window_splits"] or 0)
        canonical.append(store.canonical_text(int(doc["id"])))
        for row in store.chunk_rows(int(doc["id"])):
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
    backend = LocalBackend(kb.indexes)
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
    found = dict(kb.indexes.snapshot.vectors.distances_for(vector, sorted(ids)))
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
    top_k: int,
    thresholds: Sequence[float],
    progress: bool,
) -> GateAnalysis:
    """Hybrid candidates as ``Engine.ask`` fetches them, gated at every threshold."""
    backend = LocalBackend(kb.indexes)
    depth = top_k * CANDIDATES_PER_KEPT
    texts = queries.texts + queries.ood_texts
    vectors = np.vstack([queries.vectors, queries.ood_vectors])
    cands = [
        backend.search(vec, text, None, depth, Mode.HYBRID)
        for text, vec in tqdm(
            list(zip(texts, vectors, strict=True)), desc="gate sweep", unit="q", **_bar(progress)
        )
    ]
    n_in = len(queries.texts)
    per_query_correct = [correct[qi] for qi in queries.question_index]
    rows = sweep(
        cands[:n_in],
        cands[n_in:],
        sorted(set(thresholds) | {round(threshold, 4)}),
        top_k=top_k,
        correct=per_query_correct,
    )
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
    )


def _mode_tests(product: StrategyResult) -> list[PairedTest]:
    pairs = [(Mode.HYBRID, Mode.DENSE), (Mode.HYBRID, Mode.BM25), (Mode.DENSE, Mode.BM25)]
    return [
        paired_test(
            a.value, b.value, product.modes[a.value], product.modes[b.value], k=k, mode=PRODUCT
        )
        for a, b in pairs
        for k in TEST_KS
    ]


def strategy_tests(results: dict[str, StrategyResult]) -> list[PairedTest]:
    """Sign tests between every two strategies (later letter first), per mode and cut-off."""
    names = sorted(results)
    tests: list[PairedTest] = []
    for mode in STRATEGY_MODES:
        for earlier, later in combinations(names, 2):
            a, b = results[later].modes[mode.value], results[earlier].modes[mode.value]
            tests.extend(paired_test(later, earlier, a, b, k=k, mode=mode.value) for k in TEST_KS)
    return tests


def evaluate(
    corpus_dir: Path,
    questions: Sequence[Question],
    ood: Sequence[OODQuestion],
    *,
    embedder: Embedder,
    settings: Settings,
    strategies: Sequence[str] = (),
    thresholds: Sequence[float] | None = None,
    threshold: float | None = None,
    progress: bool = False,
    on_stage: Callable[[str], None] | None = None,
) -> EvalResult:
    """Index ``corpus_dir`` with the product's code and measure retrieval and the gate.

    Args:
        corpus_dir: folder of documents.
        questions: in-domain questions with needles.
        ood: questions the knowledge base should refuse.
        embedder: the loaded embedding model (shared by every strategy).
        settings: product settings (chunk budget, ``top_k``, threshold).
        strategies: letters of the study's strategies to compare too (``A``-``F``);
            empty for the product's chunker only.
        thresholds: the sweep (default ``default_thresholds``).
        threshold: the threshold to evaluate (default ``settings.threshold``).
        progress: show progress bars on stderr.
        on_stage: told the name of each stage as it starts (for logs).

    Returns:
        Every number, as an ``EvalResult``.
    """
    started = time.perf_counter()
    current = settings.threshold if threshold is None else threshold
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
    with indexed_corpus(corpus_dir, settings, embedder, label=PRODUCT, progress=progress) as kb:
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
            top_k=settings.top_k,
            thresholds=grid,
            progress=progress,
        )
    compared = _compare_strategies(
        corpus_dir, names, product, questions, queries, embedder, settings, progress, on_stage
    )
    return EvalResult(
        corpus=str(corpus_dir),
        questions=list(questions),
        ood_questions=list(ood),
        embedding_model=embedder.name,
        chunk_budget=settings.chunk_budget,
        product=product,
        mode_tests=_mode_tests(product),
        gate=gate_result,
        strategies=compared,
        strategy_tests=strategy_tests(compared) if len(compared) > 1 else [],
        seconds=time.perf_counter() - started,
    )


def _compare_strategies(
    corpus_dir: Path,
    names: Sequence[str],
    product: StrategyResult,
    questions: Sequence[Question],
    queries: _Queries,
    embedder: Embedder,
    settings: Settings,
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
            budget=settings.chunk_budget,
            count_tokens=embedder.count_tokens,
            max_tokens=embedder.max_tokens,
        )
        t = time.perf_counter()
        with indexed_corpus(
            corpus_dir, settings, embedder, chunker=chunker, label=name, progress=progress
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
    rows = store.disliked_questions()
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
