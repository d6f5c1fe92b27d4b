"""``kb eval`` per language: the groups, their figures, the report and ``--baseline``.

The set is the CI mini set's documents (``tests/data/evalmini``) plus one
French page written here, with questions in Czech, English and French, some
asked in another language than their document's, and one without ``lang``. Every
figure of a group is recounted from the run's own per-query output
(``query_order``, ranks, distances, ``gate.per_query``), so a wrong grouping or
mask shows up as a wrong count.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bot.cli import main
from evaluation.languages import CROSS_LINGUAL, LanguageGroup, language_groups
from evaluation.results import RECALL_KS
from evaluation.set_check import check_evalset
from evaluation.stats import wilson_interval
from tests.evalmini import EVALMINI

CANTINE = """# Cantine du siège

## Horaires

La cantine est ouverte du lundi au vendredi, de 11 h 30 à 14 h, sauf les jours fériés.

## Paiement

Le repas se paie avec le badge d'entreprise, rechargeable à l'accueil du rez-de-chaussée.
"""

QUESTIONS: list[dict[str, str]] = [
    # Czech questions about English documents: cross-lingual.
    {
        "id": "vpn-session-length",
        "needle": "A session stays open for twelve hours",
        "doc_phrasing": "Jak dlouho zůstává relace Kestrel otevřená, než se musím znovu přihlásit?",
        "ticket_phrasing": "vpn mě každý večer odhlásí, proč?",
        "lang": "cs",
        "doc_lang": "en",
    },
    {
        "id": "vpn-kv-409",
        "needle": "KV-409: you already have two active sessions",
        "doc_phrasing": "Co znamená chybový kód KV-409?",
        "ticket_phrasing": "při připojení z druhého notebooku mi to hlásí KV-409",
        "lang": "cs",
        "doc_lang": "en",
    },
    {
        "id": "expenses-deadline",
        "needle": "Claims must be submitted within 60 days of the expense.",
        "doc_phrasing": "How old can a receipt be when it is submitted in Ledgerly?",
        "ticket_phrasing": "found an old taxi receipt from march, can i still get reimbursed?",
        "lang": "en",
    },
    {
        "id": "expenses-meals",
        "needle": "Meals are covered up to 45 euros per person per day",
        "doc_phrasing": "How much is covered for meals when travelling overnight?",
        "ticket_phrasing": "whats the daily food allowance on a business trip?",
        "lang": "en",
        "doc_lang": "en",
    },
    {
        "id": "heron-job-limit",
        "needle": "A job may run for at most 45 minutes.",
        "doc_phrasing": "How long may a job run on Heron?",
        "ticket_phrasing": "my CI job got killed and marked timed out, can it get more time?",
        "lang": "en",
    },
    # No lang: in no language group.
    {
        "id": "heron-debug-shell",
        "needle": "it keeps the machine for 30 minutes and prints an SSH command",
        "doc_phrasing": "How do I open a shell on the build machine to investigate a failed job?",
        "ticket_phrasing": "need to ssh into the ci box where my job failed, how?",
    },
    {
        "id": "cantine-horaires",
        "needle": "La cantine est ouverte du lundi au vendredi, de 11 h 30 à 14 h",
        "doc_phrasing": "Quels sont les horaires d'ouverture de la cantine ?",
        "ticket_phrasing": "la cantine ferme à quelle heure le midi ?",
        "lang": "fr",
    },
    # An English question about the French page: cross-lingual.
    {
        "id": "cantine-paiement",
        "needle": "Le repas se paie avec le badge d'entreprise",
        "doc_phrasing": "How is lunch at the head office canteen paid for?",
        "ticket_phrasing": "can i pay for lunch at the cantine with cash?",
        "lang": "en",
        "doc_lang": "fr",
    },
]
OOD: list[dict[str, str]] = [
    {"id": "far-paella", "question": "How do I cook a traditional Valencian paella?", "lang": "en"},
    {"id": "far-offside", "question": "What is the offside rule in football?", "lang": "en"},
    {"id": "far-passeport", "question": "Comment renouveler mon passeport ?", "lang": "fr"},
    {
        "id": "far-mistrovstvi",
        "question": "Kdo vyhrál mistrovství světa ve fotbale 1998?",
        "lang": "cs",
    },
    {"id": "far-world-cup", "question": "Who won the 1998 football World Cup?"},
]
GROUPS = ["cs", "en", "fr", CROSS_LINGUAL]
"""Sorted languages, then the cross-lingual group."""


def _write_set(root: Path, questions: list[dict[str, str]], ood: list[dict[str, str]]) -> Path:
    shutil.copytree(EVALMINI / "corpus", root / "corpus")
    (root / "corpus" / "cantine.md").write_text(CANTINE, encoding="utf-8")
    for name, rows in (("questions.jsonl", questions), ("ood.jsonl", ood)):
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (root / name).write_text(lines, encoding="utf-8")
    return root


def _options(root: Path) -> list[str]:
    return [
        "--corpus",
        str(root / "corpus"),
        "--questions",
        str(root / "questions.jsonl"),
        "--ood",
        str(root / "ood.jsonl"),
    ]


def _eval(root: Path, out: Path, *extra: str) -> dict[str, Any]:
    args = ["--data-dir", str(out / "kb-data"), "eval", *_options(root), "--json", "--no-progress"]
    result = CliRunner().invoke(main, [*args, *extra])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ``kb eval --json --report`` run on the multilingual set, shared by the checks."""
    root = _write_set(tmp_path_factory.mktemp("evallang"), QUESTIONS, OOD)
    out = tmp_path_factory.mktemp("evallang-out")
    data = _eval(root, out, "--report", str(out / "eval.md"))
    return {"data": data, "root": root, "out": out}


