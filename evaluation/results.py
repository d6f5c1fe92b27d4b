"""What ``kb eval`` measures, as result types, and the pure computations behind them.

Recall and MRR of one retrieval mode (``ModeResult``), everything measured on
one indexing of the corpus (``StrategyResult``), exact sign tests between two
modes or strategies (``PairedTest``), the refusal gate's cost over a sweep of
thresholds (``SweepRow``, ``sweep``, ``GateAnalysis``), the passages an answer
is written from (``KeptResult``, measured by ``evaluation.kept``) and the whole
run (``EvalResult``), and all of it per language (``LanguageFigures``, over the
groups of ``evaluation.languages``). Nothing here indexes or searches: given ranks and candidates
it only counts, which is what ``kb calibrate`` and the report reuse. Every
type's ``to_dict`` is the form ``--json`` prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

import numpy as np

from core.gate import gate
from core.retrieve import Candidate, Mode
from evaluation.inputs import PHRASINGS, OODQuestion, Question
from evaluation.languages import LanguageGroup, language_groups, pick
from evaluation.outcomes import Outcomes, RelatedRow, Replay
from evaluation.stats import Proportion, hits_at_k, paired_counts, sign_test

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "BOOTSTRAP_SEED",
    "DEPTH",
    "FINAL_MODE",
    "KEPT_ANSWERABLE",
    "KEPT_FIRST",
    "MODES",
    "NO_THRESHOLD",
    "RECALL_KS",
    "STRATEGY_MODES",
    "TEST_KS",
    "EvalResult",
    "GateAnalysis",
    "KeptResult",
    "LanguageFigures",
    "MeanCI",
    "ModeResult",
    "PairedTest",
    "PhrasingFigures",
    "StrategyResult",
    "SweepRow",
    "bootstrap_mean",
    "default_thresholds",
    "paired_test",
    "strategy_tests",
    "sweep",
]

RECALL_KS = (1, 4, 8, 20)
"""The cut-offs recall is reported at."""
DEPTH = max(RECALL_KS)
"""How many chunks each query retrieves for recall and MRR."""
TEST_KS = (4, 20)
"""The cut-offs of the paired sign tests."""
MODES = (Mode.DENSE, Mode.BM25, Mode.HYBRID)
STRATEGY_MODES = (Mode.HYBRID, Mode.DENSE)
"""Modes measured for every chunking strategy (BM25 is reported for the product only)."""
FINAL_MODE = "final"
"""In ``--json``: the order passages reach the asker in (hybrid, or reranked by ``KB_RERANKER``)."""
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


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

    def subset(self, positions: Sequence[int]) -> ModeResult:
        """The same mode over the queries at ``positions`` only."""
        return ModeResult(self.mode, pick(self.ranks, positions))

    def to_dict(self, *, ranks: bool = True) -> dict[str, Any]:
        """JSON-ready form (without the per-query ranks unless ``ranks``)."""
        out: dict[str, Any] = {
            "n": self.n,
            "recall": {str(k): self.recall(k).to_dict() for k in RECALL_KS},
            "mrr": self.mrr.to_dict(),
        }
        return out | {"ranks": self.ranks} if ranks else out


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


def strategy_tests(results: dict[str, StrategyResult]) -> list[PairedTest]:
    """Sign tests between every two strategies (later letter first), per mode and cut-off."""
    names = sorted(results)
    tests: list[PairedTest] = []
    for mode in STRATEGY_MODES:
        for earlier, later in combinations(names, 2):
            a, b = results[later].modes[mode.value], results[earlier].modes[mode.value]
            tests.extend(paired_test(later, earlier, a, b, k=k, mode=mode.value) for k in TEST_KS)
    return tests


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
    """0.30 to 0.90 in steps of 0.025, plus the configured threshold; for a model whose
    thresholds sit below 0.3 (multilingual-e5), 0.05 to 0.35 in steps of 0.005."""
    if current >= 0.3:
        grid = {round(0.30 + 0.025 * i, 4) for i in range(25)}
    else:
        grid = {round(0.05 + 0.005 * i, 4) for i in range(61)}
    return sorted(grid | {round(current, 4)})


def sweep(
    in_domain: Sequence[Sequence[Candidate]],
    ood: Sequence[Sequence[Candidate]],
    thresholds: Sequence[float],
    *,
    top_k: int,
    correct: Sequence[set[int]] | None = None,
    max_kept: int = 0,
    margin: float = 0.0,
    related_threshold: float = 0.0,
) -> list[SweepRow]:
    """Gate every query's candidates at every threshold and count the outcomes.

    Args:
        in_domain: per in-domain query, its fused candidates (best first).
        ood: per out-of-domain question, its fused candidates.
        thresholds: the thresholds to try.
        top_k: the gate's ``top_k``.
        correct: per in-domain query, the chunk ids containing its needle;
            without it ``answerable`` and ``lost`` are not computed.
        max_kept: the gate's ``max_kept`` (more passages when as close as the best).
        margin: the gate's ``margin`` for those.
        related_threshold: how far the passages an answer is written from may
            be once the threshold has passed (``core.gate.gate``).

    Returns:
        One row per threshold, in increasing order.
    """

    def kept(cands: Sequence[Candidate], t: float) -> list[Candidate]:
        return gate(
            cands,
            threshold=t,
            top_k=top_k,
            max_kept=max_kept,
            margin=margin,
            related_threshold=related_threshold,
        )

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
        outcomes: at the evaluated thresholds, answered / related / refused and
            whether the needle was shown, per query.
        related_sweep: the related threshold's sweep at the evaluated threshold.
        replay: the candidates behind both, to replay the gate at other
            thresholds (``kb calibrate``); not printed.
    """

    threshold: float
    top_k: int
    candidates: int
    sweep: list[SweepRow]
    in_domain_correct: list[float | None]
    in_domain_best: list[float | None]
    ood_best: list[float | None]
    ood: list[dict[str, Any]]
    outcomes: Outcomes | None = None
    related_sweep: list[RelatedRow] = field(default_factory=list)
    replay: Replay | None = field(default=None, repr=False, compare=False)

    @property
    def current(self) -> SweepRow:
        """The sweep row of the evaluated threshold."""
        return next(r for r in self.sweep if abs(r.threshold - round(self.threshold, 4)) < 1e-9)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; the outcomes' proportions join the current row, their
        per-query values ``per_query`` (so two runs pair them query by query)."""
        current = self.current.to_dict()
        extra: dict[str, Any] = {}
        if self.outcomes is not None:
            current |= self.outcomes.current()
            extra = {
                "related_threshold": self.outcomes.related_threshold,
                "outcomes": self.outcomes.to_dict(),
                "per_query": self.outcomes.per_query(),
                "related_sweep": [r.to_dict() for r in self.related_sweep],
            }
        return {
            "threshold": self.threshold,
            **extra,
            "top_k": self.top_k,
            "candidates": self.candidates,
            "current": current,
            "sweep": [r.to_dict() for r in self.sweep],
            "distances": {
                "in_domain_correct": self.in_domain_correct,
                "in_domain_best": self.in_domain_best,
                "ood_best": self.ood_best,
            },
            "ood": self.ood,
        }


KEPT_ANSWERABLE = "kept_answerable"
KEPT_FIRST = "kept_first"


@dataclass
class KeptResult:
    """What the asker would be shown, per in-domain query.

    Attributes:
        reranker: the reranker's name, or ``None`` (fused order).
        threshold: the gate's threshold.
        answerable: per query, the needle is among the kept passages.
        first: per query, the needle is in the first kept passage.
        reranked: ranks of the needle in the reranked top ``DEPTH`` (with a reranker).
        rerank_ms: per query, the time the reranker took for the kept passages.
        ordered: ranks of the needle in the top ``DEPTH`` in answer order
            (``core.retrieve.answer_order``; with a sentence or proximity weight).
    """

    reranker: str | None
    threshold: float
    answerable: list[bool]
    first: list[bool]
    reranked: ModeResult | None = None
    rerank_ms: list[float] | None = None
    ordered: ModeResult | None = None

    def current(self) -> dict[str, dict[str, Any]]:
        """The proportions, as rows of the gate at its threshold."""
        return {
            KEPT_ANSWERABLE: Proportion(sum(self.answerable), len(self.answerable)).to_dict(),
            KEPT_FIRST: Proportion(sum(self.first), len(self.first)).to_dict(),
        }

    def per_query(self) -> dict[str, list[bool]]:
        """The per-query outcomes behind :meth:`current`."""
        return {KEPT_ANSWERABLE: self.answerable, KEPT_FIRST: self.first}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        times = self.rerank_ms or []
        return {
            "reranker": self.reranker,
            "threshold": self.threshold,
            **self.current(),
            "reranked": self.reranked.to_dict() if self.reranked else None,
            "rerank_ms": {
                "median": float(np.median(times)) if times else None,
                "p90": float(np.percentile(times, 90)) if times else None,
            },
        }


@dataclass(frozen=True)
class PhrasingFigures:
    """Retrieval and the gate over one subset of queries: a language group's, one phrasing or all.

    Attributes:
        phrasing: ``all``, ``doc`` or ``ticket``.
        queries: in-domain queries in the subset.
        modes: recall and MRR per retrieval mode, over the subset.
        gate: each in-domain gate outcome at the evaluated threshold, over the subset.
    """

    phrasing: str
    queries: int
    modes: dict[str, ModeResult]
    gate: dict[str, Proportion]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the per-query ranks are the run's own, in ``query_order``)."""
        return {
            "queries": self.queries,
            "modes": {m: r.to_dict(ranks=False) for m, r in self.modes.items()},
            "gate": {name: p.to_dict() for name, p in self.gate.items()},
        }


