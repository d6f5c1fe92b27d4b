"""The saved calibration (core.calibration): the record App Home reads, and `kb calibrate` saving it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.cli import main
from core.calibration import (
    CALIBRATION_KEY,
    CalibrationRecord,
    RateRow,
    last_calibration,
    save_calibration,
)
from index.storage.store import Store
from tests.evalmini import EVALMINI, EVALSET_OPTIONS

SAVED = "Saved this calibration to the knowledge base; App Home shows it."


def _row(threshold: float, bluffs: int = 1, refused: int = 2) -> RateRow:
    return RateRow(
        threshold=threshold,
        bluffs=bluffs,
        ood=30,
        bluff_interval=(0.01, 0.17),
        refused=refused,
        in_domain=60,
        refused_interval=(0.01, 0.11),
    )


RECORD = CalibrationRecord(
    at=1_800_000_000.5,
    source="set pip-black",
    max_bluff_rate=0.1,
    proposed_threshold=0.475,
    proposed_related=0.6,
    rows=(_row(0.45, 0, 5), _row(0.475, 1, 3), _row(0.5, 4, 1)),
)


def test_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path / "kb-data")
    assert last_calibration(store) is None
    save_calibration(store, RECORD)
    assert last_calibration(Store(tmp_path / "kb-data")) == RECORD
    newer = CalibrationRecord(2e9, "log labelled.jsonl", 0.05, None, None, (_row(0.3),))
    save_calibration(store, newer)
    assert last_calibration(store) == newer


def test_rates_at_the_nearest_measured_threshold() -> None:
    assert RECORD.rates_at(0.475) == _row(0.475, 1, 3)
    assert RECORD.rates_at(0.48) == _row(0.475, 1, 3)
    assert RECORD.rates_at(0.49) == _row(0.5, 4, 1)
    assert RECORD.rates_at(0.4375) == _row(0.45, 0, 5)  # exactly half a step away
    assert RECORD.rates_at(0.43) is None
    assert RECORD.rates_at(0.9) is None
    assert CalibrationRecord(0, "x", 0.1, None, None, ()).rates_at(0.5) is None
    row = RECORD.rates_at(0.5)
    assert row is not None and row.bluff_rate == pytest.approx(4 / 30)
    assert row.refused_rate == pytest.approx(1 / 60)


@pytest.mark.parametrize(
    "value",
    [
        "{not json",
        "[]",
        json.dumps({"at": 1.0}),
        RECORD.to_json().replace('"bluffs":1', '"bluffs":-1'),
        RECORD.to_json().replace('"source":"set pip-black"', '"source":7'),
        RECORD.to_json().replace('"at":1800000000.5', '"at":true'),
        RECORD.to_json().replace('"bluff_interval":[0.01,0.17]', '"bluff_interval":[0.01]', 1),
    ],
)
def test_a_record_that_does_not_parse_reads_as_none(
    tmp_path: Path, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(tmp_path / "kb-data")
    store.set_meta(CALIBRATION_KEY, value)
    with caplog.at_level(logging.WARNING, logger="core.calibration"):
        assert last_calibration(store) is None
    assert any("kb calibrate" in r.getMessage() for r in caplog.records)


def _calibrate(data_dir: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main,
        [
            "--data-dir",
            str(data_dir),
            "calibrate",
            *EVALSET_OPTIONS,
            "--step",
            "0.1",
            "--no-progress",
            *extra,
        ],
    )
    return result.exit_code, result.stdout


def test_kb_calibrate_saves_what_it_measured(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb-data"
    code, out = _calibrate(data_dir, "--json")
    assert code == 0, out
    printed = json.loads(out)  # --json prints the calibration alone
    record = last_calibration(Store(data_dir))
    assert record is not None
    assert (
        record.source
        == "corpus evalmini/corpus, questions evalmini/questions.jsonl, ood evalmini/ood.jsonl"
    )
    assert record.max_bluff_rate == printed["max_bluff_rate"]
    assert record.proposed_threshold == printed["proposed_threshold"]
    assert record.proposed_related == printed["proposed_related_threshold"]
    assert [r.threshold for r in record.rows] == [r["threshold"] for r in printed["sweep"]]
    for saved, row in zip(record.rows, printed["sweep"], strict=True):
        assert (saved.bluffs, saved.ood) == (row["bluffs"]["k"], row["bluffs"]["n"])
        assert (saved.refused, saved.in_domain) == (row["refused"]["k"], row["refused"]["n"])
        assert list(saved.bluff_interval) == row["bluffs"]["ci95"]
        assert list(saved.refused_interval) == row["refused"]["ci95"]
    assert record.rates_at(printed["current_threshold"]) is not None


def test_kb_calibrate_no_save_leaves_the_saved_one(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb-data"
    save_calibration(Store(data_dir), RECORD)
    code, out = _calibrate(data_dir, "--no-save")
    assert code == 0, out
    assert "proposed threshold" in out and SAVED not in out
    assert last_calibration(Store(data_dir)) == RECORD


def test_kb_calibrate_from_the_log_saves_into_that_knowledge_base(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb-data"
    runner = CliRunner()
    ingested = runner.invoke(
        main, ["--data-dir", str(data_dir), "ingest", str(EVALMINI / "corpus")]
    )
    assert ingested.exit_code == 0, ingested.output
    questions = (EVALMINI / "questions.jsonl").read_text().splitlines()
    ood = (EVALMINI / "ood.jsonl").read_text().splitlines()
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text(
        "".join(
            json.dumps({"question": json.loads(q)["doc_phrasing"], "in_domain": True}) + "\n"
            for q in questions
        )
        + "".join(
            json.dumps({"question": json.loads(o)["question"], "in_domain": False}) + "\n"
            for o in ood
        )
    )
    result = runner.invoke(
        main,
        ["--data-dir", str(data_dir), "calibrate", "--from-log", str(labelled), "--step", "0.1"],
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip().endswith(SAVED)
    record = last_calibration(Store(data_dir))
    assert record is not None and record.source == "log labelled.jsonl"
    assert {(r.ood, r.in_domain) for r in record.rows} == {(len(ood), len(questions))}
