"""The one retry loop every source's calls run through: ``RetryBudget.run``.

Each source says only which of its SDK's failures are worth asking again
(``Retry``) and how long the source asked to wait; the loop, the back-off and the
budget are these. Waits are recorded on a clock (``tests/clocks.py``), never slept.
The sources' own tests drive the same loop through their SDKs against mock servers.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from index.sources import SourceCredentialsRejected, SourceFailed
from index.sources.retry import Retry, RetryBudget
from tests.clocks import Waits


class Throttled(Exception):
    """What a source's SDK raises for an HTTP 429 (``asked``: its ``Retry-After``)."""

    def __init__(self, asked: float | None = None) -> None:
        super().__init__("HTTP 429")
        self.asked = asked


class Dropped(Exception):
    """What a source's SDK raises for a dropped connection."""


class Refused(Exception):
    """What a source's SDK raises for an HTTP 403: no wait helps."""


def transient(exc: Exception) -> Retry | None:
    """The classifier a source passes: 429 and dropped connections, never a 403."""
    if isinstance(exc, Throttled):
        return Retry("HTTP 429", exc.asked)
    return Retry("unreachable") if isinstance(exc, Dropped) else None


class Source:
    """A call that fails with each of ``failures`` in turn, then answers ``"answer"``."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "answer"


def budget(waits: Waits, seconds: float = 30.0) -> RetryBudget:
    return RetryBudget("Confluence", seconds, waits.sleep)


def run(source: Callable[[], str], waits: Waits, seconds: float = 30.0) -> str:
    return budget(waits, seconds).run(source, transient)


def test_failures_worth_asking_again_back_off_and_the_answer_comes_back() -> None:
    waits = Waits()
    source = Source(Dropped(), Dropped(), Dropped())

    assert run(source, waits) == "answer"
    assert source.calls == 4
    assert waits.waits == [0.5, 1.0, 2.0]  # 0.5 s, doubling


def test_an_answer_at_once_waits_for_nothing() -> None:
    waits = Waits()
    source = Source()

    assert run(source, waits) == "answer"
    assert (source.calls, waits.waits) == (1, [])


def test_the_wait_a_source_asks_for_is_waited_and_counts_in_the_back_off() -> None:
    waits = Waits()
    source = Source(Throttled(asked=7.0), Dropped())

    assert run(source, waits) == "answer"
    # Retry-After's 7 s, then the second back-off step: one try has been spent.
    assert waits.waits == [7.0, 1.0]


def test_a_retry_after_of_zero_asks_again_at_once() -> None:
    waits = Waits()

    assert run(Source(Throttled(asked=0.0)), waits) == "answer"
    assert waits.waits == [0.0]


def test_past_the_budget_the_run_fails_saying_when_to_ask_again() -> None:
    waits = Waits()
    source = Source(*[Dropped() for _ in range(10)])

    with pytest.raises(SourceFailed) as raised:
        run(source, waits, seconds=3.0)

    assert waits.waits == [0.5, 1.0]  # 2 s more would pass the 3 s budget
    assert source.calls == 3
    assert raised.value.retry_after == 2.0
    assert str(raised.value) == (
        "Confluence kept failing (unreachable) past the 3 s retry budget; "
        "the next sync retries in 2 s."
    )
    assert not isinstance(raised.value, SourceCredentialsRejected)


def test_a_retry_after_past_the_budget_is_not_waited() -> None:
    waits = Waits()
    source = Source(Throttled(asked=600.0))

    with pytest.raises(SourceFailed, match=r"\(HTTP 429\) past the 30 s") as raised:
        run(source, waits)

    assert (waits.waits, source.calls) == ([], 1)
    assert raised.value.retry_after == 600.0


def test_the_budget_is_the_sum_of_one_calls_waits() -> None:
    waits = Waits()
    spending = budget(waits, seconds=10.0)

    with pytest.raises(SourceFailed) as raised:
        spending.run(Source(Throttled(4.0), Throttled(4.0), Throttled(4.0)), transient)

    assert waits.waits == [4.0, 4.0]  # a third 4 s would make 12 s of 10
    assert raised.value.retry_after == 4.0
    assert waits.now == 2_000_000.0 + 8.0


def test_a_failure_no_wait_helps_is_raised_unchanged_at_once() -> None:
    waits = Waits()
    refused = Refused("HTTP 403")
    source = Source(Dropped(), refused)

    with pytest.raises(Refused) as raised:
        run(source, waits)

    assert raised.value is refused  # the source says what it means, not the loop
    assert source.calls == 2
    assert waits.waits == [0.5]


def test_an_error_of_the_code_itself_is_not_retried() -> None:
    waits = Waits()

    def broken() -> str:
        raise KeyError("id")

    with pytest.raises(KeyError):
        run(broken, waits)
    assert waits.waits == []