def _members(data: dict[str, Any], group: str) -> list[int]:
    """The positions of a group's queries, read from ``query_order`` alone."""
    order = data["query_order"]
    if group == CROSS_LINGUAL:
        return [i for i, q in enumerate(order) if "lang" in q and q["lang"] != q["doc_lang"]]
    return [i for i, q in enumerate(order) if q.get("lang") == group]


def _share(values: list[bool]) -> dict[str, Any]:
    k, n = sum(values), len(values)
    return {"k": k, "n": n, "value": k / n if n else 0.0, "ci95": list(wilson_interval(k, n))}


def test_the_set_is_valid(tmp_path: Path) -> None:
    # The fixture is a set set_check accepts, languages included.
    root = _write_set(tmp_path, QUESTIONS, OOD)
    paths = (root / "corpus", root / "questions.jsonl", root / "ood.jsonl")
    assert check_evalset(*paths, min_questions=1) == []


def test_groups_from_labels() -> None:
    labels = [("cs", "en"), ("cs", "en"), ("", ""), ("", ""), ("en", ""), ("en", "en")]
    assert language_groups(labels, ["fr", "", "en"]) == [
        LanguageGroup("cs", (0, 1), ()),
        LanguageGroup("en", (4, 5), (2,)),
        LanguageGroup("fr", (), (0,)),
        LanguageGroup(CROSS_LINGUAL, (0, 1), None),
    ]
    assert language_groups([("", "")] * 4, ["", ""]) == []
    group = LanguageGroup("cs", (0, 1, 5), ())
    assert group.by_phrasing(["doc", "ticket", "doc", "ticket", "doc", "ticket"]) == [
        ("all", (0, 1, 5)),
        ("doc", (0,)),
        ("ticket", (1, 5)),
    ]
    assert LanguageGroup("fr", (), (0,)).by_phrasing([]) == []


