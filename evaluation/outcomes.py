"""What the asker gets at the two thresholds: an answer, related passages, or a plain refusal.

Given each query's fused candidates (as ``Engine.ask`` fetches them) and the
chunks holding its needle, this module replays the engine's decision without
calling a model:

* **answered**: something passed the answer threshold (the model would be called);
* **related**: nothing passed it, but candidates within the related threshold
  are shown as possibly related (``core.gate.related``);
* **hard refused**: neither; the plain "nothing on this";
* **shown**: the needle reached the asker, among the kept passages of an
  answer, the passages shown beside it (``core.gate.beside_answer``) or the related
  passages;
* **beside**: an answer whose needle only the passages beside it showed;
* **rescued**: a related outcome that showed the needle (a question the answer
  threshold alone would have refused);
* for out-of-domain questions, **bluffs** (something passed) and
  **related shown** (passages shown for a question the documents do not answer).

It also measures the adaptive number of kept passages against a fixed
``top_k`` (needle kept, passages and characters given to the model), and
sweeps the related threshold, which ``kb calibrate`` uses to propose it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.gate import beside_answer, gate, related
from core.retrieve import Candidate
from evaluation.stats import Proportion

__all__ = [
    "DEFAULT_MAX_HARD_REFUSED",
    "DEFAULT_MAX_OOD_SHOWN",
    "Outcomes",
    "RelatedRow",
    "Replay",
    "propose_related",
    "related_sweep",
]

# The related threshold `kb calibrate` proposes: the smallest refusing at most
# this share of in-domain questions outright...
DEFAULT_MAX_HARD_REFUSED = 0.05
# ...unless past this share of out-of-domain questions would be shown something
# (an answer or passages): then related passages stop being a pointer and become noise.
DEFAULT_MAX_OOD_SHOWN = 0.5


@dataclass(frozen=True)
class Replay:
    """Every query's candidates and the gate's settings, to replay ``Engine.ask``'s decision.

    Attributes:
        in_domain: per in-domain query, its fused candidates, best first.
        ood: per out-of-domain question, its fused candidates.
        correct: per in-domain query, the chunk ids holding its needle
            (``None``: no needles, as for a labelled query log).
        sizes: characters of each candidate chunk's content (the prompt's size).
        top_k: passages always kept when they pass.
        max_kept: most passages kept when more are as close as the best.
        margin: how close to the best those must be.
        kept_order: per in-domain query, the order an answer keeps its passages
            in when it differs from the fused one (``core.retrieve.answer_order``
            once the gate has passed, and the related passages' order when it
            has not); ``None``: fused order. Whether a query is answered, or
            shown related passages, does not depend on it.
    """

    in_domain: Sequence[Sequence[Candidate]]
    ood: Sequence[Sequence[Candidate]]
    correct: Sequence[set[int]] | None
    sizes: Mapping[int, int]
    top_k: int
    max_kept: int
    margin: float
    kept_order: Sequence[Sequence[Candidate]] | None = None

    def kept(
        self, cands: Sequence[Candidate], threshold: float, related_threshold: float = 0.0
    ) -> list[Candidate]:
        """The passages an answer is written from at the two thresholds."""
        return gate(
            cands,
            threshold=threshold,
            top_k=self.top_k,
            max_kept=self.max_kept,
            margin=self.margin,
            related_threshold=related_threshold,
        )

    def fixed(
        self, cands: Sequence[Candidate], threshold: float, related_threshold: float = 0.0
    ) -> list[Candidate]:
        """The passages a fixed ``top_k`` would keep (before the adaptive number)."""
        return gate(
            cands, threshold=threshold, top_k=self.top_k, related_threshold=related_threshold
        )

    def beside_answer(
        self,
        cands: Sequence[Candidate],
        kept: Sequence[Candidate],
        threshold: float,
        related_threshold: float,
    ) -> list[Candidate]:
        """The passages shown beside an answer, from the candidates in the order it keeps them."""
        return beside_answer(
            cands,
            kept,
            threshold=threshold,
            related_threshold=related_threshold,
            within=self.top_k,
        )

    def holds_needle(self, i: int, cands: Sequence[Candidate]) -> bool:
        """Whether in-domain query ``i``'s needle is in one of ``cands``."""
        return self.correct is not None and any(c.chunk_id in self.correct[i] for c in cands)

    def outcomes(self, threshold: float, related_threshold: float) -> Outcomes:
        """Every query's outcome at the two thresholds."""
        ans: list[bool] = []
        rel: list[bool] = []
        shown: list[bool] = []
        shown_beside: list[bool] = []
        kept_needle: list[bool] = []
        fixed_needle: list[bool] = []
        kept_n: list[int] = []
        beside_n: list[int] = []
        fixed_n: list[int] = []
        kept_chars: list[int] = []
        fixed_chars: list[int] = []
        for i, cands in enumerate(self.in_domain):
            ordered = self.kept_order[i] if self.kept_order is not None else cands
            kept = self.kept(ordered, threshold, related_threshold)
            fixed = self.fixed(ordered, threshold, related_threshold)
            near = [] if kept else related(ordered, related_threshold=related_threshold)
            also = self.beside_answer(ordered, kept, threshold, related_threshold) if kept else []
            ans.append(bool(kept))
            rel.append(bool(near))
            kept_needle.append(self.holds_needle(i, kept))
            fixed_needle.append(self.holds_needle(i, fixed))
            shown_beside.append(not kept_needle[-1] and self.holds_needle(i, also))
            shown.append(self.holds_needle(i, [*kept, *also, *near]))
            if kept:
                kept_n.append(len(kept))
                beside_n.append(len(also))
                fixed_n.append(len(fixed))
                kept_chars.append(sum(self.sizes.get(c.chunk_id, 0) for c in kept))
                fixed_chars.append(sum(self.sizes.get(c.chunk_id, 0) for c in fixed))
        bluffs = [bool(self.kept(c, threshold)) for c in self.ood]
        ood_related = [
            not b and bool(related(c, related_threshold=related_threshold))
            for b, c in zip(bluffs, self.ood, strict=True)
        ]
        return Outcomes(
            threshold=threshold,
            related_threshold=related_threshold,
            needles=self.correct is not None,
            answered=ans,
            related=rel,
            shown=shown,
            shown_beside=shown_beside,
            kept_needle=kept_needle,
            fixed_needle=fixed_needle,
            kept_passages=kept_n,
            beside_passages=beside_n,
            fixed_passages=fixed_n,
            kept_chars=kept_chars,
            fixed_chars=fixed_chars,
            bluffs=bluffs,
            ood_related=ood_related,
        )


