"""``kb calibrate``: propose the refusal threshold for a bluff budget the admin chooses.

The threshold trades two failures: a *bluff* (an out-of-domain question gets
a confident, cited answer from unrelated passages) and a *lost answer* (an
in-domain question is refused). No value removes both when the distance
distributions overlap, so the admin picks the budget, the bluff rate they can
accept, and this module picks the **largest threshold whose out-of-domain bluff
rate is within that budget**: the largest, because every step down only refuses
more in-domain questions. It then shows what that choice costs.

It proposes the **related threshold** beside it, at the proposed answer
threshold (``evaluation.outcomes.propose_related``): the smallest one that
refuses at most 5 % of in-domain questions outright, unless that would show
something (an answer or passages) to more than half of the out-of-domain
questions; then the largest one within that cap. Between the two thresholds the
bot shows possibly related passages without calling the model.

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

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.calibration import CalibrationRecord, RateRow
from core.gate import CANDIDATES_PER_KEPT
from core.retrieve import Candidate, Mode
from core.selection import retrieval_query
from evaluation.inputs import EvalSetError, read_jsonl
from evaluation.outcomes import (
    DEFAULT_MAX_HARD_REFUSED,
    DEFAULT_MAX_OOD_SHOWN,
    RelatedRow,
    Replay,
    propose_related,
    related_sweep,
)
from evaluation.results import EvalResult, SweepRow, sweep
from index.files import write_atomic
from index.knowledge_base import KnowledgeBase
from index.storage import Store

THRESHOLD_ENV = "KB_THRESHOLD"
RELATED_ENV = "KB_RELATED_THRESHOLD"
MODEL_ENV = "KB_THRESHOLD_MODEL"


def calibration_grid(step: float = 0.025, low: float = 0.20, high: float = 1.00) -> list[float]:
    """Thresholds from ``low`` to ``high`` inclusive, every ``step``."""
    if step <= 0 or high < low:
        raise ValueError("need step > 0 and high >= low")
    count = int(round((high - low) / step)) + 1
    return [round(low + i * step, 4) for i in range(count)]


# A model whose distances crowd below this (multilingual-e5: 0.1-0.2) is swept
# on a finer grid of its own: 0.025 steps would jump from nothing to everything.
CROWDED_BELOW = 0.3


def calibration_grid_for(current: float, step: float = 0.025) -> list[float]:
    """``calibration_grid(step)``, or for a model whose thresholds sit below
    ``CROWDED_BELOW`` (``current`` is the one in force), 0.05 to 0.40 at a fifth of ``step``."""
    if current >= CROWDED_BELOW:
        return calibration_grid(step)
    return calibration_grid(step / 5, low=0.05, high=0.40)


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
        related: the proposed related threshold's row, at the proposed threshold
            (``None``: no threshold proposed, or no candidates to replay).
        related_sweep: the related thresholds tried at the proposed threshold.
    """

    source: str
    max_bluff_rate: float
    current_threshold: float
    proposed: SweepRow | None
    current: SweepRow
    sweep: list[SweepRow]
    related: RelatedRow | None = None
    related_sweep: list[RelatedRow] = field(default_factory=list)

    @property
    def proposed_related(self) -> float | None:
        """The proposed related threshold."""
        return self.related.related_threshold if self.related else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "source": self.source,
            "max_bluff_rate": self.max_bluff_rate,
            "current_threshold": self.current_threshold,
            "proposed_threshold": self.proposed.threshold if self.proposed else None,
            "proposed_related_threshold": self.proposed_related,
            "related_rule": (
                f"smallest related threshold with in-domain hard refusals <= "
                f"{DEFAULT_MAX_HARD_REFUSED:.0%}, showing out-of-domain questions "
                f"anything <= {DEFAULT_MAX_OOD_SHOWN:.0%}"
            ),
            "proposed": self.proposed.to_dict() if self.proposed else None,
            "proposed_related": self.related.to_dict() if self.related else None,
            "current": self.current.to_dict(),
            "sweep": [r.to_dict() for r in self.sweep],
            "related_sweep": [r.to_dict() for r in self.related_sweep],
        }


def to_record(result: Calibration, *, source: str, at: float) -> CalibrationRecord:
    """What App Home shows of ``result`` (``core.calibration``): the whole sweep, as counts.

    Args:
        result: the calibration.
        source: what it measured, for a person (``set pip-black``, ``log labelled.jsonl``).
        at: when it ran (Unix time).
    """
    return CalibrationRecord(
        at=at,
        source=source,
        max_bluff_rate=result.max_bluff_rate,
        proposed_threshold=result.proposed.threshold if result.proposed else None,
        proposed_related=result.proposed_related,
        rows=tuple(_rate_row(r) for r in result.sweep),
    )


