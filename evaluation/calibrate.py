"""``kb calibrate``: propose the refusal threshold for a bluff budget the admin chooses.

The threshold trades two failures: a *bluff* (an out-of-domain question gets
a confident, cited answer from unrelated passages) and a *lost answer* (an
in-domain question is refused). No value removes both when the distance
distributions overlap, so the admin picks the budget, the bluff rate they can
accept, and this module picks the **largest threshold whose out-of-domain bluff
rate is within that budget**: the largest, because every step down only refuses
more in-domain questions. It then shows what that choice costs.

Two sources of questions:

* an evaluation set (corpus + ``questions.jsonl`` + ``ood.jsonl``), indexed in a
  temporary data dir exactly as ``kb eval`` does; the cost includes the
  answerable questions kept, because every question has a needle;
* the knowledge base's own questions (``--from-log``): a JSON-lines file of
  logged questions labelled by an admin, one object per line with
  ``question`` (or ``query_id``, a row of the query log) and ``in_domain``
  (``true``/``false``; ``label: "in"/"out"`` is accepted too, and rows still
  labelled ``todo`` are skipped). They are searched against the running
  knowledge base. Without needles only refusals can be counted, not answers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.gate import CANDIDATES_PER_KEPT
from core.retrieve import Candidate, LocalBackend, Mode
from evaluation.inputs import EvalSetError, read_jsonl
from evaluation.results import EvalResult, SweepRow, sweep
from index.atomic import write_atomic
from index.knowledge_base import KnowledgeBase
from index.store import Store

THRESHOLD_ENV = "KB_THRESHOLD"


def calibration_grid(step: float = 0.025, low: float = 0.20, high: float = 1.00) -> list[float]:
    """Thresholds from ``low`` to ``high`` inclusive, every ``step``."""
    if step <= 0 or high < low:
        raise ValueError("need step > 0 and high >= low")
    count = int(round((high - low) / step)) + 1
    return [round(low + i * step, 4) for i in range(count)]


def propose_threshold(rows: Sequence[SweepRow], max_bluff_rate: float) -> SweepRow | None:
    """The row of the largest threshold whose bluff rate is at most ``max_bluff_rate``.

    Args:
        rows: a sweep (any order).
        max_bluff_rate: the budget, a fraction in ``[0, 1]``.

    Returns:
        That row, or ``None`` when even the smallest threshold bluffs too often.
    """
    if not 0.0 <= max_bluff_rate <= 1.0:
        raise ValueError(f"max_bluff_rate must be in [0, 1], got {max_bluff_rate}")
    # A tiny tolerance so that 3/30 meets a 0.1 budget despite binary floats.
    within = [r for r in rows if r.bluffs.value <= max_bluff_rate + 1e-12]
    return max(within, key=lambda r: r.threshold, default=None)


@dataclass
class Calibration:
    """A proposed threshold and what it costs, beside the current one.

    Attributes:
        source: ``evalset`` or ``log``.
        max_bluff_rate: the budget.
        current_threshold: the configured threshold.
        proposed: the chosen sweep row (``None``: no threshold meets the budget).
        current: the sweep row of the current threshold.
        sweep: every row tried.
    """

    source: str
    max_bluff_rate: float
    current_threshold: float
    proposed: SweepRow | None
    current: SweepRow
    sweep: list[SweepRow]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "source": self.source,
            "max_bluff_rate": self.max_bluff_rate,
            "current_threshold": self.current_threshold,
            "proposed_threshold": self.proposed.threshold if self.proposed else None,
            "proposed": self.proposed.to_dict() if self.proposed else None,
            "current": self.current.to_dict(),
            "sweep": [r.to_dict() for r in self.sweep],
        }


def _row_at(rows: Sequence[SweepRow], threshold: float) -> SweepRow:
    return min(rows, key=lambda r: abs(r.threshold - threshold))


def from_rows(
    rows: Sequence[SweepRow], *, source: str, max_bluff_rate: float, current_threshold: float
) -> Calibration:
    """Build a ``Calibration`` from a sweep that includes the current threshold."""
    ordered = sorted(rows, key=lambda r: r.threshold)
    return Calibration(
        source=source,
        max_bluff_rate=max_bluff_rate,
        current_threshold=current_threshold,
        proposed=propose_threshold(ordered, max_bluff_rate),
        current=_row_at(ordered, current_threshold),
        sweep=ordered,
    )


def from_evaluation(result: EvalResult, *, max_bluff_rate: float) -> Calibration:
    """Calibrate on the sweep of a ``kb eval`` run."""
    return from_rows(
        result.gate.sweep,
        source="evalset",
        max_bluff_rate=max_bluff_rate,
        current_threshold=result.gate.threshold,
    )


# ---------------------------------------------------------------------- from the log


def _label(no: int, path: Path, obj: dict[str, Any]) -> bool | None:
    if isinstance(obj.get("in_domain"), bool):
        return bool(obj["in_domain"])
    label = str(obj.get("label", "")).strip().lower()
    if label in {"in", "in_domain", "in-domain"}:
        return True
    if label in {"out", "ood", "out_of_domain", "out-of-domain"}:
        return False
    if label in {"todo", ""} and "in_domain" not in obj:
        return None
    raise EvalSetError(
        f'{path}:{no}: label it with "in_domain": true or false (or "label": "in"/"out").'
    )


def load_labelled_log(path: Path, store: Store | None = None) -> tuple[list[str], list[str]]:
    """Read labelled logged questions: ``(in-domain questions, out-of-domain questions)``.

    Args:
        path: JSON lines, each with ``question`` or ``query_id`` and a label.
        store: the query log, to resolve ``query_id`` rows.

    Raises:
        EvalSetError: a row has neither a question nor a known query id, or a bad label.
    """
    inside: list[str] = []
    outside: list[str] = []
    for no, obj in read_jsonl(path):
        in_domain = _label(no, path, obj)
        if in_domain is None:
            continue  # not labelled yet
        question = obj.get("question")
        if not (isinstance(question, str) and question.strip()):
            if obj.get("query_id") is None or store is None:
                raise EvalSetError(f'{path}:{no}: needs a "question" (or a "query_id").')
            question = store.query(int(obj["query_id"])).question
        (inside if in_domain else outside).append(question.strip())
    if not inside or not outside:
        raise EvalSetError(
            f"{path} needs both in-domain and out-of-domain questions "
            f"(found {len(inside)} and {len(outside)})."
        )
    return inside, outside


def from_log(
    kb: KnowledgeBase,
    in_domain: Sequence[str],
    out_of_domain: Sequence[str],
    *,
    top_k: int,
    current_threshold: float,
    max_bluff_rate: float,
    thresholds: Sequence[float],
) -> Calibration:
    """Calibrate on labelled logged questions searched against the running knowledge base."""
    backend = LocalBackend(kb.indexes)

    def candidates(question: str) -> list[Candidate]:
        vector = kb.embedder.encode_query(question)
        return backend.search(vector, question, None, top_k * CANDIDATES_PER_KEPT, Mode.HYBRID)

    rows = sweep(
        [candidates(q) for q in in_domain],
        [candidates(q) for q in out_of_domain],
        sorted(set(thresholds) | {round(current_threshold, 4)}),
        top_k=top_k,
    )
    return from_rows(
        rows, source="log", max_bluff_rate=max_bluff_rate, current_threshold=current_threshold
    )


# ---------------------------------------------------------------------- .env

_THRESHOLD_LINE = re.compile(rf"^\s*(?:export\s+)?{THRESHOLD_ENV}\s*=")


def format_threshold(value: float) -> str:
    """The threshold as written to ``.env`` (no float noise)."""
    return f"{round(value, 4):g}"


def write_env(path: Path, threshold: float) -> None:
    """Set ``KB_THRESHOLD`` in a ``.env`` file, keeping every other line as it was.

    An existing ``KB_THRESHOLD=`` line is replaced in place (a duplicate
    later one is dropped, so the file says one thing); otherwise the line is
    appended. The file is created if missing and replaced atomically.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    except OSError as exc:
        raise EvalSetError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    setting = f"{THRESHOLD_ENV}={format_threshold(threshold)}"
    out: list[str] = []
    done = False
    for line in lines:
        if _THRESHOLD_LINE.match(line):
            if not done:
                out.append(setting)
                done = True
            continue
        out.append(line)
    if not done:
        out.append(setting)
    text = "\n".join(out) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
