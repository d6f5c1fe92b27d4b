"""Questions in the query log, as the engine would have logged them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from index.models import ALL_SCOPES
from index.records import QueryRecord
from index.storage.store import Store


def answered(question: str, **changes: Any) -> QueryRecord:
    """A question the model answered (nothing kept or cited), with ``changes`` applied."""
    record = QueryRecord(
        question=question,
        scopes=[ALL_SCOPES],
        outcome="answered",
        model_called=True,
        kept=[],
        cited=[],
        invalid_citations=[],
        latency_ms=1.0,
        timings={},
    )
    return replace(record, **changes)


def log_question(store: Store, question: str, **changes: Any) -> int:
    """Log ``question`` as answered; returns its query id."""
    return store.queries.log(answered(question, **changes))
