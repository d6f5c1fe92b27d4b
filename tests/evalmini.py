"""The small evaluation set in ``tests/data/evalmini``: its folder, and the ``kb`` options naming it."""

from __future__ import annotations

from pathlib import Path

EVALMINI = Path(__file__).parent / "data" / "evalmini"
EVALSET_OPTIONS = [
    "--corpus",
    str(EVALMINI / "corpus"),
    "--questions",
    str(EVALMINI / "questions.jsonl"),
    "--ood",
    str(EVALMINI / "ood.jsonl"),
]
