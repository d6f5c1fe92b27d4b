"""Two evaluation results of the same set, paired query by query (``kb eval --baseline``).

A result is what ``kb eval --json`` prints, or the ``EvalResult`` behind it: a
saved run of an earlier build, of another embedding model or reranker, or of
this build. Both answered the same queries, so every difference is tested on
the queries where they disagree (the exact sign test), not by overlapping
intervals.

Retrieval: per mode, Recall@1/4/8/20 with Wilson intervals and MRR with its
bootstrap interval, for both results; the sign test counts the queries only
one of them found within k (for MRR: the queries where one ranks the needle
higher).

The gate, at each result's own threshold: every proportion of the run's
``gate.current`` row that both results report (bluffs, in-domain refused,
answerable, and whatever a later build adds). Where both results carry the
per-query outcome, the proportion is paired and tested. A result may carry
them as ``gate.per_query = {"in_domain": {name: [bool, ...]}, "ood": {name:
[bool, ...]}}`` (in ``query_order`` and ``gate.ood`` order); without it,
``refused`` and ``bluffs`` are derived from the best candidate distances
(nothing within the threshold: refused; something within: a bluff), and used
only if they reproduce the run's own counts, which they do for a gate that
keeps the candidates within a cosine-distance threshold.

By language: when either result's queries carry ``lang`` (``query_order``,
``gate.ood``), hybrid retrieval is paired once more per language group of
``evaluation.languages`` and phrasing, and every paired gate outcome per
language group (and phrasing, for in-domain outcomes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evaluation.inputs import PHRASINGS, EvalSetError, OODQuestion, Question
from evaluation.languages import ALL_PHRASINGS, LanguageGroup, language_groups, pick
from evaluation.results import RECALL_KS, EvalResult, MeanCI, bootstrap_mean
from evaluation.stats import Proportion, paired_counts, sign_test

__all__ = [
    "ComparisonError",
    "Comparison",
    "GateRow",
    "MetricRow",
    "Side",
    "check_same_queries",
    "compare",
    "load_result",
    "render_comparison",
]

# "final": the order passages reach the asker in (hybrid, reranked by KB_RERANKER),
# in results that carry it.
MODES = ("dense", "bm25", "hybrid", "final")
PHRASING_MODE = "hybrid"
"""The mode broken down by phrasing (doc / ticket) as well."""
IN_DOMAIN = "in_domain"
OOD = "ood"


class ComparisonError(EvalSetError):
    """Two results that cannot be compared query by query."""


@dataclass(frozen=True)
class Side:
    """One result as the comparison reads it.

    Attributes:
        label: what to call it in the table (``baseline``, a model name).
        corpus: the corpus it indexed.
        embedding_model: the model it embedded with.
        query_ids: ``question_id/phrasing`` of every in-domain query, in order.
        ood_ids: the out-of-domain question ids, in order.
        ranks: per mode, the rank of the needle per query (``None``: not in the top 20).
        threshold: the gate's threshold in that run.
        gate_counts: the proportions of the run's own row at that threshold.
        outcomes: per group (``in_domain``: in ``query_ids`` order, ``ood``: in
            ``ood_ids`` order) and proportion name, the per-query outcome, where known.
        langs: ``(lang, doc_lang)`` by query id, for the queries that have a ``lang``.
        ood_langs: ``lang`` by out-of-domain question id, for those that have one.
    """

    label: str
    corpus: str
    embedding_model: str
    query_ids: tuple[str, ...]
    ood_ids: tuple[str, ...]
    ranks: dict[str, list[int | None]]
    threshold: float | None = None
    gate_counts: dict[str, Proportion] = field(default_factory=dict)
    outcomes: dict[str, dict[str, list[bool]]] = field(default_factory=dict)
    langs: dict[str, tuple[str, str]] = field(default_factory=dict)
    ood_langs: dict[str, str] = field(default_factory=dict)

    def outcome(self, name: str) -> tuple[str, list[bool]] | None:
        """The group and per-query outcome of the proportion ``name``, if known."""
        for group, by_name in self.outcomes.items():
            if name in by_name:
                return group, by_name[name]
        return None

    @classmethod
    def of(cls, result: EvalResult | Mapping[str, Any], label: str) -> Side:
        """Read an ``EvalResult`` or its ``--json`` form.

        Raises:
            ComparisonError: the data is not a ``kb eval --json`` result.
        """
        data = result.to_dict() if isinstance(result, EvalResult) else result
        try:
            return _side(data, label)
        except (KeyError, TypeError, ValueError) as exc:
            raise ComparisonError(
                f"{label}: not a `kb eval --json` result (missing or malformed {exc})."
            ) from exc


def _side(data: Mapping[str, Any], label: str) -> Side:
    ids = tuple(f"{q['question_id']}/{q['phrasing']}" for q in data["query_order"])
    modes = data["product"]["modes"]
    ranks = {m: list(modes[m]["ranks"]) for m in MODES if m in modes}
    gate = data.get("gate") or {}
    ood_ids = tuple(str(o["id"]) for o in gate.get("ood", []))
    langs = {
        qid: (str(q["lang"]), str(q.get("doc_lang") or q["lang"]))
        for qid, q in zip(ids, data["query_order"], strict=True)
        if q.get("lang")
    }
    ood_langs = {str(o["id"]): str(o["lang"]) for o in gate.get("ood", []) if o.get("lang")}
    if not gate:
        side = Side(label, str(data["corpus"]), str(data["embedding_model"]), ids, ood_ids, ranks)
        return replace(side, langs=langs)
    threshold = float(gate["threshold"])
    counts = {
        name: Proportion(int(v["k"]), int(v["n"]))
        for name, v in gate["current"].items()
        if isinstance(v, Mapping) and "k" in v and "n" in v
    }
    outcomes = _outcomes(gate, threshold, counts)
    return Side(
        label,
        str(data["corpus"]),
        str(data["embedding_model"]),
        ids,
        ood_ids,
        ranks,
        threshold,
        counts,
        outcomes,
        langs,
        ood_langs,
    )


def _outcomes(
    gate: Mapping[str, Any], threshold: float, counts: Mapping[str, Proportion]
) -> dict[str, dict[str, list[bool]]]:
    """Per-query gate outcomes: as the run recorded them, else derived from distances."""
    recorded = gate.get("per_query") or {}
    out = {
        group: {name: [bool(x) for x in values] for name, values in recorded.get(group, {}).items()}
        for group in (IN_DOMAIN, OOD)
    }
    distances = gate.get("distances") or {}
    sources = {
        "refused": (IN_DOMAIN, distances.get("in_domain_best")),
        "bluffs": (OOD, distances.get("ood_best")),
    }
    for name, (group, best) in sources.items():
        if name in out[group] or best is None or name not in counts:
            continue
        passes = [d is not None and d <= threshold for d in best]
        derived = [not p for p in passes] if name == "refused" else passes
        # Only a derivation that reproduces the run's own count is the gate's decision.
        if sum(derived) == counts[name].successes and len(derived) == counts[name].n:
            out[group][name] = derived
    return out


def load_result(path: Path, label: str) -> Side:
    """A saved ``kb eval --json`` output.

    Raises:
        ComparisonError: the file cannot be read or is not such an output.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ComparisonError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ComparisonError(f"{path} is not JSON: save it with `kb eval --json`.") from exc
    if not isinstance(data, dict):
        raise ComparisonError(f"{path} is not a `kb eval --json` result.")
    return Side.of(data, label)


