"""Two evaluation results paired query by query: small synthetic results, counted by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from evaluation.compare import (
    ComparisonError,
    Side,
    check_same_queries,
    compare,
    load_result,
    render_comparison,
)
from evaluation.inputs import OODQuestion, Question
from evaluation.stats import sign_test


def _result(
    ranks: list[int | None],
    *,
    best: list[float | None] | None = None,
    ood_best: list[float | None] | None = None,
    threshold: float = 0.5,
    ids: list[str] | None = None,
    model: str = "bundled:all-MiniLM-L6-v2",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``kb eval --json`` result with the same ranks in every mode (two phrasings per id)."""
    ids = ids or [f"q{i // 2}" for i in range(len(ranks))]
    best = best if best is not None else [0.4] * len(ranks)
    ood_best = ood_best if ood_best is not None else [0.7, 0.45, 0.8]
    refused = sum(1 for d in best if d is None or d > threshold)
    bluffs = sum(1 for d in ood_best if d is not None and d <= threshold)

    def prop(k: int, n: int) -> dict[str, Any]:
        return {"k": k, "n": n, "value": k / n, "ci95": [0.0, 1.0]}

    current = {
        "threshold": threshold,
        "bluffs": prop(bluffs, len(ood_best)),
        "refused": prop(refused, len(best)),
        "answerable": prop(len(best) - refused, len(best)),
        "lost": 0,
        **(extra or {}),
    }
    return {
        "corpus": "corpus",
        "embedding_model": model,
        "product": {"modes": {m: {"ranks": list(ranks)} for m in ("dense", "bm25", "hybrid")}},
        "query_order": [
            {"question_id": qid, "phrasing": ("doc", "ticket")[i % 2]} for i, qid in enumerate(ids)
        ],
        "gate": {
            "threshold": threshold,
            "current": current,
            "distances": {"in_domain_best": best, "ood_best": ood_best},
            "ood": [{"id": f"o{i}"} for i in range(len(ood_best))],
        },
    }


def _row(comparison: Any, mode: str, metric: str) -> Any:
    return next(r for r in comparison.retrieval if r.mode == mode and r.metric == metric)


def _gate(comparison: Any, name: str) -> Any:
    return next(g for g in comparison.gate if g.name == name)


def test_recall_rows_count_the_discordant_queries() -> None:
    a = _result([1, 3, None, 6, 2, None])
    b = _result([1, 1, 5, None, 9, None])
    c = compare(a, b, ("before", "after"))
    r1 = _row(c, "hybrid", "R@1")
    assert (r1.a.successes, r1.b.successes) == (1, 2)
    assert (r1.only_a, r1.only_b) == (0, 1)
    r4 = _row(c, "hybrid", "R@4")
    # Hits at 4: a = {0, 1, 4}, b = {0, 1}: only a has query 4.
    assert (r4.a.successes, r4.b.successes, r4.only_a, r4.only_b) == (3, 2, 1, 0)
    r8 = _row(c, "dense", "R@8")
    # a: {0,1,3,4}; b: {0,1,2}: only a has 3 and 4, only b has 2.
    assert (r8.only_a, r8.only_b) == (2, 1)
    assert r8.p == sign_test(2, 1)
    r20 = _row(c, "bm25", "R@20")
    assert (r20.a.successes, r20.b.successes) == (4, 4)
    assert [r.metric for r in c.retrieval[:5]] == ["R@1", "R@4", "R@8", "R@20", "MRR"]
    assert len(c.retrieval) == 15


def test_mrr_counts_queries_ranked_higher() -> None:
    c = compare(_result([2, 1, None, 4]), _result([1, 1, 3, 8]))
    mrr = _row(c, "hybrid", "MRR")
    assert (mrr.only_a, mrr.only_b) == (1, 2)
    assert mrr.a.mean == pytest.approx((0.5 + 1 + 0 + 0.25) / 4)
    assert mrr.b.mean == pytest.approx((1 + 1 + 1 / 3 + 1 / 8) / 4)
    assert mrr.a.low <= mrr.a.mean <= mrr.a.high