def _rate_row(row: SweepRow) -> RateRow:
    return RateRow(
        threshold=row.threshold,
        bluffs=row.bluffs.successes,
        ood=row.bluffs.n,
        bluff_interval=row.bluffs.interval,
        refused=row.refused.successes,
        in_domain=row.refused.n,
        refused_interval=row.refused.interval,
    )


def _row_at(rows: Sequence[SweepRow], threshold: float) -> SweepRow:
    return min(rows, key=lambda r: abs(r.threshold - threshold))


def from_rows(
    rows: Sequence[SweepRow],
    *,
    source: str,
    max_bluff_rate: float,
    current_threshold: float,
    replay: Replay | None = None,
) -> Calibration:
    """Build a ``Calibration`` from a sweep that includes the current threshold.

    With ``replay`` (the candidates behind the sweep) the related threshold is
    proposed too, at the proposed threshold, over the sweep's thresholds.
    """
    ordered = sorted(rows, key=lambda r: r.threshold)
    proposed = propose_threshold(ordered, max_bluff_rate)
    related: list[RelatedRow] = []
    if proposed is not None and replay is not None:
        related = related_sweep(replay, proposed.threshold, [r.threshold for r in ordered])
    return Calibration(
        source=source,
        max_bluff_rate=max_bluff_rate,
        current_threshold=current_threshold,
        proposed=proposed,
        current=_row_at(ordered, current_threshold),
        sweep=ordered,
        related=propose_related(related) if related else None,
        related_sweep=related,
    )


def from_evaluation(result: EvalResult, *, max_bluff_rate: float) -> Calibration:
    """Calibrate on the sweep of a ``kb eval`` run."""
    return from_rows(
        result.gate.sweep,
        source="evalset",
        max_bluff_rate=max_bluff_rate,
        current_threshold=result.gate.threshold,
        replay=result.gate.replay,
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
            question = store.queries.get(int(obj["query_id"])).question
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
    backend = kb.search_index

    def candidates(asked: str) -> list[Candidate]:
        question = retrieval_query(asked)  # as the question was searched when it was asked
        vector = kb.embedder.encode_query(question)
        return backend.search(vector, question, None, top_k * CANDIDATES_PER_KEPT, Mode.HYBRID)

    inside = [candidates(q) for q in in_domain]
    outside = [candidates(q) for q in out_of_domain]
    rows = sweep(
        inside, outside, sorted(set(thresholds) | {round(current_threshold, 4)}), top_k=top_k
    )
    # No needles: refusals and related outcomes are counted, not what they showed.
    replay = Replay(inside, outside, None, {}, top_k=top_k, max_kept=top_k, margin=0.0)
    return from_rows(
        rows,
        source="log",
        max_bluff_rate=max_bluff_rate,
        current_threshold=current_threshold,
        replay=replay,
    )


# ---------------------------------------------------------------------- .env


def format_threshold(value: float) -> str:
    """The threshold as written to ``.env`` (no float noise)."""
    return f"{round(value, 4):g}"


def write_env(
    path: Path, threshold: float, related_threshold: float | None = None, model: str = ""
) -> None:
    """Set ``KB_THRESHOLD`` (and ``KB_RELATED_THRESHOLD``, and ``KB_THRESHOLD_MODEL``: the
    model they were measured with) in a ``.env`` file, keeping every other line.

    An existing line of each is replaced in place (a duplicate later one is
    dropped, so the file says one thing); otherwise the line is appended. The
    file is created if missing and replaced atomically.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    except OSError as exc:
        raise EvalSetError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    values = {THRESHOLD_ENV: threshold}
    if related_threshold is not None:
        values[RELATED_ENV] = related_threshold
    for name, value in values.items():
        lines = _set_line(lines, name, f"{name}={format_threshold(value)}")
    if model:
        lines = _set_line(lines, MODEL_ENV, f"{MODEL_ENV}={json.dumps(model)}")
    text = "\n".join(lines) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _set_line(lines: list[str], name: str, setting: str) -> list[str]:
    pattern = re.compile(rf"^\s*(?:export\s+)?{name}\s*=")
    out: list[str] = []
    done = False
    for line in lines:
        if pattern.match(line):
            if not done:
                out.append(setting)
                done = True
            continue
        out.append(line)
    if not done:
        out.append(setting)
    return out