def check_same_queries(
    side: Side, questions: Sequence[Question], ood: Sequence[OODQuestion]
) -> None:
    """Fail early, before any indexing, when ``side`` was measured on other questions.

    Raises:
        ComparisonError: the question or out-of-domain ids differ.
    """
    ids = tuple(f"{q.id}/{p}" for q in questions for p in PHRASINGS)
    this = Side("this set", side.corpus, side.embedding_model, ids, tuple(o.id for o in ood), {})
    _alignment(side.query_ids, this.query_ids, "in-domain queries", side, this)
    if side.ood_ids:
        _alignment(side.ood_ids, this.ood_ids, "out-of-domain questions", side, this)


@dataclass(frozen=True)
class MetricRow:
    """One retrieval metric of one mode, both results, and the paired test.

    ``only_a`` / ``only_b``: queries where only the first (second) result has the
    hit (for MRR: ranks the needle higher); ``p`` is the exact sign test on them.
    """

    mode: str
    metric: str
    a: Proportion | MeanCI
    b: Proportion | MeanCI
    only_a: int
    only_b: int
    p: float
    language: str = ""
    phrasing: str = ""


@dataclass(frozen=True)
class GateRow:
    """One gate proportion at each result's threshold; tested when paired.

    ``language`` and ``phrasing`` name the subset of a row by language (empty:
    every query; ``phrasing`` is empty for out-of-domain outcomes).
    """

    name: str
    a: Proportion
    b: Proportion
    only_a: int | None = None
    only_b: int | None = None
    p: float | None = None
    language: str = ""
    phrasing: str = ""

    @property
    def paired(self) -> bool:
        """Whether both results gave the per-query outcome."""
        return self.p is not None