def test_identical_results_have_no_discordant_pair() -> None:
    data = _result([1, 2, None, 5])
    c = compare(data, data)
    assert all(r.only_a == r.only_b == 0 and r.p == 1.0 for r in c.retrieval)
    assert all(g.paired and g.p == 1.0 for g in c.gate if g.name in ("bluffs", "refused"))
    assert c.notes == ["not paired (no per-query outcome on both sides): answerable"]


def test_queries_are_paired_by_id_not_by_position() -> None:
    a = _result([1, None, None, 2], ids=["x", "x", "y", "y"])
    # The same outcomes, listed in another order.
    b = _result([None, 2, 1, None], ids=["y", "y", "x", "x"])
    b["query_order"] = [
        {"question_id": "y", "phrasing": "doc"},
        {"question_id": "y", "phrasing": "ticket"},
        {"question_id": "x", "phrasing": "doc"},
        {"question_id": "x", "phrasing": "ticket"},
    ]
    c = compare(a, b)
    assert all(r.only_a == r.only_b == 0 for r in c.retrieval)


def test_gate_outcomes_are_derived_from_distances_and_paired() -> None:
    a = _result([1, 1, 1, 1], best=[0.3, 0.6, 0.4, 0.55], ood_best=[0.45, 0.7, 0.49])
    b = _result([1, 1, 1, 1], best=[0.3, 0.4, 0.52, 0.45], ood_best=[0.7, 0.7, 0.3], threshold=0.5)
    c = compare(a, b)
    refused = _gate(c, "refused")
    # a refuses queries 1 and 3; b refuses query 2.
    assert (refused.a.successes, refused.b.successes) == (2, 1)
    assert (refused.only_a, refused.only_b) == (2, 1)
    bluffs = _gate(c, "bluffs")
    # a bluffs on o0 and o2, b on o2 only.
    assert (bluffs.only_a, bluffs.only_b, bluffs.p) == (1, 0, 1.0)
    answerable = _gate(c, "answerable")
    assert not answerable.paired and answerable.only_a is None
    assert "lost" not in {g.name for g in c.gate}


def test_a_derivation_that_misses_the_runs_count_is_not_used() -> None:
    # A gate that decides on something else than the best distance: the count
    # it reports cannot be reproduced, so nothing is paired on it.
    a = _result([1, 1], best=[0.3, 0.4])
    a["gate"]["current"]["refused"]["k"] = 1
    c = compare(a, _result([1, 1], best=[0.3, 0.4]))
    assert not _gate(c, "refused").paired
    assert _gate(c, "bluffs").paired


def test_recorded_per_query_outcomes_are_paired() -> None:
    extra = {"shown": {"k": 1, "n": 2, "value": 0.5, "ci95": [0.1, 0.9]}}
    a = _result([1, None], extra=extra)
    b = _result([1, None], extra={"shown": {"k": 2, "n": 2, "value": 1.0, "ci95": [0.3, 1.0]}})
    a["gate"]["per_query"] = {"in_domain": {"shown": [True, False]}}
    b["gate"]["per_query"] = {"in_domain": {"shown": [True, True]}}
    shown = _gate(compare(a, b), "shown")
    assert shown.paired and (shown.only_a, shown.only_b) == (0, 1)
    # Present on one side only: not compared at all.
    del b["gate"]["current"]["shown"]
    assert "shown" not in {g.name for g in compare(a, b).gate}


def test_results_of_different_sets_are_refused() -> None:
    a = _result([1, 2], ids=["x", "x"])
    b = _result([1, 2], ids=["z", "z"])
    with pytest.raises(ComparisonError, match="not run on the same in-domain queries"):
        compare(a, b)
    b = _result([1, 2], ids=["x", "x"], ood_best=[0.7])
    with pytest.raises(ComparisonError, match="out-of-domain"):
        compare(a, b)


