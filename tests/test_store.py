"""The SQLite store: the query log's threads and event de-duplication."""

from __future__ import annotations

from pathlib import Path

from index.store import Store


def _log(store: Store, question: str, *, channel: str, thread_id: str) -> int:
    return store.log_query(
        question=question,
        scopes=["C1"],
        outcome="answered",
        model_called=1,
        kept=[],
        cited=[],
        invalid_citations=[],
        latency_ms=1.0,
        timings={},
        channel=channel,
        thread_id=thread_id,
        answer=f"answer to {question}",
    )


def test_thread_turns_are_the_logged_questions_of_that_thread(index_dir: Path) -> None:
    store = Store(index_dir)
    _log(store, "first", channel="C1", thread_id="t1")
    _log(store, "elsewhere", channel="C1", thread_id="t2")
    _log(store, "second", channel="C1", thread_id="t1")
    assert store.thread_turns("C1", "t1", 5) == [
        ("first", "answer to first"),
        ("second", "answer to second"),
    ]
    assert store.thread_turns("C1", "t1", 1) == [("second", "answer to second")]
    assert store.answered_in_thread("C1", "t2")
    assert not store.answered_in_thread("C2", "t1")


def test_query_log_has_no_columns_beyond_the_schema(index_dir: Path) -> None:
    store = Store(index_dir)
    _log(store, "first", channel="C1", thread_id="t1")
    columns = {c.name for c in store.db["query_log"].columns}
    assert "thread_id" in columns and "thread_ts" not in columns


def test_a_delivery_is_first_once(index_dir: Path) -> None:
    store = Store(index_dir)
    assert store.first_delivery("event-1")
    assert not store.first_delivery("event-1")
    assert store.first_delivery("event-2")
