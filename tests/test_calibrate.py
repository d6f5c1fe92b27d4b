"""``kb calibrate``: the threshold rule, the sweep it reads, ``.env`` writing, the log source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.cli import main
from core.retrieve import Candidate
from evaluation.calibrate import (
    calibration_grid,
    from_rows,
    load_labelled_log,
    propose_threshold,
    write_env,
)
from evaluation.inputs import EvalSetError
from evaluation.results import SweepRow, sweep
from evaluation.stats import Proportion
from index.storage.store import Store
from tests.evalmini import EVALMINI, EVALSET_OPTIONS
from tests.query_factory import log_question


def _row(threshold: float, bluffs: int, n: int = 30) -> SweepRow:
    return SweepRow(threshold, Proportion(bluffs, n), Proportion(0, 10))


def test_largest_threshold_within_budget() -> None:
    rows = [_row(0.5, 0), _row(0.55, 1), _row(0.6, 3), _row(0.65, 4), _row(0.7, 9)]
    chosen = propose_threshold(rows, 0.10)
    assert chosen is not None and chosen.threshold == 0.6  # 3/30 is exactly the budget
    assert propose_threshold(list(reversed(rows)), 0.10) == chosen  # order does not matter
    assert propose_threshold(rows, 0.0).threshold == 0.5  # type: ignore[union-attr]
    assert propose_threshold(rows, 1.0).threshold == 0.7  # type: ignore[union-attr]
    assert propose_threshold([_row(0.5, 5)], 0.10) is None
    with pytest.raises(ValueError):
        propose_threshold(rows, 1.5)


def _cands(*distances: float, ids: tuple[int, ...] | None = None) -> list[Candidate]:
    ids = ids or tuple(range(100, 100 + len(distances)))
    return [
        Candidate(chunk_id=i, distance=d, score=1.0) for i, d in zip(ids, distances, strict=True)
    ]


def test_synthetic_sweep_and_proposal() -> None:
    # Four in-domain queries (their correct chunk is id 1) and five OOD questions.
    in_domain = [
        _cands(0.30, ids=(1,)),
        _cands(0.45, 0.50, ids=(2, 1)),
        _cands(0.62, ids=(1,)),
        _cands(0.40, 0.41, 0.42, 0.43, 0.44, ids=(2, 3, 4, 5, 1)),  # needle 5th: never kept
    ]
    ood = [_cands(0.52), _cands(0.58), _cands(0.66), _cands(0.80), _cands(0.95)]
    rows = sweep(in_domain, ood, [0.35, 0.5, 0.6, 0.7], top_k=4, correct=[{1}, {1}, {1}, {1}])
    assert [r.threshold for r in rows] == [0.35, 0.5, 0.6, 0.7]
    assert [r.bluffs.successes for r in rows] == [0, 0, 2, 3]
    assert [r.refused.successes for r in rows] == [3, 1, 1, 0]
    assert [r.answerable.successes for r in rows] == [1, 2, 2, 3]  # type: ignore[union-attr]
    assert [r.lost for r in rows] == [2, 1, 1, 0]
    cal = from_rows(rows, source="evalset", max_bluff_rate=0.2, current_threshold=0.6)
    assert cal.proposed is not None and cal.proposed.threshold == 0.5
    assert cal.current.threshold == 0.6
    assert cal.to_dict()["proposed_threshold"] == 0.5


def test_grid() -> None:
    grid = calibration_grid(0.025)
    assert grid[0] == 0.2 and grid[-1] == 1.0 and len(grid) == 33
    assert 0.675 in grid


def test_write_env_replaces_the_line_and_keeps_the_others(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text(
        "# Slack\nSLACK_BOT_TOKEN=xoxb-1\nKB_THRESHOLD=0.55\nKB_TOP_K=4\nexport KB_THRESHOLD=0.9\n"
    )
    write_env(env, 0.625)
    assert env.read_text() == "# Slack\nSLACK_BOT_TOKEN=xoxb-1\nKB_THRESHOLD=0.625\nKB_TOP_K=4\n"
    other = tmp_path / "other.env"
    other.write_text("KB_TOP_K=4")  # no final newline
    write_env(other, 0.6)
    assert other.read_text() == "KB_TOP_K=4\nKB_THRESHOLD=0.6\n"
    fresh = tmp_path / "fresh.env"
    write_env(fresh, 0.7)
    assert fresh.read_text() == "KB_THRESHOLD=0.7\n"


def test_calibrate_cli_writes_env(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("SLACK_APP_TOKEN=xapp-1\nKB_THRESHOLD=0.3\n")
    result = CliRunner().invoke(
        main,
        [
            "calibrate",
            *EVALSET_OPTIONS,
            "--max-bluff-rate",
            "0",
            "--write-env",
            str(env),
            "--json",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    proposed = data["proposed_threshold"]
    assert data["proposed"]["bluffs"]["k"] == 0
    # Largest within budget: the next threshold tried, if any, bluffs.
    later = [r for r in data["sweep"] if r["threshold"] > proposed]
    assert all(r["bluffs"]["k"] > 0 for r in later)
    lines = env.read_text().splitlines()
    assert lines[0] == "SLACK_APP_TOKEN=xapp-1"
    assert lines[1] == f"KB_THRESHOLD={proposed:g}"


def test_labelled_log(tmp_path: Path) -> None:
    store = Store(tmp_path / "kb-data")
    qid = log_question(store, "Who won the 1998 World Cup?")
    path = tmp_path / "labelled.jsonl"
    rows = [
        {"question": "How long does a VPN session stay open?", "in_domain": True},
        {"question": "What is the meal allowance?", "label": "in"},
        {"query_id": qid, "in_domain": False},
        {"question": "How do I bake bread?", "label": "todo"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    inside, outside = load_labelled_log(path, store)
    assert inside == ["How long does a VPN session stay open?", "What is the meal allowance?"]
    assert outside == ["Who won the 1998 World Cup?"]
    path.write_text(json.dumps({"question": "x", "in_domain": True}) + "\n")
    with pytest.raises(EvalSetError, match="both"):
        load_labelled_log(path, store)


def test_calibrate_from_log_against_the_running_kb(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb-data"
    runner = CliRunner()
    ingested = runner.invoke(
        main, ["--data-dir", str(data_dir), "ingest", str(EVALMINI / "corpus")]
    )
    assert ingested.exit_code == 0, ingested.output
    questions = [
        json.loads(line) for line in (EVALMINI / "questions.jsonl").read_text().splitlines()
    ]
    ood = [json.loads(line) for line in (EVALMINI / "ood.jsonl").read_text().splitlines()]
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text(
        "".join(
            json.dumps({"question": q["doc_phrasing"], "in_domain": True}) + "\n" for q in questions
        )
        + "".join(json.dumps({"question": o["question"], "in_domain": False}) + "\n" for o in ood)
    )
    result = runner.invoke(
        main,
        ["--data-dir", str(data_dir), "calibrate", "--from-log", str(labelled), "--json"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["source"] == "log"
    assert data["proposed"]["answerable"] is None  # no needles in a log
    assert data["proposed"]["refused"]["n"] == len(questions)
    assert data["proposed"]["bluffs"]["n"] == len(ood)
    assert data["proposed"]["bluffs"]["value"] <= 0.1
