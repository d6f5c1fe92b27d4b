"""Small-sample statistics for the retrieval evaluation (``kb eval``).

Everything here is exact or closed-form and uses only the standard library:
the evaluation runs on every deploy, and scipy is not a declared dependency.

The conventions follow the study the evaluation reproduces:

- a *rank* is the 1-based position of the first returned chunk whose content
  contains the needle, or ``None`` when no returned chunk does;
- proportions are reported with a 95 % Wilson score interval (``Proportion``),
  which behaves at 0 and 1 and with a few dozen queries, where the normal
  approximation does not;
- two strategies answering the same queries are compared with an exact
  two-sided sign test on the discordant pairs, because an unpaired table of
  overlapping intervals cannot separate them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Z_95 = 1.959963984540054
"""The two-sided 95 % quantile of the standard normal distribution."""


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion.

    Args:
        successes: number of successes, ``0 <= successes <= n``.
        n: number of trials.
        z: the normal quantile; the default gives a 95 % interval.

    Returns:
        ``(low, high)`` within ``[0, 1]``. With ``n == 0`` nothing is known and
        the interval is ``(0.0, 1.0)``.

    Raises:
        ValueError: if the counts are negative or ``successes > n``.
    """
    if n < 0 or successes < 0 or successes > n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n)) / denom
    # At p = 0 (p = 1) the lower (upper) bound is exactly 0 (1) in theory;
    # floating-point rounding must neither leave it a hair off nor push any
    # bound outside [0, 1].
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


@dataclass(frozen=True)
class Proportion:
    """``successes / n`` with its 95 % Wilson interval."""

    successes: int
    n: int

    @property
    def value(self) -> float:
        """The point estimate (0 when ``n == 0``)."""
        return self.successes / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        """The 95 % Wilson score interval."""
        return wilson_interval(self.successes, self.n)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        low, high = self.interval
        return {"k": self.successes, "n": self.n, "value": self.value, "ci95": [low, high]}


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test on the discordant pairs of a paired comparison.

    Under the null hypothesis a discordant pair is equally likely to go
    either way, so the smaller count follows ``Binomial(wins + losses, 0.5)``;
    the p-value is ``min(1, 2 * P(X <= min(wins, losses)))``. Ties (queries
    both strategies got right, or both got wrong) carry no information and
    are not passed in.

    Args:
        wins: pairs where the first strategy succeeded and the second failed.
        losses: pairs where the second succeeded and the first failed.

    Returns:
        The two-sided p-value; ``1.0`` when there is no discordant pair.

    Raises:
        ValueError: if a count is negative.
    """
    if wins < 0 or losses < 0:
        raise ValueError(f"counts must be non-negative, got wins={wins}, losses={losses}")
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    # Integer arithmetic until the single final division: exact for any n,
    # and Python's int / int is correctly rounded even when 2**n is huge.
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_counts(a: Sequence[bool], b: Sequence[bool]) -> tuple[int, int]:
    """Count the discordant pairs of two strategies over the same queries.

    Args:
        a: per-query success of the first strategy.
        b: per-query success of the second strategy, in the same query order.

    Returns:
        ``(wins, losses)``: queries ``a`` got and ``b`` missed, and the reverse.

    Raises:
        ValueError: if the sequences have different lengths (they would not
            be paired).
    """
    if len(a) != len(b):
        raise ValueError(f"paired results need equal lengths, got {len(a)} and {len(b)}")
    wins = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
    losses = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
    return wins, losses


def _check_ranks(ranks: Sequence[int | None]) -> None:
    for r in ranks:
        if r is not None and r < 1:
            raise ValueError(f"ranks are 1-based positions or None, got {r}")


def hits_at_k(ranks: Sequence[int | None], k: int) -> list[bool]:
    """Per-query success at cut-off ``k`` (the input of :func:`paired_counts`).

    Args:
        ranks: per query, the 1-based rank of the first correct chunk, or ``None``.
        k: the cut-off, at least 1.

    Returns:
        One boolean per query: found within the first ``k`` results.

    Raises:
        ValueError: if ``k < 1`` or a rank is below 1.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    _check_ranks(ranks)
    return [r is not None and r <= k for r in ranks]


def recall_at_k(ranks: Sequence[int | None], k: int) -> float:
    """Fraction of queries whose first correct chunk is within the first ``k``.

    Args:
        ranks: per query, the 1-based rank of the first correct chunk, or ``None``.
        k: the cut-off, at least 1.

    Returns:
        Recall@k in ``[0, 1]``; ``0.0`` for no queries.

    Raises:
        ValueError: if ``k < 1`` or a rank is below 1.
    """
    hits = hits_at_k(ranks, k)
    return sum(hits) / len(hits) if hits else 0.0


def mrr(ranks: Sequence[int | None]) -> float:
    """Mean reciprocal rank; a query with no correct chunk contributes 0.

    Args:
        ranks: per query, the 1-based rank of the first correct chunk, or ``None``.

    Returns:
        MRR in ``[0, 1]``; ``0.0`` for no queries.

    Raises:
        ValueError: if a rank is below 1.
    """
    _check_ranks(ranks)
    if not ranks:
        return 0.0
    return sum(1.0 / r for r in ranks if r is not None) / len(ranks)
