"""Statistics of the retrieval evaluation: Wilson intervals, the sign test, recall, MRR."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from evaluation.stats import (
    hits_at_k,
    mrr,
    paired_counts,
    recall_at_k,
    sign_test,
    wilson_interval,
)

# (wins, losses, p-value as printed in the study the evaluation reproduces)
STUDY_SIGN_TESTS = [
    (18, 3, 0.0015),  # E vs A at R@20
    (12, 2, 0.0129),  # E vs C at R@20
    (8, 6, 0.79),  # B vs A at R@8
    (9, 7, 0.80),  # B vs A at R@20
    (10, 3, 0.09),  # hybrid vs BM25 at R@4
    (10, 6, 0.45),  # hybrid vs dense at R@4
]


@pytest.mark.parametrize(("wins", "losses", "expected"), STUDY_SIGN_TESTS)
def test_sign_test_reproduces_the_study(wins: int, losses: int, expected: float) -> None:
    decimals = len(str(expected).split(".")[1])
    assert round(sign_test(wins, losses), decimals) == expected


def test_sign_test_exact_small_cases() -> None:
    assert sign_test(0, 0) == 1.0
    assert sign_test(1, 0) == 1.0  # 2 * P(X <= 0) = 2 * 0.5
    assert sign_test(5, 0) == pytest.approx(2 / 32)
    assert sign_test(3, 3) == 1.0  # capped: the two tails overlap at the centre


def test_sign_test_handles_large_counts() -> None:
    # 2**n overflows a float long before n = 3000; the integer path must not.
    p = sign_test(1600, 1400)
    assert 0.0 < p < 0.001
    assert sign_test(1500, 1500) == 1.0


def test_sign_test_rejects_negative_counts() -> None:
    with pytest.raises(ValueError):
        sign_test(-1, 3)


@given(st.integers(0, 200), st.integers(0, 200))
def test_sign_test_is_symmetric_and_a_probability(wins: int, losses: int) -> None:
    p = sign_test(wins, losses)
    assert 0.0 < p <= 1.0
    assert p == sign_test(losses, wins)


@given(st.integers(0, 100), st.integers(0, 100))
def test_sign_test_more_imbalance_is_more_significant(wins: int, losses: int) -> None:
    if wins >= losses:
        assert sign_test(wins + 1, losses) <= sign_test(wins, losses)


def test_sign_test_agrees_with_scipy() -> None:
    scipy_stats = pytest.importorskip("scipy.stats")
    for wins, losses in [(18, 3), (12, 2), (8, 6), (9, 7), (10, 3), (10, 6), (0, 7), (40, 25)]:
        expected = scipy_stats.binomtest(wins, wins + losses, 0.5).pvalue
        assert sign_test(wins, losses) == pytest.approx(expected, rel=1e-9)


def test_wilson_half_width_at_one_half_with_64_queries() -> None:
    # The study: "at 64 queries, a recall of 0.5 carries a 95% Wilson interval of about +-0.12".
    low, high = wilson_interval(32, 64)
    assert low + high == pytest.approx(1.0)
    assert (high - low) / 2 == pytest.approx(0.12, abs=0.002)


@pytest.mark.parametrize(
    ("successes", "expected"),
    [(38, (0.471, 0.705)), (53, (0.718, 0.901))],  # the study's R@20 intervals for A and E
)
def test_wilson_reproduces_the_study(successes: int, expected: tuple[float, float]) -> None:
    low, high = wilson_interval(successes, 64)
    assert (round(low, 3), round(high, 3)) == expected


def test_wilson_edges() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and 0.0 < high < 0.35
    low, high = wilson_interval(10, 10)
    assert high == 1.0 and 0.65 < low < 1.0
    for bad in [(-1, 5), (6, 5), (0, -1)]:
        with pytest.raises(ValueError):
            wilson_interval(*bad)


def test_wilson_wider_z_gives_wider_interval() -> None:
    low95, high95 = wilson_interval(20, 50)
    low99, high99 = wilson_interval(20, 50, z=2.5758293035489)
    assert low99 < low95 and high99 > high95


@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_properties(case: tuple[int, int]) -> None:
    successes, n = case
    low, high = wilson_interval(successes, n)
    assert 0.0 <= low <= successes / n <= high <= 1.0
    mirror_low, mirror_high = wilson_interval(n - successes, n)
    assert low == pytest.approx(1.0 - mirror_high, abs=1e-12)
    assert high == pytest.approx(1.0 - mirror_low, abs=1e-12)


def test_paired_counts() -> None:
    a = [True, True, False, False, True]
    b = [True, False, True, False, False]
    assert paired_counts(a, b) == (2, 1)
    assert paired_counts(b, a) == (1, 2)
    assert paired_counts([], []) == (0, 0)
    with pytest.raises(ValueError):
        paired_counts([True], [True, False])


def test_recall_hits_and_mrr() -> None:
    ranks = [1, 3, None, 8, 21, 2]
    assert hits_at_k(ranks, 4) == [True, True, False, False, False, True]
    assert recall_at_k(ranks, 1) == pytest.approx(1 / 6)
    assert recall_at_k(ranks, 4) == pytest.approx(3 / 6)
    assert recall_at_k(ranks, 8) == pytest.approx(4 / 6)
    assert recall_at_k(ranks, 20) == pytest.approx(4 / 6)
    assert mrr(ranks) == pytest.approx((1 + 1 / 3 + 1 / 8 + 1 / 21 + 1 / 2) / 6)
    assert recall_at_k([], 4) == 0.0
    assert mrr([]) == 0.0
    assert mrr([None, None]) == 0.0


def test_ranks_and_cutoffs_are_validated() -> None:
    with pytest.raises(ValueError):
        recall_at_k([1, 2], 0)
    with pytest.raises(ValueError):
        recall_at_k([0, 2], 4)
    with pytest.raises(ValueError):
        mrr([1, -3])


def test_hits_feed_the_paired_test() -> None:
    # Two strategies over the same five queries, compared at R@4.
    first = hits_at_k([1, 2, None, 5, 3, 1], 4)  # hit, hit, miss, miss, hit, hit
    second = hits_at_k([None, 9, 1, 2, 3, None], 4)  # miss, miss, hit, hit, hit, miss
    wins, losses = paired_counts(first, second)
    assert (wins, losses) == (3, 2)  # the shared hit on query 5 is not discordant
    assert math.isclose(sign_test(wins, losses), 1.0)