@dataclass(frozen=True)
class Comparison:
    """Result ``b`` against result ``a`` on the same queries."""

    a: Side
    b: Side
    retrieval: list[MetricRow]
    gate: list[GateRow]
    notes: list[str]
    by_phrasing: list[MetricRow] = field(default_factory=list)
    by_language: list[MetricRow] = field(default_factory=list)
    gate_by_language: list[GateRow] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""

        def row(r: MetricRow) -> dict[str, Any]:
            return {
                "mode": r.mode,
                "metric": r.metric,
                "a": r.a.to_dict(),
                "b": r.b.to_dict(),
                "only_a": r.only_a,
                "only_b": r.only_b,
                "p": r.p,
            } | _subset(r.language, r.phrasing)

        return {
            "a": {"label": self.a.label, "corpus": self.a.corpus, "model": self.a.embedding_model},
            "b": {"label": self.b.label, "corpus": self.b.corpus, "model": self.b.embedding_model},
            "queries": len(self.a.query_ids),
            "retrieval": [row(r) for r in self.retrieval],
            "by_phrasing": [row(r) for r in self.by_phrasing],
            "gate": {
                "threshold": {"a": self.a.threshold, "b": self.b.threshold},
                "rows": [_gate_dict(g) for g in self.gate],
            },
            "by_language": {
                "retrieval": [row(r) for r in self.by_language],
                "gate": [_gate_dict(g) for g in self.gate_by_language],
            },
            "notes": self.notes,
        }


def _subset(language: str, phrasing: str) -> dict[str, str]:
    """The ``language`` and ``phrasing`` keys of a row by language; none for the others."""
    return {"language": language, "phrasing": phrasing} if language else {}


def _gate_dict(g: GateRow) -> dict[str, Any]:
    """JSON-ready form of one gate row."""
    return {
        "name": g.name,
        "a": g.a.to_dict(),
        "b": g.b.to_dict(),
        "paired": g.paired,
        "only_a": g.only_a,
        "only_b": g.only_b,
        "p": g.p,
    } | _subset(g.language, g.phrasing)