def test_notes_name_what_differs() -> None:
    a = _result([1, 2], threshold=0.5)
    b = _result([1, 2], threshold=0.45, model="openai:text-embedding-3-small")
    a["corpus"], b["corpus"] = "/srv/kb/evaluation/sets/prometheus/corpus", "sets/prometheus/corpus"
    notes = compare(a, b).notes
    assert not any(n.startswith("corpus") for n in notes)
    b["corpus"] = "evaluation/sets/pip-black/corpus"
    notes = compare(a, b).notes
    assert any(n.startswith("corpus: a indexed /srv/kb/") for n in notes)
    assert any("embedding model" in n and "openai:" in n for n in notes)
    assert any("thresholds differ (0.5 vs 0.45)" in n for n in notes)


def test_rendering_shows_both_sides_and_the_test() -> None:
    c = compare(_result([1, 3, None, 6]), _result([1, 1, 5, None]), ("baseline", "this run"))
    text = render_comparison(c)
    assert "this run against baseline: 4 in-domain queries, 3 out-of-domain" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("hybrid") and "R@1 " in ln)
    assert "0.250 [" in line and "0.500 [" in line and "+1/-0" in line
    assert "unpaired" in text
    markdown = render_comparison(c, markdown=True)
    assert "| mode | metric | baseline | this run | this run vs baseline | p |" in markdown
    assert c.to_dict()["retrieval"][0]["a"]["k"] == 1


def test_saved_results_are_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "before.json"
    path.write_text(json.dumps(_result([1, 2, 3, 4])), encoding="utf-8")
    side = load_result(path, "baseline")
    assert isinstance(side, Side) and side.query_ids[:2] == ("q0/doc", "q0/ticket")
    questions = [Question(f"q{i}", "needle text", "doc?", "ticket?") for i in range(2)]
    ood = [OODQuestion(f"o{i}", "far?") for i in range(3)]
    check_same_queries(side, questions, ood)
    with pytest.raises(ComparisonError, match="same in-domain queries"):
        check_same_queries(side, questions[:1], ood)
    with pytest.raises(ComparisonError, match="out-of-domain"):
        check_same_queries(side, questions, ood[:2])

    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ComparisonError, match="not JSON"):
        load_result(bad, "baseline")
    bad.write_text('{"corpus": "c"}', encoding="utf-8")
    with pytest.raises(ComparisonError, match="not a `kb eval --json` result"):
        load_result(bad, "baseline")
    with pytest.raises(ComparisonError, match="Cannot read"):
        load_result(tmp_path / "missing.json", "baseline")


def test_hybrid_is_also_compared_per_phrasing() -> None:
    # Even positions are doc phrasings, odd ones ticket phrasings.
    a = _result([1, None, 2, 9, 1, None])
    b = _result([1, 3, 2, 2, 5, 1])
    c = compare(a, b)
    rows = {(r.mode, r.metric): r for r in c.by_phrasing}
    assert set(rows) == {
        (f"hybrid, {p}", m) for p in ("doc", "ticket") for m in ("R@1", "R@4", "R@8", "R@20", "MRR")
    }
    doc, ticket = rows[("hybrid, doc", "R@4")], rows[("hybrid, ticket", "R@4")]
    # doc: a hits 0, 2, 4 within 4; b hits 0, 2 (query 4 at rank 5).
    assert (doc.a.successes, doc.b.successes, doc.only_a, doc.only_b) == (3, 2, 1, 0)
    # ticket: a hits none within 4; b hits all three.
    assert (ticket.a.n, ticket.a.successes, ticket.only_b) == (3, 0, 3)
    assert c.to_dict()["by_phrasing"][0]["mode"] == "hybrid, doc"
    assert "Hybrid by phrasing" in render_comparison(c)
