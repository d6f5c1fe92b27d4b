"""Counting the work a call does, deterministically: its Python steps, never the wall time.

``steps(work)`` runs ``work()`` under a profiling hook and counts every call,
return and C call it makes (``sys.setprofile``, this thread only). The count
depends only on the input, so a test compares the work for ``n`` and ``4n``
units of a shape (``assert_linear``): about 4 times the steps is linear, 16
quadratic. Past its limit the call is stopped with ``TooManySteps``, so a
super-linear shape fails at once instead of running for minutes. Work done
inside one C call (a regular expression's backtracking, ``str.find``) is one
step: such shapes are checked by what they return or by their own counts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType

__all__ = ["TooManySteps", "assert_linear", "steps"]


class TooManySteps(AssertionError):
    """The call went past the step limit it was given."""


def steps(work: Callable[[], object], limit: int = 50_000_000) -> int:
    """How many calls, returns and C calls ``work()`` makes (at most ``limit``)."""
    count = 0

    def hook(frame: FrameType, event: str, arg: object) -> None:
        nonlocal count
        count += 1
        if count > limit:
            sys.setprofile(None)
            raise TooManySteps(f"more than {limit:,} steps")

    sys.setprofile(hook)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count


def assert_linear(work: Callable[[int], object], n: int, bound: float = 6.0) -> float:
    """Check that ``work(4 * n)`` takes at most ``bound`` times the steps of ``work(n)``.

    Returns the ratio; raises ``TooManySteps`` as soon as the larger call passes the bound.
    """
    small = steps(lambda: work(n))
    try:
        large = steps(lambda: work(4 * n), int(bound * small))
    except TooManySteps as exc:
        raise TooManySteps(
            f"{4 * n} units took more than {bound} times the {small:,} steps of {n}: "
            "the work grows faster than the input"
        ) from exc
    return large / small