def compare(
    a: EvalResult | Mapping[str, Any] | Side,
    b: EvalResult | Mapping[str, Any] | Side,
    labels: tuple[str, str] = ("a", "b"),
) -> Comparison:
    """Pair two results of the same evaluation set and test every difference.

    Args:
        a: the reference (a baseline, model A), as an ``EvalResult``, its
            ``--json`` form or a ``Side``.
        b: the result compared with it.
        labels: names for ``a`` and ``b`` when they are not ``Side``s yet.

    Returns:
        Per mode and metric the two values and the sign test; the gate's
        proportions at each result's threshold; notes on what differs.

    Raises:
        ComparisonError: the two results did not answer the same queries.
    """
    sa = a if isinstance(a, Side) else Side.of(a, labels[0])
    sb = b if isinstance(b, Side) else Side.of(b, labels[1])
    order = _alignment(sa.query_ids, sb.query_ids, "in-domain queries", sa, sb)
    ood_order = _alignment(sa.ood_ids, sb.ood_ids, "out-of-domain questions", sa, sb)
    retrieval = [
        row
        for mode in MODES
        if mode in sa.ranks and mode in sb.ranks
        for row in _mode_rows(mode, sa.ranks[mode], [sb.ranks[mode][i] for i in order])
    ]
    gate = _gate_rows(sa, sb, order, ood_order)
    groups = _language_groups(sa, sb)
    return Comparison(
        sa,
        sb,
        retrieval,
        gate,
        _notes(sa, sb),
        _phrasing_rows(sa, sb, order),
        _language_rows(sa, sb, order, groups),
        _gate_language_rows(sa, sb, (order, ood_order), groups),
    )


def _language_groups(sa: Side, sb: Side) -> list[LanguageGroup]:
    """The language groups over ``a``'s order, each query's labels from either side (``a``'s first).

    A baseline saved before the sets had languages has none, so the other side's count.
    """
    langs, ood_langs = sb.langs | sa.langs, sb.ood_langs | sa.ood_langs
    return language_groups(
        [langs.get(qid, ("", "")) for qid in sa.query_ids],
        [ood_langs.get(oid, "") for oid in sa.ood_ids],
    )


def _phrasings(side: Side) -> list[str]:
    """Each query's phrasing, from its ``question_id/phrasing`` id."""
    return [qid.rpartition("/")[2] for qid in side.query_ids]


def _language_rows(
    sa: Side, sb: Side, order: list[int], groups: Sequence[LanguageGroup]
) -> list[MetricRow]:
    """Hybrid retrieval per language group and phrasing, paired."""
    if not groups or PHRASING_MODE not in sa.ranks or PHRASING_MODE not in sb.ranks:
        return []
    ra, rb = sa.ranks[PHRASING_MODE], pick(sb.ranks[PHRASING_MODE], order)
    return [
        replace(row, language=group.name, phrasing=phrasing)
        for group in groups
        for phrasing, idx in group.by_phrasing(_phrasings(sa))
        for row in _mode_rows(
            f"{PHRASING_MODE}, {group.name}, {phrasing}", pick(ra, idx), pick(rb, idx)
        )
    ]


def _gate_language_rows(
    sa: Side, sb: Side, orders: tuple[list[int], list[int]], groups: Sequence[LanguageGroup]
) -> list[GateRow]:
    """Every gate outcome both sides give per query, per language group (and phrasing), paired."""
    rows = []
    for group in groups:
        for name in [n for n in sa.gate_counts if n in sb.gate_counts]:
            oa, ob = sa.outcome(name), sb.outcome(name)
            if oa is None or ob is None or oa[0] != ob[0]:
                continue
            va, vb = oa[1], pick(ob[1], orders[0] if oa[0] == IN_DOMAIN else orders[1])
            subsets = (
                group.by_phrasing(_phrasings(sa))
                if oa[0] == IN_DOMAIN
                else [("", group.ood)]
                if group.ood
                else []
            )
            rows += [
                _paired_row(name, pick(va, idx), pick(vb, idx), group.name, phrasing)
                for phrasing, idx in subsets
            ]
    return rows


def _paired_row(name: str, a: list[bool], b: list[bool], language: str, phrasing: str) -> GateRow:
    """A gate outcome over one subset of queries, both proportions and the sign test."""
    only_a, only_b = paired_counts(a, b)
    return GateRow(
        name,
        Proportion(sum(a), len(a)),
        Proportion(sum(b), len(b)),
        only_a,
        only_b,
        sign_test(only_a, only_b),
        language,
        phrasing,
    )


