"""``kb eval --compare A --compare B`` and the kept passages ``kb eval`` measures.

On the tiny fixture set: the same configuration twice must disagree on no
query at all; a reranker changes only what is kept, never what retrieval
finds; the configurations are parsed strictly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bot.cli import main
from evaluation.inputs import EvalSetError
from evaluation.variants import Variant, parse_variant
from tests.evalmini import EVALSET_OPTIONS
from tests.tiny_models import tiny_cross_encoder

BUNDLED = "bundled:all-MiniLM-L6-v2"


def _compare(tmp_path: Path, *specs: str, extra: tuple[str, ...] = ()) -> Any:
    args = ["--data-dir", str(tmp_path / "kb"), "eval", *EVALSET_OPTIONS, "--no-progress"]
    for spec in specs:
        args += ["--compare", spec]
    return CliRunner().invoke(main, [*args, *extra])


def test_configurations_are_parsed_over_the_settings() -> None:
    configured = {"embedding_model": BUNDLED, "reranker": ""}
    assert parse_variant("", **configured) == Variant(BUNDLED, "")
    assert parse_variant("openai:text-embedding-3-small", **configured) == Variant(
        "openai:text-embedding-3-small", ""
    )
    assert parse_variant("rerank=/models/ce", **configured) == Variant(BUNDLED, "/models/ce")
    both = parse_variant(" emb=openai:x , rerank=none ", embedding_model=BUNDLED, reranker="/ce")
    assert both == Variant("openai:x", "") and both.label == "emb=openai:x"
    assert Variant("m", "r").label == "emb=m,rerank=r"
    with pytest.raises(EvalSetError, match="unknown part 'model'"):
        parse_variant("model=x", **configured)
    with pytest.raises(EvalSetError, match="needs a model"):
        parse_variant("emb=", **configured)


def test_the_same_configuration_twice_disagrees_on_nothing(tmp_path: Path) -> None:
    result = _compare(tmp_path, f"emb={BUNDLED}", BUNDLED, extra=("--json",))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["variants"] == {"A": f"emb={BUNDLED}", "B": f"emb={BUNDLED}"}
    rows = data["comparison"]["retrieval"]
    assert {r["mode"] for r in rows} >= {"dense", "bm25", "hybrid"}
    assert all(r["only_a"] == r["only_b"] == 0 and r["p"] == 1.0 for r in rows)
    gate = {g["name"]: g for g in data["comparison"]["gate"]["rows"]}
    assert gate["kept_answerable"]["paired"] and gate["kept_first"]["paired"]
    assert all(g["only_a"] == g["only_b"] == 0 for g in gate.values() if g["paired"])
    assert data["kept"]["A"] == data["kept"]["B"]
    assert data["kept"]["A"]["reranker"] is None


def test_a_reranker_changes_what_is_kept_not_what_is_found(tmp_path: Path) -> None:
    model = tiny_cross_encoder(tmp_path / "ce")
    report = tmp_path / "compare.md"
    result = _compare(
        tmp_path, BUNDLED, f"rerank={model}", extra=("--json", "--report", str(report))
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["variants"]["B"] == f"emb={BUNDLED},rerank={model}"
    rows = data["comparison"]["retrieval"]
    assert all(r["only_a"] == r["only_b"] == 0 for r in rows if r["mode"] != "final")
    kept_a, kept_b = data["kept"]["A"], data["kept"]["B"]
    assert kept_b["reranker"] == f"local:{model.name}"
    assert kept_b["rerank_ms"]["median"] is not None and kept_b["reranked"]["n"] == 12
    # Reranking the top 20 never loses what the top 20 held.
    assert kept_b["reranked"]["recall"]["20"]["k"] == 12
    assert kept_a["kept_answerable"]["n"] == kept_b["kept_answerable"]["n"] == 12
    text = report.read_text()
    assert "A = emb=" in text and "| kept_answerable |" in text and "reranked by" in text


def test_compare_wants_two_configurations(tmp_path: Path) -> None:
    once = _compare(tmp_path, BUNDLED)
    assert once.exit_code == 2 and "exactly twice" in once.output
    bad = _compare(tmp_path, BUNDLED, "model=x")
    assert bad.exit_code == 2 and "unknown part" in bad.output
    mixed = _compare(tmp_path, BUNDLED, BUNDLED, extra=("--strategies",))
    assert mixed.exit_code == 2 and "--compare runs alone" in mixed.output