@dataclass
class Outcomes:
    """Per query, what the asker gets at one answer threshold and one related threshold.

    In-domain lists are in query order, out-of-domain lists in question order;
    ``kept_*``/``fixed_*`` sizes are per answered query.
    """

    threshold: float
    related_threshold: float
    needles: bool
    answered: list[bool]
    related: list[bool]
    shown: list[bool]
    shown_beside: list[bool]
    kept_needle: list[bool]
    fixed_needle: list[bool]
    kept_passages: list[int]
    beside_passages: list[int]
    fixed_passages: list[int]
    kept_chars: list[int]
    fixed_chars: list[int]
    bluffs: list[bool]
    ood_related: list[bool]

    @property
    def hard_refused(self) -> list[bool]:
        """In-domain queries that get the plain refusal."""
        return [not a and not r for a, r in zip(self.answered, self.related, strict=True)]

    @property
    def rescued(self) -> list[bool]:
        """In-domain queries whose needle only the related passages showed."""
        return [r and s for r, s in zip(self.related, self.shown, strict=True)]

    def per_query(self) -> dict[str, dict[str, list[bool]]]:
        """Per-query outcomes, for a paired comparison of two runs (``kb eval --baseline``)."""
        in_domain = {
            "answered": self.answered,
            "related": self.related,
            "hard_refused": self.hard_refused,
        }
        if self.needles:
            in_domain |= {
                "shown": self.shown,
                "rescued": self.rescued,
                "beside": self.shown_beside,
                # What a fixed top_k would have kept: the adaptive number's baseline.
                "kept_fixed_top_k": self.fixed_needle,
            }
        return {
            "in_domain": in_domain,
            "ood": {"bluffs": self.bluffs, "ood_related": self.ood_related},
        }

    def current(self) -> dict[str, dict[str, Any]]:
        """Each per-query outcome as a proportion with its interval."""
        return {
            name: Proportion(sum(values), len(values)).to_dict()
            for group in self.per_query().values()
            for name, values in group.items()
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the proportions and what the adaptive number of passages costs."""
        return {
            "threshold": self.threshold,
            "related_threshold": self.related_threshold,
            **self.current(),
            "kept": {
                "needle_kept": Proportion(sum(self.kept_needle), len(self.kept_needle)).to_dict(),
                "needle_kept_fixed_top_k": Proportion(
                    sum(self.fixed_needle), len(self.fixed_needle)
                ).to_dict(),
                "mean_passages": _mean(self.kept_passages),
                "mean_passages_fixed_top_k": _mean(self.fixed_passages),
                "mean_beside": _mean(self.beside_passages),
                "answers_with_beside": sum(1 for n in self.beside_passages if n),
                "mean_chars": _mean(self.kept_chars),
                "mean_chars_fixed_top_k": _mean(self.fixed_chars),
            },
        }


def _mean(values: Sequence[int]) -> float:
    return float(np.mean(values)) if values else 0.0


@dataclass(frozen=True)
class RelatedRow:
    """What one related threshold gives, at a fixed answer threshold."""

    related_threshold: float
    related: Proportion
    hard_refused: Proportion
    rescued: Proportion | None
    shown: Proportion | None
    ood_related: Proportion
    ood_shown: Proportion  # out-of-domain questions shown anything: a bluff or passages

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "related_threshold": self.related_threshold,
            "related": self.related.to_dict(),
            "hard_refused": self.hard_refused.to_dict(),
            "rescued": self.rescued.to_dict() if self.rescued else None,
            "shown": self.shown.to_dict() if self.shown else None,
            "ood_related": self.ood_related.to_dict(),
            "ood_shown": self.ood_shown.to_dict(),
        }


def related_sweep(
    replay: Replay, threshold: float, related_thresholds: Sequence[float]
) -> list[RelatedRow]:
    """One row per related threshold at or above ``threshold`` (below it, related is off)."""
    rows = []
    for r in sorted({t for t in related_thresholds if t >= threshold - 1e-9} | {threshold}):
        o = replay.outcomes(threshold, r)

        def share(values: list[bool]) -> Proportion:
            return Proportion(sum(values), len(values))

        ood_shown = [b or x for b, x in zip(o.bluffs, o.ood_related, strict=True)]
        rows.append(
            RelatedRow(
                related_threshold=r,
                related=share(o.related),
                hard_refused=share(o.hard_refused),
                rescued=share(o.rescued) if o.needles else None,
                shown=share(o.shown) if o.needles else None,
                ood_related=share(o.ood_related),
                ood_shown=share(ood_shown),
            )
        )
    return rows


def propose_related(
    rows: Sequence[RelatedRow],
    *,
    max_hard_refused: float = DEFAULT_MAX_HARD_REFUSED,
    max_ood_shown: float = DEFAULT_MAX_OOD_SHOWN,
) -> RelatedRow | None:
    """The related threshold to propose from a sweep at the answer threshold.

    The smallest one refusing at most ``max_hard_refused`` of in-domain
    questions outright; if that would show something to more than
    ``max_ood_shown`` of out-of-domain questions (or none refuses that little),
    the largest one within that cap. ``None`` when even the answer threshold
    alone shows out-of-domain questions more than the cap.
    """
    ordered = sorted(rows, key=lambda r: r.related_threshold)
    capped = [r for r in ordered if r.ood_shown.value <= max_ood_shown + 1e-12]
    enough = [r for r in capped if r.hard_refused.value <= max_hard_refused + 1e-12]
    if enough:
        return enough[0]
    return capped[-1] if capped else None