def _phrasing_rows(sa: Side, sb: Side, order: list[int]) -> list[MetricRow]:
    """Hybrid retrieval per phrasing: the ticket-phrased queries are where it differs."""
    if PHRASING_MODE not in sa.ranks or PHRASING_MODE not in sb.ranks:
        return []
    ra, rb = sa.ranks[PHRASING_MODE], [sb.ranks[PHRASING_MODE][i] for i in order]
    rows = []
    for phrasing in PHRASINGS:
        idx = [i for i, qid in enumerate(sa.query_ids) if qid.endswith(f"/{phrasing}")]
        if idx:
            label = f"{PHRASING_MODE}, {phrasing}"
            rows += _mode_rows(label, [ra[i] for i in idx], [rb[i] for i in idx])
    return rows


def _alignment(
    ids_a: Sequence[str], ids_b: Sequence[str], what: str, sa: Side, sb: Side
) -> list[int]:
    """For each of ``a``'s ids, its position in ``b``."""
    if sorted(ids_a) != sorted(ids_b):
        missing = sorted(set(ids_a) ^ set(ids_b))[:3]
        raise ComparisonError(
            f"{sa.label} and {sb.label} were not run on the same {what} "
            f"({len(ids_a)} and {len(ids_b)}; e.g. {', '.join(missing) or 'repeated ids'}); "
            "compare results of the same evaluation set."
        )
    where = {qid: i for i, qid in enumerate(ids_b)}
    return [where[qid] for qid in ids_a]


def _mode_rows(mode: str, ra: list[int | None], rb: list[int | None]) -> list[MetricRow]:
    rows = []
    for k in RECALL_KS:
        ha = [r is not None and r <= k for r in ra]
        hb = [r is not None and r <= k for r in rb]
        only_a, only_b = paired_counts(ha, hb)
        rows.append(
            MetricRow(
                mode,
                f"R@{k}",
                Proportion(sum(ha), len(ha)),
                Proportion(sum(hb), len(hb)),
                only_a,
                only_b,
                sign_test(only_a, only_b),
            )
        )
    rr_a = [1.0 / r if r else 0.0 for r in ra]
    rr_b = [1.0 / r if r else 0.0 for r in rb]
    only_a = sum(1 for x, y in zip(rr_a, rr_b, strict=True) if x > y)
    only_b = sum(1 for x, y in zip(rr_a, rr_b, strict=True) if y > x)
    rows.append(
        MetricRow(
            mode,
            "MRR",
            bootstrap_mean(rr_a),
            bootstrap_mean(rr_b),
            only_a,
            only_b,
            sign_test(only_a, only_b),
        )
    )
    return rows


def _gate_rows(sa: Side, sb: Side, order: list[int], ood_order: list[int]) -> list[GateRow]:
    rows = []
    for name in [n for n in sa.gate_counts if n in sb.gate_counts]:
        row = GateRow(name, sa.gate_counts[name], sb.gate_counts[name])
        oa, ob = sa.outcome(name), sb.outcome(name)
        if oa is not None and ob is not None and oa[0] == ob[0]:
            positions = order if oa[0] == IN_DOMAIN else ood_order
            only_a, only_b = paired_counts(oa[1], [ob[1][i] for i in positions])
            row = GateRow(name, row.a, row.b, only_a, only_b, sign_test(only_a, only_b))
        rows.append(row)
    return rows


def _notes(sa: Side, sb: Side) -> list[str]:
    notes = []
    # The same set run from another checkout or working directory is the same corpus.
    if Path(sa.corpus).parts[-2:] != Path(sb.corpus).parts[-2:]:
        notes.append(f"corpus: {sa.label} indexed {sa.corpus}, {sb.label} indexed {sb.corpus}")
    if sa.embedding_model != sb.embedding_model:
        notes.append(f"embedding model: {sa.embedding_model} vs {sb.embedding_model}")
    if sa.threshold != sb.threshold:
        notes.append(
            f"gate thresholds differ ({sa.threshold} vs {sb.threshold}): "
            "each side's gate row is at its own threshold"
        )
    shared = [n for n in sa.gate_counts if n in sb.gate_counts]
    unpaired = [n for n in shared if sa.outcome(n) is None or sb.outcome(n) is None]
    if unpaired:
        notes.append(f"not paired (no per-query outcome on both sides): {', '.join(unpaired)}")
    return notes