@dataclass(frozen=True)
class LanguageFigures:
    """Every figure of one language group (``evaluation.languages``).

    Attributes:
        language: an ISO 639-1 code, or ``cross-lingual``.
        questions: in-domain questions in the group.
        destroyed: the group's needles in the corpus and in no chunk, over its questions.
        phrasings: all phrasings, then each (empty without in-domain questions).
        ood_questions: out-of-domain questions in the group.
        ood: each out-of-domain gate outcome over them; ``None`` for the
            cross-lingual group.
    """

    language: str
    questions: int
    destroyed: Proportion
    phrasings: list[PhrasingFigures]
    ood_questions: int
    ood: dict[str, Proportion] | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "questions": self.questions,
            "destroyed": self.destroyed.to_dict(),
            "phrasings": {f.phrasing: f.to_dict() for f in self.phrasings},
            "ood_questions": self.ood_questions,
            "ood": {n: p.to_dict() for n, p in self.ood.items()} if self.ood is not None else None,
        }


def _shares(outcomes: dict[str, list[bool]], positions: Sequence[int]) -> dict[str, Proportion]:
    """Each per-query outcome as a proportion over the queries at ``positions``."""
    return {
        name: Proportion(sum(pick(values, positions)), len(positions))
        for name, values in outcomes.items()
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
    query_map: dict[str, object] | str
    mode_tests: list[PairedTest]
    gate: GateAnalysis
    strategies: dict[str, StrategyResult] = field(default_factory=dict)
    strategy_tests: list[PairedTest] = field(default_factory=list)
    seconds: float = 0.0
    kept: KeptResult | None = None

    @property
    def n_queries(self) -> int:
        """In-domain queries asked: two phrasings per question."""
        return len(self.questions) * len(PHRASINGS)

    def queries(self) -> list[dict[str, str]]:
        """The in-domain queries in evaluation order (question id, phrasing, text).

        A question with a ``lang`` adds it and its ``doc_lang``.
        """
        return [
            {"question_id": q.id, "phrasing": p, "text": text}
            | ({"lang": q.lang, "doc_lang": q.doc_lang or q.lang} if q.lang else {})
            for q in self.questions
            for p, text in zip(PHRASINGS, q.phrasings(), strict=True)
        ]

    def modes(self) -> dict[str, ModeResult]:
        """The product's modes, and ``final`` (the order passages reach the asker in) if measured."""
        modes = dict(self.product.modes)
        if self.kept is not None:
            final = self.kept.reranked or self.kept.ordered or modes[Mode.HYBRID.value]
            modes[FINAL_MODE] = ModeResult(FINAL_MODE, final.ranks)
        return modes

    def gate_outcomes(self) -> tuple[dict[str, list[bool]], dict[str, list[bool]]]:
        """Per-query gate outcomes at the evaluated threshold: ``(in-domain, out-of-domain)``.

        ``refused`` and ``bluffs`` are read from the best candidate distances
        (nothing passes exactly when the best is over the threshold), the rest
        are ``gate.per_query`` (the outcomes and the kept passages).
        """
        g = self.gate
        per_query = g.outcomes.per_query() if g.outcomes is not None else {}
        in_domain = {"refused": [d is None or d > g.threshold for d in g.in_domain_best]}
        in_domain |= per_query.get("in_domain", {})
        if self.kept is not None:
            in_domain |= self.kept.per_query()
        ood = {"bluffs": [d is not None and d <= g.threshold for d in g.ood_best]}
        return in_domain, ood | per_query.get("ood", {})

    def language_groups(self) -> list[LanguageGroup]:
        """The language groups of the queries and out-of-domain questions (none without ``lang``)."""
        langs = [(q.lang, q.doc_lang) for q in self.questions for _ in PHRASINGS]
        return language_groups(langs, [o.lang for o in self.ood_questions])

    def by_language(self) -> list[LanguageFigures]:
        """Every figure per language group, by phrasing, with the run's intervals."""
        return [self._language_figures(group) for group in self.language_groups()]

    def _language_figures(self, group: LanguageGroup) -> LanguageFigures:
        """Recall, MRR, destroyed needles and the gate's outcomes over one group."""
        modes, (in_domain, ood) = self.modes(), self.gate_outcomes()
        phrasings = [q["phrasing"] for q in self.queries()]
        asked = sorted({i // len(PHRASINGS) for i in group.queries})
        ids = {self.questions[i].id for i in asked}
        return LanguageFigures(
            language=group.name,
            questions=len(asked),
            destroyed=Proportion(sum(1 for d in self.product.destroyed if d in ids), len(asked)),
            phrasings=[
                PhrasingFigures(
                    phrasing,
                    len(positions),
                    {m: r.subset(positions) for m, r in modes.items()},
                    _shares(in_domain, positions),
                )
                for phrasing, positions in group.by_phrasing(phrasings)
            ],
            ood_questions=len(group.ood or ()),
            ood=_shares(ood, group.ood) if group.ood is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form of every number.

        The kept passages' proportions join the gate's current row, with their
        per-query outcomes, so that two runs compare query by query; the
        ``final`` mode is the order passages reach the asker in (hybrid,
        ordered by ``core.retrieve.answer_order``, reranked with a reranker).
        """
        gate = self.gate.to_dict()
        product = self.product.to_dict()
        if self.kept is not None:
            gate["current"].update(self.kept.current())
            per_query = gate.setdefault("per_query", {}).setdefault("in_domain", {})
            per_query.update(self.kept.per_query())
            product["modes"][FINAL_MODE] = self.modes()[FINAL_MODE].to_dict()
        return {
            "corpus": self.corpus,
            "embedding_model": self.embedding_model,
            "query_map": self.query_map,
            "chunk_budget": self.chunk_budget,
            "questions": len(self.questions),
            "queries": self.n_queries,
            "ood_questions": len(self.ood_questions),
            "recall_ks": list(RECALL_KS),
            "depth": DEPTH,
            "product": product,
            "mode_tests": [t.to_dict() for t in self.mode_tests],
            "gate": gate,
            "kept": self.kept.to_dict() if self.kept is not None else None,
            "strategies": {n: s.to_dict() for n, s in self.strategies.items()},
            "strategy_tests": [t.to_dict() for t in self.strategy_tests],
            "query_order": self.queries(),
            "by_language": {f.language: f.to_dict() for f in self.by_language()},
            "seconds": round(self.seconds, 2),
        }