def test_groups_are_the_languages_then_cross_lingual(run: dict[str, Any]) -> None:
    by_language = run["data"]["by_language"]
    assert list(by_language) == GROUPS
    sizes = {
        name: (
            g["questions"],
            {p: f["queries"] for p, f in g["phrasings"].items()},
            g["ood_questions"],
        )
        for name, g in by_language.items()
    }
    assert sizes == {
        "cs": (2, {"all": 4, "doc": 2, "ticket": 2}, 1),
        "en": (4, {"all": 8, "doc": 4, "ticket": 4}, 2),
        "fr": (1, {"all": 2, "doc": 1, "ticket": 1}, 1),
        CROSS_LINGUAL: (3, {"all": 6, "doc": 3, "ticket": 3}, 0),
    }
    assert by_language[CROSS_LINGUAL]["ood"] is None
    # The question without lang is in no group, and the totals are unchanged.
    assert run["data"]["questions"] == 8 and run["data"]["queries"] == 16
    assert sum(sizes[g][1]["all"] for g in ("cs", "en", "fr")) == 16 - 2
    assert run["data"]["ood_questions"] == 5


def test_query_order_and_ood_rows_carry_the_languages(run: dict[str, Any]) -> None:
    order = run["data"]["query_order"]
    assert [(q["question_id"], q.get("lang"), q.get("doc_lang")) for q in order[::2]] == [
        ("vpn-session-length", "cs", "en"),
        ("vpn-kv-409", "cs", "en"),
        ("expenses-deadline", "en", "en"),
        ("expenses-meals", "en", "en"),
        ("heron-job-limit", "en", "en"),
        ("heron-debug-shell", None, None),
        ("cantine-horaires", "fr", "fr"),
        ("cantine-paiement", "en", "fr"),
    ]
    assert [o.get("lang") for o in run["data"]["gate"]["ood"]] == ["en", "en", "fr", "cs", None]


def test_retrieval_figures_are_those_of_the_groups_queries(run: dict[str, Any]) -> None:
    data = run["data"]
    phrasing = [q["phrasing"] for q in data["query_order"]]
    modes = data["product"]["modes"]
    assert set(modes) == {"dense", "bm25", "hybrid", "final"}
    for name, group in data["by_language"].items():
        members = _members(data, name)
        for subset, figures in group["phrasings"].items():
            idx = [i for i in members if subset in ("all", phrasing[i])]
            assert set(figures["modes"]) == set(modes)
            for mode, scores in figures["modes"].items():
                ranks = [modes[mode]["ranks"][i] for i in idx]
                assert scores["n"] == len(idx) and "ranks" not in scores
                for k in RECALL_KS:
                    hits = [r is not None and r <= k for r in ranks]
                    assert scores["recall"][str(k)] == _share(hits), (name, subset, mode, k)
                mrr = sum(1 / r for r in ranks if r) / len(ranks)
                assert scores["mrr"]["value"] == pytest.approx(mrr)
                low, high = scores["mrr"]["ci95"]
                assert low <= scores["mrr"]["value"] <= high


def test_gate_figures_are_those_of_the_groups_queries(run: dict[str, Any]) -> None:
    data = run["data"]
    gate = data["gate"]
    threshold = gate["threshold"]
    per_query = gate["per_query"]
    refused = [d is None or d > threshold for d in gate["distances"]["in_domain_best"]]
    bluffs = [d is not None and d <= threshold for d in gate["distances"]["ood_best"]]
    assert per_query["ood"]["bluffs"] == bluffs  # the two derivations agree
    ood_langs = [o.get("lang") for o in gate["ood"]]
    for name, group in data["by_language"].items():
        members = _members(data, name)
        figures = group["phrasings"]["all"]["gate"]
        assert set(figures) == {"refused", *per_query["in_domain"]}
        assert {"shown", "answered", "hard_refused", "kept_answerable"} <= set(figures)
        assert figures["refused"] == _share([refused[i] for i in members])
        for outcome, values in per_query["in_domain"].items():
            assert figures[outcome] == _share([values[i] for i in members]), (name, outcome)
        if name == CROSS_LINGUAL:
            continue
        asked = [i for i, lang in enumerate(ood_langs) if lang == name]
        assert group["ood"]["bluffs"] == _share([bluffs[i] for i in asked])
        assert group["ood"]["ood_related"] == _share(
            [per_query["ood"]["ood_related"][i] for i in asked]
        )
    # Languages partition the labelled queries: their refusals add up.
    counted = sum(
        data["by_language"][g]["phrasings"]["all"]["gate"]["refused"]["k"] for g in GROUPS[:3]
    )
    unlabelled = [i for i, q in enumerate(data["query_order"]) if "lang" not in q]
    assert counted + sum(refused[i] for i in unlabelled) == sum(refused)