def _fmt_value(v: Proportion | MeanCI) -> str:
    if isinstance(v, Proportion):
        low, high = v.interval
        return f"{v.value:.3f} [{low:.2f}, {high:.2f}]"
    return f"{v.mean:.3f} [{v.low:.2f}, {v.high:.2f}]"


def _fmt_count(v: Proportion) -> str:
    low, high = v.interval
    return f"{v.successes}/{v.n} [{low:.2f}, {high:.2f}]"


def _fmt_p(p: float) -> str:
    return f"{p:.3f}" if p >= 0.001 else "<0.001"


def render_comparison(comparison: Comparison, *, markdown: bool = False) -> str:
    """The comparison as text tables (or Markdown): retrieval per mode, then the gate.

    ``+b/-a`` counts the queries only ``b`` (only ``a``) got right; ``p`` is the
    exact two-sided sign test on those.
    """
    a, b = comparison.a.label, comparison.b.label
    head = [
        f"{b} against {a}: {len(comparison.a.query_ids)} in-domain queries, "
        f"{len(comparison.a.ood_ids)} out-of-domain questions (paired by id)",
        "",
    ]
    retrieval = [_metric_cells(r) for r in comparison.retrieval]
    by_phrasing = [_metric_cells(r) for r in comparison.by_phrasing]
    gate = [
        [
            g.name,
            _fmt_count(g.a),
            _fmt_count(g.b),
            f"+{g.only_b}/-{g.only_a}" if g.paired else "unpaired",
            _fmt_p(g.p) if g.p is not None else "",
        ]
        for g in comparison.gate
    ]
    header = ["mode", "metric", a, b, f"{b} vs {a}", "p"]
    lines = head + _table(header, retrieval, markdown)
    if by_phrasing:
        lines += ["", f"{PHRASING_MODE.capitalize()} by phrasing", ""]
        lines += _table(header, by_phrasing, markdown)
    if gate:
        ta, tb = comparison.a.threshold, comparison.b.threshold
        lines += ["", f"Gate at each side's threshold ({a}: {ta}, {b}: {tb})", ""]
        lines += _table(["outcome", a, b, f"{b} vs {a}", "p"], gate, markdown)
    lines += _render_by_language(comparison, header, markdown)
    lines += [f"note: {n}" for n in comparison.notes]
    return "\n".join(lines) + "\n"


def _render_by_language(comparison: Comparison, header: list[str], markdown: bool) -> list[str]:
    """Hybrid retrieval per language and phrasing, then the paired gate per language."""
    a, b = comparison.a.label, comparison.b.label
    lines: list[str] = []
    if comparison.by_language:
        lines += ["", f"{PHRASING_MODE.capitalize()} by language and phrasing", ""]
        lines += _table(header, [_metric_cells(r) for r in comparison.by_language], markdown)
    gate = [
        [
            g.language,
            g.name,
            _fmt_count(g.a),
            _fmt_count(g.b),
            f"+{g.only_b}/-{g.only_a}",
            _fmt_p(g.p) if g.p is not None else "",
        ]
        for g in comparison.gate_by_language
        if g.phrasing in ("", ALL_PHRASINGS)  # by phrasing too in --json
    ]
    if gate:
        lines += ["", "Gate by language (both phrasings; paired outcomes only)", ""]
        lines += _table(["language", "outcome", a, b, f"{b} vs {a}", "p"], gate, markdown)
    return lines


def _metric_cells(r: MetricRow) -> list[str]:
    return [
        r.mode,
        r.metric,
        _fmt_value(r.a),
        _fmt_value(r.b),
        f"+{r.only_b}/-{r.only_a}",
        _fmt_p(r.p),
    ]


def _table(header: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return out + ["| " + " | ".join(r) + " |" for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]
