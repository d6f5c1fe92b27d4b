"""The calibration in force: what the last ``kb calibrate`` measured, kept in the knowledge base.

``kb calibrate`` saves a ``CalibrationRecord`` in the store's ``meta`` table
(one JSON value under ``CALIBRATION_KEY``) after every run, so App Home can
show an admin the threshold in use beside the bluff and refusal rates it was
measured to cost. The record is plain numbers: reading it needs nothing of
``evaluation`` (which builds it), and a value that does not parse (written by
another version, or damaged) reads as no calibration, with a warning, never as
an error in the view that asked.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

from index.storage import Store

__all__ = [
    "CALIBRATION_KEY",
    "NEAREST",
    "CalibrationRecord",
    "RateRow",
    "last_calibration",
    "save_calibration",
]

log = logging.getLogger(__name__)

CALIBRATION_KEY = "calibration"

NEAREST = 0.0125
"""How far from a measured threshold ``rates_at`` still reports that row: half
the default sweep step, so a threshold between two rows reports the nearer."""


@dataclass(frozen=True)
class RateRow:
    """What one threshold was measured to cost.

    Attributes:
        threshold: the cosine-distance cut.
        bluffs: out-of-domain questions that would get an answer, of ``ood``.
        bluff_interval: the 95 % Wilson interval of ``bluffs / ood``.
        refused: in-domain questions that would be refused, of ``in_domain``.
        refused_interval: the 95 % Wilson interval of ``refused / in_domain``.
    """

    threshold: float
    bluffs: int
    ood: int
    bluff_interval: tuple[float, float]
    refused: int
    in_domain: int
    refused_interval: tuple[float, float]

    @property
    def bluff_rate(self) -> float:
        """``bluffs / ood`` (0 when nothing was measured)."""
        return self.bluffs / self.ood if self.ood else 0.0

    @property
    def refused_rate(self) -> float:
        """``refused / in_domain`` (0 when nothing was measured)."""
        return self.refused / self.in_domain if self.in_domain else 0.0


@dataclass(frozen=True)
class CalibrationRecord:
    """One ``kb calibrate`` run, as App Home shows it.

    Attributes:
        at: when it ran (Unix time).
        source: what it measured, for a person: ``set pip-black``, ``corpus NAME``, ``log FILE``.
        max_bluff_rate: the budget it was given.
        proposed_threshold: the largest threshold within the budget (``None``: none was).
        proposed_related: the related threshold proposed beside it.
        rows: the whole sweep, by threshold.
    """

    at: float
    source: str
    max_bluff_rate: float
    proposed_threshold: float | None
    proposed_related: float | None
    rows: tuple[RateRow, ...]

    def rates_at(self, threshold: float) -> RateRow | None:
        """The row of the measured threshold nearest ``threshold``, if within ``NEAREST``."""
        best = min(self.rows, key=lambda r: abs(r.threshold - threshold), default=None)
        if best is None or abs(best.threshold - threshold) > NEAREST + 1e-9:
            return None
        return best

    def to_json(self) -> str:
        """The record as stored."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> CalibrationRecord:
        """The record stored as ``text``; ``ValueError`` when it is not one."""
        try:
            data = json.loads(text)
            return cls(
                at=_number(data["at"]),
                source=_text(data["source"]),
                max_bluff_rate=_number(data["max_bluff_rate"]),
                proposed_threshold=_optional_number(data["proposed_threshold"]),
                proposed_related=_optional_number(data["proposed_related"]),
                rows=tuple(sorted((_rate_row(r) for r in data["rows"]), key=lambda r: r.threshold)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a calibration record: {exc}") from exc


def save_calibration(store: Store, record: CalibrationRecord) -> None:
    """Make ``record`` the calibration App Home shows (it replaces the previous one)."""
    store.set_meta(CALIBRATION_KEY, record.to_json())


def last_calibration(store: Store) -> CalibrationRecord | None:
    """The calibration saved last; ``None`` when there is none or it does not parse."""
    text = store.get_meta(CALIBRATION_KEY)
    if text is None:
        return None
    try:
        return CalibrationRecord.from_json(text)
    except ValueError as exc:
        log.warning("saved calibration ignored (run kb calibrate again): %.200s", exc)
        return None


# ---------------------------------------------------------------------- parsing


def _rate_row(data: Any) -> RateRow:
    if not isinstance(data, dict):
        raise TypeError("a sweep row is not an object")
    return RateRow(
        threshold=_number(data["threshold"]),
        bluffs=_count(data["bluffs"]),
        ood=_count(data["ood"]),
        bluff_interval=_interval(data["bluff_interval"]),
        refused=_count(data["refused"]),
        in_domain=_count(data["in_domain"]),
        refused_interval=_interval(data["refused_interval"]),
    )


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _optional_number(value: Any) -> float | None:
    return None if value is None else _number(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"expected a count, got {value!r}")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {value!r}")
    return value


def _interval(value: Any) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise TypeError(f"expected an interval, got {value!r}")
    low, high = _number(value[0]), _number(value[1])
    return (low, high)
