"""``kb eval``: the CLI on a tiny fixture set, the comparison chunkers, the feedback export.

The full bundled set runs only in ``bench/eval_full.py``; here every expected
number can be counted by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bot.cli import main
from core.config import EngineConfig
from evaluation.inputs import OODQuestion, Question, load_ood, load_questions
from evaluation.results import RECALL_KS
from evaluation.run import evaluate, export_disliked
from evaluation.strategies import OVERLAP_CHARS, blind, make_chunker, with_overlap, without_header
from index.config import IndexConfig
from index.embed import Embedder
from index.ingest.chunk import chunk_document
from index.models import Extracted
from index.storage.store import Store
from tests.evalmini import EVALMINI, EVALSET_OPTIONS
from tests.query_factory import log_question

# ---------------------------------------------------------------------- its own store


@pytest.mark.parametrize("search_engine", ["local", "qdrant"])
def test_eval_runs_on_a_store_of_its_own_not_the_configured_database(
    tmp_path: Path, embedder: Embedder, postgres_url: str, search_engine: str
) -> None:
    from index.search.qdrant import engines
    from index.search.qdrant import index as qdrant_index
    from tests.test_search_index_contract import _add

    # The operator's configuration: the shared Postgres store, holding a document.
    config = IndexConfig(
        data_dir=tmp_path / "kb-data", database_url=postgres_url, search_engine=search_engine
    )
    production = Store(config.data_dir, database_url=postgres_url)
    _add(production, embedder, ["The production handbook: expenses over 500 need a director."])
    generation, embedded = production.generation, dict(engines._EMBEDDED)
    result = evaluate(
        EVALMINI / "corpus",
        load_questions(EVALMINI / "questions.jsonl"),
        load_ood(EVALMINI / "ood.jsonl"),
        embedder=embedder,
        index=config,
        engine=EngineConfig(),
    )
    # Measured on the evaluation's corpus alone...
    assert result.product.documents == 3 and not result.product.failed_documents
    assert result.product.modes["hybrid"].ranks
    # ...and nothing of it is in the shared store, searchable by users.
    assert production.document_count() == 1 and production.generation == generation
    assert not production.audit_log.entries()
    # Its search collections were its own, and are gone with it.
    assert production.get_meta(qdrant_index.KB_ID_KEY) is None
    assert embedded == engines._EMBEDDED  # the embedded engine it opened is closed


# ---------------------------------------------------------------------- the CLI on evalmini


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One ``kb eval --json --report --plot`` run on the fixture set, shared by the checks."""
    out = tmp_path_factory.mktemp("evalmini-out")
    result = CliRunner().invoke(
        main,
        [
            "--data-dir",
            str(out / "kb-data"),
            "eval",
            *EVALSET_OPTIONS,
            "--json",
            "--report",
            str(out / "eval.md"),
            "--plot",
            str(out / "eval.png"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    return {"data": json.loads(result.stdout), "out": out}


def test_eval_counts_two_queries_per_question(mini: dict[str, Any]) -> None:
    data = mini["data"]
    questions = len(load_questions(EVALMINI / "questions.jsonl"))
    assert data["questions"] == questions
    assert data["queries"] == 2 * questions
    for mode in ("dense", "bm25", "hybrid"):
        assert data["product"]["modes"][mode]["n"] == 2 * questions
        assert len(data["product"]["modes"][mode]["ranks"]) == 2 * questions


def test_product_chunker_destroys_nothing(mini: dict[str, Any]) -> None:
    product = mini["data"]["product"]
    assert product["name"] == "E"
    assert product["destroyed"]["k"] == 0
    assert product["missing_from_corpus"] == []
    assert product["over_window"] == 0
    assert product["failed_documents"] == []


def test_every_needle_is_found_within_twenty(mini: dict[str, Any]) -> None:
    # The fixture has fewer than 20 chunks: the dense leg returns all of them.
    modes = mini["data"]["product"]["modes"]
    assert mini["data"]["product"]["chunks"] <= 20
    assert modes["dense"]["recall"]["20"]["value"] == 1.0
    assert modes["hybrid"]["recall"]["20"]["value"] == 1.0


def test_recall_values_are_fractions_with_intervals_around_them(mini: dict[str, Any]) -> None:
    n = mini["data"]["queries"]
    for mode, scores in mini["data"]["product"]["modes"].items():
        previous = 0.0
        for k in RECALL_KS:
            r = scores["recall"][str(k)]
            assert r["n"] == n
            assert r["value"] == pytest.approx(r["k"] / n)
            hits = sum(1 for rank in scores["ranks"] if rank is not None and rank <= k)
            assert r["k"] == hits, (mode, k)
            low, high = r["ci95"]
            assert low <= r["value"] <= high
            assert r["value"] >= previous  # recall never falls as k grows
            previous = r["value"]
        mrr = scores["mrr"]
        expected = sum(1 / rank for rank in scores["ranks"] if rank) / n
        assert mrr["value"] == pytest.approx(expected)
        assert mrr["ci95"][0] <= mrr["value"] <= mrr["ci95"][1]


def test_sweep_is_monotone(mini: dict[str, Any]) -> None:
    gate = mini["data"]["gate"]
    sweep = gate["sweep"]
    thresholds = [row["threshold"] for row in sweep]
    assert thresholds == sorted(thresholds)
    assert gate["threshold"] in thresholds  # the configured one is always evaluated
    bluffs = [row["bluffs"]["k"] for row in sweep]
    refused = [row["refused"]["k"] for row in sweep]
    assert bluffs == sorted(bluffs)
    assert refused == sorted(refused, reverse=True)
    for row in sweep:
        assert row["bluffs"]["n"] == mini["data"]["ood_questions"]
        assert row["refused"]["n"] == mini["data"]["queries"]
        # A query whose needle was kept was not refused.
        assert row["answerable"]["k"] + row["refused"]["k"] <= row["refused"]["n"]
        low, high = row["bluffs"]["ci95"]
        assert low <= row["bluffs"]["value"] <= high


def test_bluffs_follow_the_ood_distances(mini: dict[str, Any]) -> None:
    gate = mini["data"]["gate"]
    best = gate["distances"]["ood_best"]
    for row in gate["sweep"]:
        assert row["bluffs"]["k"] == sum(1 for d in best if d <= row["threshold"])


def test_report_and_plot_are_written(mini: dict[str, Any]) -> None:
    report = (mini["out"] / "eval.md").read_text(encoding="utf-8")
    assert "| mode | R@1 | R@4 | R@8 | R@20 | MRR |" in report
    assert "(current)" in report
    assert (mini["out"] / "eval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_set_without_languages_has_no_language_breakdown(mini: dict[str, Any]) -> None:
    data = mini["data"]
    assert data["by_language"] == {}
    assert all(set(q) == {"question_id", "phrasing", "text"} for q in data["query_order"])
    assert all(
        set(o) == {"id", "question", "kind", "best_distance", "closest"}
        for o in data["gate"]["ood"]
    )
    report = (mini["out"] / "eval.md").read_text(encoding="utf-8")
    assert "By language" not in report and "cross-lingual" not in report


def test_unknown_files_are_reported_not_raised(tmp_path: Path) -> None:
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"id": "x", "needle": "", "doc_phrasing": "a", "ticket_phrasing": "b"}\n')
    result = CliRunner().invoke(
        main,
        ["eval", "--corpus", str(EVALMINI / "corpus"), "--questions", str(bad), "--no-progress"],
    )
    assert result.exit_code == 1
    assert "needle" in result.output


def test_eval_pairs_a_run_with_a_saved_baseline(mini: dict[str, Any], tmp_path: Path) -> None:
    saved = tmp_path / "before.json"
    saved.write_text(json.dumps(mini["data"]), encoding="utf-8")
    result = CliRunner().invoke(
        main,
        [
            "--data-dir",
            str(tmp_path / "kb-data"),
            "eval",
            *EVALSET_OPTIONS,
            "--baseline",
            str(saved),
            "--json",
            "--report",
            str(tmp_path / "eval.md"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    comparison = json.loads(result.stdout)["comparison"]
    assert comparison["queries"] == mini["data"]["queries"]
    # "final": the order passages reach the asker in (hybrid here: no reranker).
    modes = {r["mode"] for r in comparison["retrieval"]}
    assert modes == {"dense", "bm25", "hybrid", "final"}
    # The same build on the same set ranks every needle the same way.
    assert all(r["only_a"] == r["only_b"] == 0 for r in comparison["retrieval"])
    refused = next(g for g in comparison["gate"]["rows"] if g["name"] == "refused")
    assert refused["paired"] and refused["p"] == 1.0
    assert comparison["by_language"] == {"retrieval": [], "gate": []}  # no lang in evalmini
    report = (tmp_path / "eval.md").read_text(encoding="utf-8")
    assert "| mode | metric | baseline | this run | this run vs baseline | p |" in report
    assert "by language" not in report


def test_a_baseline_of_other_questions_fails_before_indexing(
    mini: dict[str, Any], tmp_path: Path
) -> None:
    data = json.loads(json.dumps(mini["data"]))
    data["query_order"][0]["question_id"] = "some-other-question"
    saved = tmp_path / "other.json"
    saved.write_text(json.dumps(data), encoding="utf-8")
    result = CliRunner().invoke(
        main,
        [
            "--data-dir",
            str(tmp_path / "kb-data"),
            "eval",
            *EVALSET_OPTIONS,
            "--baseline",
            str(saved),
        ],
    )
    assert result.exit_code == 1
    assert "not run on the same in-domain queries" in result.output
    assert "some-other-question" in result.output
    assert not (tmp_path / "kb-data").exists()


@pytest.mark.parametrize("command", ["eval", "calibrate"])
def test_a_bundled_set_is_chosen_by_name(command: str) -> None:
    both = CliRunner().invoke(main, [command, "--set", "pip-black", *EVALSET_OPTIONS])
    assert both.exit_code == 2
    assert "either --set or --corpus/--questions/--ood" in both.output
    unknown = CliRunner().invoke(main, [command, "--set", "no-such-set"])
    assert unknown.exit_code == 2
    assert "'no-such-set'" in unknown.output and "pip-black" in unknown.output


def test_set_names_the_bundled_files() -> None:
    from bot.cli.evaluation import _evalset
    from evaluation.inputs import bundled_set

    bundled = bundled_set("pip-black")
    assert _evalset("pip-black", None, None, None) == (
        bundled.corpus,
        bundled.questions,
        bundled.ood,
    )
    own = EVALMINI / "questions.jsonl"
    assert _evalset(None, None, own, None) == (bundled.corpus, own, bundled.ood)


# ---------------------------------------------------------------------- strategies


NEEDLE = "The vault code is rotated every Tuesday at noon."


def _straddling_document() -> str:
    """A Markdown document whose needle starts 20 characters before the 512 mark."""
    head = "# Vault\n\n## Rotation\n\n"
    sentence = "Operators keep the vault closed outside office hours and log every visit. "
    para = (sentence * 7)[: 492 - len(head) - 2]
    para = para[:-1] + "." if para[-1].isspace() else para
    text = head + para + "\n\n"
    assert len(text) == 492 and len(NEEDLE) > 20
    return text + NEEDLE + " Ask the security desk for the current one.\n"


def test_blind_cuts_are_found_offsets() -> None:
    text = _straddling_document()
    doc = Extracted(text=text, title="Vault", kind="md")
    chunks = blind(doc, size=512).chunks
    assert [c.start for c in chunks][:2] == [0, 512]
    for c in chunks:
        assert text[c.start : c.end] == c.content
        assert c.text == c.content
    assert not any(NEEDLE in c.content for c in chunks)  # destroyed by the cut
    overlapped = with_overlap(blind(doc, size=512), doc).chunks
    for prev, c in zip(overlapped, overlapped[1:], strict=False):
        assert text[c.start : c.end] == c.content
        assert c.start >= prev.end - OVERLAP_CHARS
    assert any(NEEDLE in c.content for c in overlapped)


def test_derived_strategies_keep_the_product_cuts(embedder: Embedder) -> None:
    text = _straddling_document() + "\n## Access\n\nOnly two people hold a key at any time.\n"
    doc = Extracted(text=text, title="Vault", kind="md")
    args = {"budget": 512, "count_tokens": embedder.count_tokens, "max_tokens": embedder.max_tokens}
    assert make_chunker("E", **args) is None  # the product's own code path
    product = make_chunker("F", **args)
    assert product is not None
    e_chunks = chunk_document(doc, **args)
    c = without_header(e_chunks).chunks
    assert [(x.start, x.end) for x in c] == [(x.start, x.end) for x in e_chunks.chunks]
    assert all(x.text == x.content for x in c)
    f = product(doc).chunks
    assert f[0] == e_chunks.chunks[0]
    for x, e in zip(f[1:], e_chunks.chunks[1:], strict=True):
        assert x.end == e.end and x.start < e.start
        assert text[x.start : x.end] == x.content
        assert x.text.endswith(x.content)
        assert x.text.startswith(e.text[: len(e.text) - len(e.content)])  # same header
    with pytest.raises(ValueError, match="unknown"):
        make_chunker("Z", **args)


def test_blind_destroys_a_straddling_needle_and_overlap_saves_it(
    tmp_path: Path, embedder: Embedder
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "vault.md").write_text(_straddling_document(), encoding="utf-8")
    questions = [
        Question(
            "vault", NEEDLE, "How often is the vault code rotated?", "vault code changed again?"
        )
    ]
    ood = [OODQuestion("paella", "How do I cook paella?", "far")]
    result = evaluate(
        corpus,
        questions,
        ood,
        embedder=embedder,
        index=IndexConfig(data_dir=tmp_path / "unused"),
        engine=EngineConfig(),
        strategies=("A", "B", "E"),
    )
    assert result.strategies["A"].destroyed == ["vault"]
    assert result.strategies["A"].modes["hybrid"].ranks == [None, None]
    assert result.strategies["B"].destroyed == []
    assert result.strategies["E"].destroyed == []
    assert result.strategies["E"] is result.product
    assert result.product.modes["dense"].recall(20).value == 1.0
    # B finds what A cannot on both phrasings: two discordant pairs, all B's.
    b_vs_a = next(
        t
        for t in result.strategy_tests
        if (t.first, t.second, t.mode, t.k) == ("B", "A", "hybrid", 20)
    )
    assert (b_vs_a.wins, b_vs_a.losses) == (2, 0)
    assert b_vs_a.p == pytest.approx(0.5)


# ---------------------------------------------------------------------- feedback loop


def test_export_disliked_questions(tmp_path: Path) -> None:
    store = Store(tmp_path / "kb-data")
    liked = log_question(store, "How do I rotate the key?")
    disliked = log_question(store, "Why is the VPN slow?")
    both = log_question(store, "Where is the expense form?")
    store.feedback.add(liked, 1)
    store.feedback.add(disliked, -1)
    store.feedback.add(both, 1)
    store.feedback.add(both, -1)
    out = tmp_path / "candidates.jsonl"
    assert export_disliked(store, out) == 2
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert {r["question"] for r in rows} == {"Why is the VPN slow?", "Where is the expense form?"}
    for r in rows:
        assert set(r) == {"id", "question", "needle", "doc_phrasing", "ticket_phrasing", "label"}
        assert r["needle"] == "" and r["ticket_phrasing"] == ""
        assert r["doc_phrasing"] == r["question"]
        assert r["label"] == "todo"
    # Unlabelled candidates are refused as evaluation questions, with a hint.
    result = CliRunner().invoke(
        main, ["eval", "--corpus", str(EVALMINI / "corpus"), "--questions", str(out)]
    )
    assert result.exit_code == 1
    assert "label" in result.output


def test_export_disliked_from_the_cli(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb-data"
    store = Store(data_dir)
    store.feedback.add(log_question(store, "Is there parking at the office?"), -1)
    out = tmp_path / "todo.jsonl"
    result = CliRunner().invoke(main, ["--data-dir", str(data_dir), "export-disliked", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 thumbs-down" in result.output
    assert (
        json.loads(out.read_text(encoding="utf-8"))["question"] == "Is there parking at the office?"
    )
