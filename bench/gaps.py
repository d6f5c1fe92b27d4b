"""Knowledge gaps: what App Home's list costs over a large query log.

The cost of ``knowledge_gaps`` over a query log of ``--log-rows`` questions, of
which ``MAX_QUESTIONS`` and more are refused within the window, built from the
bundled sets' real wordings: the first call (embedding every distinct wording),
the next (vectors cached in the process), and the store query alone. How well
the list groups the wordings of one question is a quality study:
``python -m studies.gap_grouping``.

Run: python -m bench.gaps [--log-rows 100000] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import describe as machine
from core.gaps import GAP_OUTCOMES, MAX_QUESTIONS, knowledge_gaps
from index.config import IndexConfig
from index.embed import Embedder
from index.embed.pytorch import LocalEmbedder
from index.knowledge_base import KnowledgeBase
from index.models import ALL_SCOPES
from index.records import QueryRecord

SETS = Path(__file__).resolve().parents[1] / "evaluation" / "sets"


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _record(question: str, outcome: str) -> QueryRecord:
    return QueryRecord(
        question=question,
        scopes=[ALL_SCOPES],
        outcome=outcome,
        model_called=outcome == "answered",
        kept=[],
        cited=[],
        invalid_citations=[],
        latency_ms=1.0,
        timings={},
    )


def cost(embedder: Embedder, log_rows: int) -> dict[str, Any]:
    """Seconds for the gap list over a log of ``log_rows`` questions (a third of them refused)."""
    texts = [
        q["ticket_phrasing"]
        for name in ("pip-black", "prometheus")
        for q in _read(SETS / name / "questions.jsonl")
    ]
    with tempfile.TemporaryDirectory() as tmp:
        kb = KnowledgeBase(IndexConfig(data_dir=Path(tmp) / "kb-data"), embedder=embedder)
        with kb.store.transaction() as db:
            now = time.time()
            for i in range(log_rows):
                # Distinct wordings: the sets' own, each with its number (as people vary them).
                row = _record(
                    f"{texts[i % len(texts)]} ({i})", GAP_OUTCOMES[0] if i % 3 else "answered"
                ).to_row()
                row["created_at"] = now - (log_rows - i)
                db.execute(
                    f"INSERT INTO query_log ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                    list(row.values()),
                )
        since = now - log_rows - 1
        t = time.perf_counter()
        read = kb.queries.by_outcome(GAP_OUTCOMES, since=since, limit=MAX_QUESTIONS)
        query_s = time.perf_counter() - t
        t = time.perf_counter()
        gaps = knowledge_gaps(kb, since=since)
        first_s = time.perf_counter() - t
        t = time.perf_counter()
        knowledge_gaps(kb, since=since)
        cached_s = time.perf_counter() - t
    return {
        "log_rows": log_rows,
        "questions_read": len(read),
        "gaps_returned": len(gaps),
        "store_query_s": round(query_s, 4),
        "first_call_s": round(first_s, 3),
        "cached_call_s": round(cached_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-rows", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    embedder = LocalEmbedder("bundled:all-MiniLM-L6-v2")
    timing = cost(embedder, args.log_rows)
    if args.json:
        print(json.dumps({"machine": machine(), "cost": timing}, indent=2))
        return
    print(f"machine: {machine()}")
    print(
        f"cost over {timing['log_rows']} logged questions ({timing['questions_read']} read): "
        f"store query {timing['store_query_s']} s, first call {timing['first_call_s']} s, "
        f"cached {timing['cached_call_s']} s"
    )


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
