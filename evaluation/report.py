"""Rendering ``kb eval`` and ``kb calibrate`` results: text tables, Markdown, a PNG.

Nothing here measures anything; every number comes from ``EvalResult`` or
``Calibration``, so the text, the Markdown and ``--json`` always agree.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

from core.retrieve import Mode
from evaluation.calibrate import Calibration
from evaluation.outcomes import DEFAULT_MAX_HARD_REFUSED, DEFAULT_MAX_OOD_SHOWN
from evaluation.results import (
    RECALL_KS,
    TEST_KS,
    EvalResult,
    LanguageFigures,
    MeanCI,
    ModeResult,
    PairedTest,
    StrategyResult,
    SweepRow,
)
from evaluation.stats import Proportion


def fmt_p(p: Proportion) -> str:
    """``0.781 [0.66, 0.87]``: value and 95 % Wilson interval."""
    low, high = p.interval
    return f"{p.value:.3f} [{low:.2f}, {high:.2f}]"


def fmt_count(p: Proportion) -> str:
    """``3/30 (0.100)``."""
    return f"{p.successes}/{p.n} ({p.value:.3f})"


def fmt_mean(m: MeanCI) -> str:
    """``0.512 [0.43, 0.60]``: mean and bootstrap interval."""
    return f"{m.mean:.3f} [{m.low:.2f}, {m.high:.2f}]"


def fmt_test(t: PairedTest) -> str:
    """``+10/-3 p=0.092``."""
    return f"+{t.wins}/-{t.losses} p={t.p:.3g}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool) -> list[str]:
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        return out + ["| " + " | ".join(r) + " |" for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    return [line.format(*header).rstrip()] + [line.format(*r).rstrip() for r in rows]


def _recall_cells(r: ModeResult) -> list[str]:
    """R@k for every reported k, then MRR, each with its interval."""
    return [*[fmt_p(r.recall(k)) for k in RECALL_KS], fmt_mean(r.mrr)]


def _recall_rows(s: StrategyResult, modes: Sequence[str]) -> list[list[str]]:
    return [[mode, *_recall_cells(s.modes[mode])] for mode in modes]


def _recall_header(first: str) -> list[str]:
    return [first, *[f"R@{k}" for k in RECALL_KS], "MRR"]


def _distance_summary(values: Sequence[float | None]) -> str:
    vals = sorted(v for v in values if v is not None)
    if not vals:
        return "-"
    return f"min {vals[0]:.3f}  median {statistics.median(vals):.3f}  max {vals[-1]:.3f}  (n={len(vals)})"


def _sweep_rows(rows: Sequence[SweepRow], marks: dict[float, str]) -> list[list[str]]:
    out = []
    for r in rows:
        mark = marks.get(round(r.threshold, 4), "")
        out.append(
            [
                f"{r.threshold:.3f}{mark}",
                fmt_count(r.bluffs),
                fmt_count(r.refused),
                fmt_count(r.answerable) if r.answerable else "-",
                str(r.lost) if r.lost is not None else "-",
            ]
        )
    return out


SWEEP_HEADER = ["threshold", "bluffs (OOD kept)", "in-domain refused", "answerable", "lost"]


def _tests_table(varied: str, tests: Sequence[PairedTest], *, markdown: bool) -> list[str]:
    """Paired sign tests, one row per pair: ``varied`` names the column the pairs share."""
    header = ["pair", varied, *[f"R@{k}" for k in TEST_KS]]
    return _table(header, _tests_rows(tests), markdown=markdown)


def _tests_rows(tests: Sequence[PairedTest]) -> list[list[str]]:
    by_pair: dict[tuple[str, str, str], dict[int, PairedTest]] = {}
    for t in tests:
        by_pair.setdefault((t.first, t.second, t.mode), {})[t.k] = t
    return [
        [f"{a} vs {b}", mode, *[fmt_test(ks[k]) if k in ks else "-" for k in TEST_KS]]
        for (a, b, mode), ks in by_pair.items()
    ]


def _query_map(status: dict[str, object] | str) -> str:
    if isinstance(status, str):
        return status
    return f"fitted on {status['sentences']} sentences of {status['chunks']} chunks"


def render(result: EvalResult, *, markdown: bool = False, recommended: float | None = None) -> str:
    """The whole evaluation as text tables (or Markdown when ``markdown``)."""
    h = (lambda s: f"### {s}") if markdown else (lambda s: f"== {s}")
    p = result.product
    lines = [
        h("Evaluation set"),
        "",
        f"- corpus {result.corpus}: {p.documents} documents, {p.chunks} chunks "
        f"(product chunker, budget {result.chunk_budget} characters)",
        f"- {len(result.questions)} questions x 2 phrasings = {result.n_queries} queries; "
        f"{len(result.ood_questions)} out-of-domain questions",
        f"- embedding model {result.embedding_model}, window {p.window} word-pieces; "
        f"indexing {p.index_seconds:.1f} s, one search (3 modes) {p.query_ms:.1f} ms",
        f"- query map (`KB_QUERY_ADAPTER`): {_query_map(result.query_map)}",
        "",
    ]
    if p.failed_documents:
        lines += ["documents that failed to index: " + "; ".join(p.failed_documents), ""]
    lines += [
        h(f"Retrieval (n = {result.n_queries} queries)"),
        "",
        *_table(
            _recall_header("mode"), _recall_rows(p, [m.value for m in Mode]), markdown=markdown
        ),
        "",
        "Recall: 95 % Wilson intervals. MRR over the top 20: 95 % percentile bootstrap.",
        "",
        h("Paired sign tests between modes (exact, two-sided, discordant pairs)"),
        "",
        *_tests_table("chunker", result.mode_tests, markdown=markdown),
        "",
        h("Destroyed answers and the encoder window"),
        "",
        f"destroyed (needle in the corpus, in no chunk): {fmt_count(p.destroyed_share())}"
        + (f" {', '.join(p.destroyed)}" if p.destroyed else ""),
        f"needles missing from the corpus text: {len(p.missing)}"
        + (f" ({', '.join(p.missing)})" if p.missing else ""),
        f"chunks split to fit the window: {p.window_splits}; "
        f"chunks still over the window: {p.over_window}",
        "",
    ]
    lines += _render_gate(result, markdown=markdown, recommended=recommended)
    lines += _render_languages(result.by_language(), result, markdown=markdown)
    if result.strategies:
        lines += _render_strategies(result, markdown=markdown)
    return "\n".join(lines).rstrip() + "\n"


def _render_gate(result: EvalResult, *, markdown: bool, recommended: float | None) -> list[str]:
    g = result.gate
    h = (lambda s: f"### {s}") if markdown else (lambda s: f"== {s}")
    marks = {round(g.threshold, 4): " (current)"}
    if recommended is not None:
        marks[round(recommended, 4)] = marks.get(round(recommended, 4), "") + " (recommended)"
    cur = g.current
    lines = [
        h(f"Out-of-domain sweep (hybrid, gate keeps <= {g.top_k} of {g.candidates} candidates)"),
        "",
        f"at the current threshold {g.threshold:.3f}: bluffs {fmt_p(cur.bluffs)}, "
        f"in-domain refused {fmt_p(cur.refused)}"
        + (f", answerable {fmt_p(cur.answerable)}" if cur.answerable else ""),
        "",
        *_table(SWEEP_HEADER, _sweep_rows(g.sweep, marks), markdown=markdown),
        "",
        "Distances (cosine, 1 - ip):",
        "",
        f"- in-domain, closest chunk holding the needle: {_distance_summary(g.in_domain_correct)}",
        f"- in-domain, best candidate: {_distance_summary(g.in_domain_best)}",
        f"- out-of-domain, best candidate: {_distance_summary(g.ood_best)}",
        "",
        *_table(
            ["threshold", *_breakdown_header(result)],
            [_breakdown_row(result, t) for t in sorted(marks)],
            markdown=markdown,
        ),
        "",
    ]
    bluffing = [
        o for o in g.ood if o["best_distance"] is not None and o["best_distance"] <= g.threshold
    ]
    if bluffing:
        lines += [f"Out-of-domain questions that pass the gate at {g.threshold:.3f}:", ""]
        lines += [
            f"- d={o['best_distance']:.3f} [{o['kind'] or '-'}] {o['question']!r} -> {o['closest']}"
            for o in sorted(bluffing, key=lambda o: o["best_distance"])
        ]
        lines.append("")
    return lines + _render_outcomes(result, markdown=markdown)


def fmt_share(p: Proportion) -> str:
    """``3/30 0.100 [0.03, 0.26]``: count, value and 95 % Wilson interval."""
    return f"{p.successes}/{p.n} {fmt_p(p)}"


def _share(values: Sequence[bool]) -> str:
    return fmt_share(Proportion(sum(values), len(values)))


LANGUAGE_MODE = Mode.HYBRID.value
"""The retrieval mode the text report breaks down by language (``--json`` has every mode)."""
LANGUAGE_GATE = {
    "answered": "answered",
    "refused": "refused",
    "hard_refused": "hard refused",
    "shown": "needle shown",
    "kept_answerable": "needle kept",
}
"""The in-domain gate outcomes the text report breaks down by language, and their headers."""
LANGUAGE_OOD = {"bluffs": "bluffs (answered)", "ood_related": "related shown"}


def _render_languages(
    figures: Sequence[LanguageFigures], result: EvalResult, *, markdown: bool
) -> list[str]:
    """Retrieval and the gate per language and phrasing, then bluffs per language (if any)."""
    if not figures:
        return []
    h = (lambda s: f"### {s}") if markdown else (lambda s: f"== {s}")
    subsets = [(f.language, p) for f in figures for p in f.phrasings]
    gate = [n for n in LANGUAGE_GATE if any(n in p.gate for _, p in subsets)]
    ood = [f for f in figures if f.ood]
    lines = [
        h(f"By language ({LANGUAGE_MODE}; gate at the threshold {result.gate.threshold:.3f})"),
        "",
        *_table(
            ["language", "phrasing", "queries", *_recall_header("")[1:]],
            [
                [lang, p.phrasing, str(p.queries), *_recall_cells(p.modes[LANGUAGE_MODE])]
                for lang, p in subsets
            ],
            markdown=markdown,
        ),
        "",
        *_table(
            ["language", "phrasing", *[LANGUAGE_GATE[n] for n in gate]],
            [
                [lang, p.phrasing, *[fmt_share(p.gate[n]) if n in p.gate else "-" for n in gate]]
                for lang, p in subsets
            ],
            markdown=markdown,
        ),
        "",
    ]
    if ood:
        lines += _table(
            ["out-of-domain", "questions", *LANGUAGE_OOD.values()],
            [
                [f.language, str(f.ood_questions), *[fmt_share(f.ood[n]) for n in LANGUAGE_OOD]]
                for f in ood
                if f.ood
            ],
            markdown=markdown,
        ) + [""]
    return lines + [
        "Language: the phrasings' (`lang`); cross-lingual: questions whose needle's document "
        "is in another language (`doc_lang`), also counted in their own language. Recall: "
        "95 % Wilson intervals; MRR: 95 % percentile bootstrap.",
        "",
    ]


def _render_outcomes(result: EvalResult, *, markdown: bool) -> list[str]:
    """What the asker gets at the two thresholds, by phrasing, and the related sweep."""
    o = result.gate.outcomes
    if o is None:
        return []
    h = (lambda s: f"### {s}") if markdown else (lambda s: f"== {s}")
    phrasing = [q["phrasing"] for q in result.queries()]
    groups = [("all", [True] * len(phrasing))] + [
        (name, [p == name for p in phrasing]) for name in sorted(set(phrasing))
    ]

    def row(label: str, mask: list[bool]) -> list[str]:
        def pick(values: list[bool]) -> list[bool]:
            return [v for v, m in zip(values, mask, strict=True) if m]

        return [
            label,
            _share(pick(o.answered)),
            _share(pick(o.related)),
            _share(pick(o.hard_refused)),
            _share(pick(o.shown)),
            _share(pick(o.shown_beside)),
            _share(pick(o.rescued)),
        ]

    header = [
        "in-domain",
        "answered",
        "related",
        "hard refused",
        "needle shown",
        "beside an answer",
        "rescued",
    ]
    mean = statistics.fmean
    kept = (
        f"kept passages: needle kept {_share(o.kept_needle)} "
        f"(a fixed top {result.gate.top_k}: {_share(o.fixed_needle)}); per answer, passages "
        f"given to the model {mean(o.kept_passages or [0]):.2f} on average (fixed: "
        f"{mean(o.fixed_passages or [0]):.2f}), {mean(o.kept_chars or [0]):.0f} characters "
        f"(fixed: {mean(o.fixed_chars or [0]):.0f}); passages shown beside an answer "
        f"{mean(o.beside_passages or [0]):.2f} on average, beside "
        f"{sum(1 for n in o.beside_passages if n)} of {len(o.beside_passages)} answers"
    )
    sweep_rows = [
        [
            f"{r.related_threshold:.3f}",
            fmt_count(r.related),
            fmt_count(r.hard_refused),
            fmt_count(r.rescued) if r.rescued else "-",
            fmt_count(r.shown) if r.shown else "-",
            fmt_count(r.ood_related),
            fmt_count(r.ood_shown),
        ]
        for r in result.gate.related_sweep
    ]
    return [
        h(
            f"What the asker gets (answer threshold {o.threshold:.3f}, "
            f"related threshold {o.related_threshold:.3f})"
        ),
        "",
        *_table(header, [row(label, mask) for label, mask in groups], markdown=markdown),
        "",
        f"out-of-domain: bluffs (answered) {_share(o.bluffs)}, "
        f"related passages shown {_share(o.ood_related)}",
        kept,
        "",
        "Needle shown: among the kept passages of an answer, the passages beside it or the "
        "related passages. Beside an answer: answers whose needle only the passages shown "
        "beside them (ranked among the answer's best, too far to pass alone, left out by the "
        "reranker) showed. "
        "Rescued: related outcomes that showed the needle.",
        "",
        h(f"Related threshold sweep (answer threshold {o.threshold:.3f})"),
        "",
        *_table(
            [
                "related threshold",
                "in-domain related",
                "hard refused",
                "rescued",
                "needle shown",
                "OOD related",
                "OOD shown anything",
            ],
            sweep_rows,
            markdown=markdown,
        ),
        "",
    ]


def _breakdown_header(result: EvalResult) -> list[str]:
    kinds = sorted({o["kind"] or "-" for o in result.gate.ood})
    return [f"bluffs {k}" for k in kinds] + ["refused doc phrasing", "refused ticket phrasing"]


def _breakdown_row(result: EvalResult, threshold: float) -> list[str]:
    # Nothing passes the gate exactly when the best candidate is over the
    # threshold, so the best distances give both breakdowns.
    g = result.gate
    kinds = sorted({o["kind"] or "-" for o in g.ood})
    cells = [f"{threshold:.3f}"]
    for kind in kinds:
        group = [o for o in g.ood if (o["kind"] or "-") == kind]
        passed = sum(
            1 for o in group if o["best_distance"] is not None and o["best_distance"] <= threshold
        )
        cells.append(f"{passed}/{len(group)}")
    phrasings = [q["phrasing"] for q in result.queries()]
    for phrasing in ("doc", "ticket"):
        best = [d for d, ph in zip(g.in_domain_best, phrasings, strict=True) if ph == phrasing]
        refused = sum(1 for d in best if d is None or d > threshold)
        cells.append(f"{refused}/{len(best)}")
    return cells


def _render_strategies(result: EvalResult, *, markdown: bool) -> list[str]:
    h = (lambda s: f"### {s}") if markdown else (lambda s: f"== {s}")
    names = sorted(result.strategies)
    facts = [
        [
            n,
            result.strategies[n].label,
            str(result.strategies[n].chunks),
            fmt_count(result.strategies[n].destroyed_share()),
            str(result.strategies[n].over_window),
            str(result.strategies[n].embedded_tokens),
        ]
        for n in names
    ]
    lines = [
        h("Chunking strategies"),
        "",
        *_table(
            ["strategy", "", "chunks", "destroyed", "over window", "embedded tokens"],
            facts,
            markdown=markdown,
        ),
        "",
    ]
    for mode in (Mode.HYBRID.value, Mode.DENSE.value):
        rows = [
            [n, *_recall_rows(result.strategies[n], [mode])[0][1:]]
            for n in names
            if mode in result.strategies[n].modes
        ]
        lines += [
            h(f"Strategies, {mode}"),
            "",
            *_table(_recall_header("strategy"), rows, markdown=markdown),
            "",
        ]
    lines += [
        h("Paired sign tests between strategies (wins/losses of the first, exact two-sided p)"),
        "",
        *_tests_table("mode", result.strategy_tests, markdown=markdown),
        "",
    ]
    return lines


def render_calibration(cal: Calibration) -> str:
    """What the proposed threshold costs, beside the current one."""
    lines = [
        f"bluff budget: at most {cal.max_bluff_rate:.0%} of out-of-domain questions answered "
        f"(source: {cal.source})",
        "",
    ]
    if cal.proposed is None:
        lines.append(
            "No threshold in the sweep meets this budget; raise the budget or add documents."
        )
    else:
        lines.append(f"proposed threshold: {cal.proposed.threshold:.3f}")
    if cal.related is not None:
        r = cal.related
        lines.append(
            f"proposed related threshold: {r.related_threshold:.3f} (smallest with in-domain "
            f"hard refusals <= {DEFAULT_MAX_HARD_REFUSED:.0%}, out-of-domain questions shown "
            f"anything <= {DEFAULT_MAX_OOD_SHOWN:.0%}): related "
            f"{fmt_count(r.related)}, hard refused {fmt_count(r.hard_refused)}"
            + (f", rescued {fmt_count(r.rescued)}" if r.rescued else "")
            + f", out-of-domain shown passages {fmt_count(r.ood_related)}"
        )
    lines.append("")
    rows = [("current", cal.current)] + ([("proposed", cal.proposed)] if cal.proposed else [])
    lines += _table(
        ["", "threshold", "bluffs", "in-domain refused", "answerable kept", "lost"],
        [
            [
                name,
                f"{r.threshold:.3f}",
                f"{r.bluffs.successes}/{r.bluffs.n} {fmt_p(r.bluffs)}",
                f"{r.refused.successes}/{r.refused.n} {fmt_p(r.refused)}",
                f"{r.answerable.successes}/{r.answerable.n} {fmt_p(r.answerable)}"
                if r.answerable
                else "-",
                str(r.lost) if r.lost is not None else "-",
            ]
            for name, r in rows
        ],
        markdown=False,
    )
    lines += ["", "Counts with 95 % Wilson intervals."]
    return "\n".join(lines) + "\n"


def plot(result: EvalResult, path: Path, *, recommended: float | None = None) -> None:
    """Two panels: distance histograms, and bluffs / lost answers against the threshold."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a server
    import matplotlib.pyplot as plt

    g = result.gate
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    inside = [d for d in g.in_domain_correct if d is not None]
    outside = [d for d in g.ood_best if d is not None]
    # Out-of-domain distances can reach 2 (opposite vectors): bin up to the largest seen.
    top = max([1.2, *inside, *outside])
    bins = [i / 40 for i in range(0, int(top * 40) + 2)]
    left.hist(inside, bins=bins, alpha=0.6, label="in-domain: closest chunk with the needle")
    left.hist(outside, bins=bins, alpha=0.6, label="out-of-domain: best candidate")
    left.set_xlabel("cosine distance")
    left.set_ylabel("queries")
    left.set_title("Distances the threshold separates")
    xs = [r.threshold for r in g.sweep]
    right.plot(xs, [r.bluffs.successes for r in g.sweep], marker="o", label="bluffs (OOD answered)")
    right.plot(xs, [r.lost or 0 for r in g.sweep], marker="s", label="lost answers")
    right.plot(
        xs, [r.refused.successes for r in g.sweep], linestyle="--", label="in-domain refused"
    )
    right.set_xlabel("threshold")
    right.set_ylabel("questions")
    right.set_title(
        f"Cost of the threshold ({len(outside)} OOD, {len(g.in_domain_best)} in-domain)"
    )
    for ax in (left, right):
        ax.axvline(g.threshold, color="black", linestyle=":", label=f"current {g.threshold:.3f}")
        if recommended is not None and abs(recommended - g.threshold) > 1e-9:
            ax.axvline(
                recommended, color="red", linestyle="-.", label=f"recommended {recommended:.3f}"
            )
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