def test_destroyed_needles_per_language(run: dict[str, Any]) -> None:
    for name, group in run["data"]["by_language"].items():
        assert group["destroyed"] == _share([False] * group["questions"]), name


def test_the_report_breaks_the_figures_down_by_language(run: dict[str, Any]) -> None:
    report = (run["out"] / "eval.md").read_text(encoding="utf-8")
    assert "### By language (hybrid; gate at the threshold " in report
    assert "| language | phrasing | queries | R@1 | R@4 | R@8 | R@20 | MRR |" in report
    for name, queries in (("cs", 4), ("en", 8), ("fr", 2), (CROSS_LINGUAL, 6)):
        assert f"| {name} | all | {queries} |" in report
    assert "| language | phrasing | answered | refused | hard refused | needle shown |" in report
    cs = run["data"]["by_language"]["cs"]["ood"]["bluffs"]
    assert f"| cs | 1 | {cs['k']}/1 " in report
    assert f"| {CROSS_LINGUAL} | 1 |" not in report  # no out-of-domain row for it


def test_a_baseline_is_compared_per_language(run: dict[str, Any], tmp_path: Path) -> None:
    # A baseline saved before the sets had languages: this run's labels group both.
    before = json.loads(json.dumps(run["data"]))
    for q in before["query_order"]:
        q.pop("lang", None), q.pop("doc_lang", None)
    for o in before["gate"]["ood"]:
        o.pop("lang", None)
    del before["by_language"]
    saved = tmp_path / "before.json"
    saved.write_text(json.dumps(before), encoding="utf-8")
    report = tmp_path / "eval.md"
    data = _eval(run["root"], tmp_path, "--baseline", str(saved), "--report", str(report))
    comparison = data["comparison"]
    rows = comparison["by_language"]["retrieval"]
    assert {(r["language"], r["phrasing"]) for r in rows} == {
        (g, p) for g in GROUPS for p in ("all", "doc", "ticket")
    }
    assert len(rows) == 4 * 3 * (len(RECALL_KS) + 1)
    mine = next(
        r for r in rows if (r["language"], r["phrasing"], r["metric"]) == ("fr", "all", "R@4")
    )
    assert mine["mode"] == "hybrid, fr, all"
    assert (
        mine["b"] == data["by_language"]["fr"]["phrasings"]["all"]["modes"]["hybrid"]["recall"]["4"]
    )
    # The same build on the same set: no query differs.
    assert all(r["only_a"] == r["only_b"] == 0 and r["p"] == 1.0 for r in rows)
    gate = {(g["language"], g["phrasing"], g["name"]): g for g in comparison["by_language"]["gate"]}
    for name in ("cs", "en", "fr"):
        assert gate[(name, "", "bluffs")]["b"] == data["by_language"][name]["ood"]["bluffs"]
        assert gate[(name, "", "bluffs")]["paired"]
    refused = gate[(CROSS_LINGUAL, "ticket", "refused")]
    assert (
        refused["a"] == data["by_language"][CROSS_LINGUAL]["phrasings"]["ticket"]["gate"]["refused"]
    )
    assert (CROSS_LINGUAL, "", "bluffs") not in gate
    assert all(g["only_a"] == g["only_b"] == 0 for g in gate.values())
    # The rows of every query are unchanged by the breakdown.
    assert [set(r) for r in comparison["retrieval"]] == [
        {"mode", "metric", "a", "b", "only_a", "only_b", "p"}
    ] * len(comparison["retrieval"])
    text = report.read_text(encoding="utf-8")
    assert "Hybrid by language and phrasing" in text
    assert "| hybrid, cs, ticket | R@1 |" in text
    assert "Gate by language (both phrasings; paired outcomes only)" in text
    assert f"| {CROSS_LINGUAL} | refused |" in text
