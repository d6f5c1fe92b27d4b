"""The gate's thresholds in force, and the model they were calibrated for.

A cosine distance means something only for the model that made it: MiniLM's
unrelated passages sit beyond 0.5, while multilingual-e5's related and
unrelated passages both crowd into 0.1-0.2. So each bundled model ships its own
calibrated pair (``BUNDLED``, from ``kb calibrate`` on the bundled sets,
docs/evaluation.md), and the thresholds in force are, in order:

1. ``KB_THRESHOLD`` / ``KB_RELATED_THRESHOLD`` when the operator set them, for
   the model ``KB_THRESHOLD_MODEL`` names (``kb calibrate --write-env`` writes
   all three). Set for another model than the running one, they are **not**
   used: the running model's bundled pair is, and the origin says why.
2. The running model's bundled pair.
3. MiniLM's pair, marked uncalibrated, for a model nobody calibrated:
   ``kb status``, App Home and ``/readyz`` say to run ``kb calibrate``.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.config import DEFAULT_RELATED_THRESHOLD, DEFAULT_THRESHOLD
from index.embed import MULTILINGUAL_MODEL_NAME

__all__ = ["BUNDLED", "MINILM", "Thresholds", "thresholds_in_force"]

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Thresholds:
    """The gate's two thresholds and where they come from.

    Attributes:
        answer: the answer threshold (cosine distance).
        related: the looser "possibly related" threshold.
        model: the model they were calibrated for ("" when nobody calibrated them).
        origin: for a person: ``KB_THRESHOLD``, ``bundled calibration``, or why not.
        calibrated: whether they were calibrated for the running model.
    """

    answer: float
    related: float
    model: str
    origin: str
    calibrated: bool


# model name -> (answer, related). Each from `kb calibrate` on the bundled sets
# with that model (docs/evaluation.md, "Thresholds per model").
BUNDLED: dict[str, tuple[float, float]] = {
    MINILM: (DEFAULT_THRESHOLD, DEFAULT_RELATED_THRESHOLD),
    MULTILINGUAL_MODEL_NAME: (0.10, 0.165),
}


def thresholds_in_force(
    model: str,
    *,
    threshold: float | None = None,
    related: float | None = None,
    calibrated_for: str = "",
) -> Thresholds:
    """The thresholds the gate uses with ``model`` (a name as ``index.embed.model_name`` gives it).

    Args:
        model: the running embedding model.
        threshold: ``KB_THRESHOLD`` if set.
        related: ``KB_RELATED_THRESHOLD`` if set.
        calibrated_for: ``KB_THRESHOLD_MODEL``: the model the operator's values
            were calibrated for ("" when not said).
    """
    bundled = BUNDLED.get(model)
    operator_set = threshold is not None or related is not None
    if operator_set and (not calibrated_for or calibrated_for == model):
        base = bundled or BUNDLED[MINILM]
        return Thresholds(
            answer=base[0] if threshold is None else threshold,
            related=base[1] if related is None else related,
            model=calibrated_for,
            origin="KB_THRESHOLD" if calibrated_for else "KB_THRESHOLD (model not recorded)",
            calibrated=bool(calibrated_for),
        )
    ignored = (
        f"; KB_THRESHOLD was calibrated for {calibrated_for}, not this model, and is not used"
        if operator_set
        else ""
    )
    if bundled is not None:
        return Thresholds(bundled[0], bundled[1], model, "bundled calibration" + ignored, True)
    answer, near = BUNDLED[MINILM]
    return Thresholds(
        answer,
        near,
        "",
        f"not calibrated for this model: run `kb calibrate`{ignored}",
        False,
    )
