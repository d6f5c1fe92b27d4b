"""The SQLite store: schema migrations, typed records, the query log, event de-duplication."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from index.models import AuditAction
from index.records import AUDIT_COLUMNS, DOCUMENT_COLUMNS, QUERY_COLUMNS, AuditEntry, QueryRecord
from index.schema import MIGRATIONS, SCHEMA_BEFORE_MIGRATIONS
from index.store import NewDocument, Store

# Frozen in index.schema as migration 1: what a data dir made before migrations holds.
OLD_SCHEMA = SCHEMA_BEFORE_MIGRATIONS
OLD_ROWS = """
INSERT INTO documents (id, name, title, sha256, kind, size, uploader, scope, state, chunk_count,
                       embedding_model, dimensions, created_at, updated_at, indexed_at)
VALUES (7, 'handbook.md', 'Handbook', 'ab12', 'md', 42, 'U1', '*', 'indexed', 2, 'm', 1,
        1.0, 2.0, 3.0);
INSERT INTO texts (document_id, text) VALUES (7, 'The office opens at eight. Bring a badge.');
INSERT INTO chunks (id, document_id, ordinal, section, start, "end", content, text, token_count,
                    vector)
VALUES (11, 7, 0, '', 0, 26, 'The office opens at eight.', 'Handbook. The office', 6, x'0000803f'),
       (12, 7, 1, '', 27, 41, 'Bring a badge.', 'Handbook. Bring a badge.', 4, x'00000040');
INSERT INTO jobs (kind, state, created_at) VALUES ('ingest', 'running', 1.0);
INSERT INTO query_log (id, created_at, question, scopes, outcome, model_called, kept, cited,
                       latency_ms, timings, user, channel, thread_ts, answer)
VALUES (5, 4.0, 'When does the office open?', '["C1"]', 'answered', 1, '[[11, 0.2]]', '[11]',
        12.5, '{}', 'U2', 'C1', '1700000000.000100', 'At eight [1].');
INSERT INTO feedback (query_id, user, value, created_at) VALUES (5, 'U2', 1, 5.0);
INSERT INTO slack_events (key, seen_at) VALUES ('Ev01', 6.0);
INSERT INTO meta (key, value) VALUES ('generation', '3');
"""
MIGRATION_NAMES = [
    "0001_initial",
    "0002_drop_jobs",
    "0003_deliveries",
    "0004_query_log_thread_id",
    "0005_publishing",
    "0006_worker_locks",
    "0007_one_live_document_per_content",
    "0008_escalations",
    "0009_query_log_nearest",
    "0010_sentence_vectors",
]


def _old_data_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path / "kb.sqlite") as conn:
        conn.executescript(OLD_SCHEMA + OLD_ROWS)
    conn.close()
    return path


def _tables(store: Store) -> set[str]:
    return {t for t in store.db.table_names() if not t.startswith(("sqlite_", "_sqlite"))}


def _layout(store: Store) -> dict[str, list[tuple[object, ...]]]:
    """Every table's columns (name, type, not null, default, primary key) and indexes."""
    out: dict[str, list[tuple[object, ...]]] = {}
    for table in sorted(_tables(store)):
        columns = store.db.execute(f"PRAGMA table_info({table})").fetchall()
        indexes = store.db.execute(f"PRAGMA index_list({table})").fetchall()
        out[table] = [tuple(c[1:]) for c in columns] + [(i[1], i[2]) for i in indexes]
    return out


def test_a_data_dir_of_the_old_schema_opens_upgraded_with_every_row(tmp_path: Path) -> None:
    store = Store(_old_data_dir(tmp_path / "old"))
    assert [m.name for m in MIGRATIONS.applied(store.db)] == MIGRATION_NAMES
    assert _tables(store) == {
        "documents",
        "chunks",
        "texts",
        "query_log",
        "feedback",
        "deliveries",
        "meta",
        "audit",
        "escalations",
    }
    doc = store.document(7)
    assert (doc.name, doc.title, doc.state, doc.chunk_count) == (
        "handbook.md",
        "Handbook",
        "indexed",
        2,
    )
    # Added before publishing rules: it replaces its older versions as it always did.
    assert (doc.publish, doc.replaced_by) == ("direct", None)
    assert store.canonical_text(7) == "The office opens at eight. Bring a badge."
    assert [(c["id"], c["content"]) for c in store.chunk_rows(7)] == [
        (11, "The office opens at eight."),
        (12, "Bring a badge."),
    ]
    vectors = {
        r["id"]: np.frombuffer(r["vector"], np.float32).tolist()
        for r in store.searchable_chunks("m", 1)
    }
    assert vectors == {11: [1.0], 12: [2.0]} and store.generation == 3
    assert store.query(5).question == "When does the office open?"
    assert store.thread_turns("C1", "1700000000.000100", 5) == [
        ("When does the office open?", "At eight [1].")
    ]
    assert store.db.execute("SELECT query_id, value FROM feedback").fetchall() == [(5, 1)]
    assert store.db.execute("SELECT key, seen_at FROM deliveries").fetchall() == [("Ev01", 6.0)]


def test_an_upgraded_data_dir_has_the_schema_of_a_new_one(tmp_path: Path) -> None:
    upgraded = Store(_old_data_dir(tmp_path / "old"))
    fresh = Store(tmp_path / "new")
    assert _layout(upgraded) == _layout(fresh)
    assert [m.name for m in MIGRATIONS.applied(fresh.db)] == MIGRATION_NAMES


def test_reopening_applies_nothing_again(tmp_path: Path) -> None:
    data_dir = _old_data_dir(tmp_path / "old")
    Store(data_dir)
    again = Store(data_dir)
    assert [m.name for m in MIGRATIONS.applied(again.db)] == MIGRATION_NAMES
    assert again.document(7).name == "handbook.md"


_OPENER = """
import sys, time
from pathlib import Path
from index.store import Store

go = Path(sys.argv[2])
Path(sys.argv[3]).touch()
while not go.exists():
    time.sleep(0.005)
Store(Path(sys.argv[1]))
"""


def _race(script: str, data_dir: Path, tmp_path: Path, count: int) -> list[tuple[int, str, str]]:
    """Run ``count`` processes of ``script`` released at the same instant: (exit code, out, err)."""
    go = tmp_path / "go"
    root = Path(__file__).resolve().parents[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(data_dir), str(go), str(tmp_path / f"ready{i}")],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready*"))) < count and time.monotonic() < deadline:
        time.sleep(0.01)  # every process imported and at the starting line
    go.touch()
    done = [(p, *p.communicate(timeout=60)) for p in procs]
    return [(p.returncode, out, err) for p, out, err in done]


def test_processes_opening_one_data_dir_at_once_migrate_it_once(tmp_path: Path) -> None:
    data_dir = _old_data_dir(tmp_path / "old")
    outputs = _race(_OPENER, data_dir, tmp_path, 4)
    assert all(code == 0 for code, _, _ in outputs), [err for _, _, err in outputs]
    store = Store(data_dir)
    assert [m.name for m in MIGRATIONS.applied(store.db)] == MIGRATION_NAMES
    assert store.query(5).question == "When does the office open?"


def _record(question: str, **where: str) -> QueryRecord:
    return QueryRecord(
        question=question,
        scopes=("C1",),
        outcome="answered",
        model_called=True,
        kept=((11, 0.25), (12, 0.5)),
        cited=(11,),
        invalid_citations=("[9]",),
        latency_ms=1.5,
        timings={"embed": 0.5, "total": 1.5},
        user="U1",
        answer=f"answer to {question}",
        **where,
    )


def _log(store: Store, question: str, *, channel: str, thread_id: str) -> int:
    return store.log_query(_record(question, channel=channel, thread_id=thread_id))


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


def test_a_logged_question_reads_back_as_it_was_recorded(index_dir: Path) -> None:
    store = Store(index_dir)
    record = _record("first", channel="C1", thread_id="t1")
    assert store.query(store.log_query(record)) == record


def test_records_have_exactly_the_columns_of_their_tables(index_dir: Path) -> None:
    store = Store(index_dir)
    assert [c.name for c in store.db["documents"].columns] == list(DOCUMENT_COLUMNS)
    logged = [c.name for c in store.db["query_log"].columns]
    assert logged == ["id", "created_at", *QUERY_COLUMNS]
    assert [c.name for c in store.db["audit"].columns] == list(AUDIT_COLUMNS)


def test_the_audit_log_reads_back_newest_first_and_is_append_only(index_dir: Path) -> None:
    store = Store(index_dir)
    first = AuditEntry(actor="U1", action=AuditAction.ADD, document_id=3, name="a.md", scope="*")
    second = AuditEntry(actor="cli", action=AuditAction.REINDEX, detail="1 documents")
    store.audit(first)
    store.audit(second)
    newest, oldest = store.audit_entries()
    assert (newest.action, newest.actor, newest.document_id) == ("reindex", "cli", None)
    assert oldest.to_dict() | {"id": 0, "at": 0.0} == first.to_dict()
    assert oldest.at > 0 and store.audit_entries(1) == [newest]
    for statement in ("UPDATE audit SET actor = 'someone else'", "DELETE FROM audit"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            store.db.execute(statement)


def test_a_misspelt_field_is_a_type_error_not_a_new_column(index_dir: Path) -> None:
    store = Store(index_dir)
    doc_id = store.insert_document(NewDocument(name="a.md", sha256="ab12", size=1))
    before = _layout(store)
    with pytest.raises(TypeError):
        store.update_document(doc_id, titel="A")
    with pytest.raises(TypeError):
        store.insert_document(NewDocument(name="b.md", sha256="cd34", size=1, titel="B"))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        replace(_record("first"), thread_ts="t1")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        QueryRecord(question="q", thread_ts="t1")  # type: ignore[call-arg]
    assert _layout(store) == before
    assert store.document(doc_id).title == ""
    assert [d.name for d in store.documents()] == ["a.md"]


def test_a_delivery_is_first_once(index_dir: Path) -> None:
    store = Store(index_dir)
    assert store.first_delivery("event-1")
    assert not store.first_delivery("event-1")
    assert store.first_delivery("event-2")
    # Several keys of one delivery: any one seen before makes it a redelivery.
    assert store.first_delivery("event-3", "message-3")
    assert not store.first_delivery("event-4", "message-3")
    assert not store.first_delivery("event-4")  # recorded by the redelivery all the same


def test_two_replicas_claiming_a_delivery_at_once_give_it_to_exactly_one(index_dir: Path) -> None:
    # Each replica names the keys in its own order, the worst case for key-by-key claims:
    # each could take one key first and both drop the event.
    replicas = [Store(index_dir), Store(index_dir)]
    rounds = 60
    barrier = threading.Barrier(2)
    won: list[list[bool]] = [[], []]

    def claim(i: int) -> None:
        for n in range(rounds):
            keys = [f"event-{n}", f"message-{n}"]
            barrier.wait()
            won[i].append(replicas[i].first_delivery(*(keys if i == 0 else keys[::-1])))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a + b for a, b in zip(won[0], won[1], strict=True)] == [1] * rounds


_ADDER = """
import sys, time
from pathlib import Path
from index.config import IndexConfig
from index.knowledge_base import KnowledgeBase


class Unloaded:  # adding bytes embeds nothing: no model is loaded
    name = "sentence-transformers/all-MiniLM-L6-v2"
    dim = 384


kb = KnowledgeBase(IndexConfig(data_dir=Path(sys.argv[1])), embedder=Unloaded())
go = Path(sys.argv[2])
Path(sys.argv[3]).touch()
while not go.exists():
    time.sleep(0.001)
for i in range(20):  # twenty races in a row
    added = kb.add_bytes(f"# Handbook {i}\\n\\nClaims are due in 30 days.\\n".encode(), "h.md")
    print(added.document.id, added.duplicate)
"""


def test_six_processes_adding_the_same_bytes_at_once_get_one_document(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb"
    Store(data_dir)  # migrated before the race: the race is the add's
    results = _race(_ADDER, data_dir, tmp_path, 6)
    assert all(code == 0 for code, _, _ in results), [err for _, _, err in results]
    outputs = [(out, err) for _, out, err in results]
    store = Store(data_dir)
    docs = store.documents()
    assert len(docs) == 20
    for i, doc in enumerate(docs):
        told = sorted(out.splitlines()[i] for out, _ in outputs)
        assert told == [f"{doc.id} False"] + [f"{doc.id} True"] * 5


def test_one_live_document_per_content_and_scope_is_enforced_by_the_schema(
    index_dir: Path,
) -> None:
    store = Store(index_dir)
    first = store.insert_document(NewDocument(name="a.md", sha256="ab", size=1))
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        store.insert_document(NewDocument(name="b.md", sha256="ab", size=1))
    # Another scope:
    store.insert_document(NewDocument(name="a.md", sha256="ab", size=1, scope="C1"))
    store.update_document(first, state="replaced")
    # A new version of replaced bytes:
    store.insert_document(NewDocument(name="a.md", sha256="ab", size=1))


def test_duplicates_made_before_the_constraint_become_replaced_versions(tmp_path: Path) -> None:
    data_dir = _old_data_dir(tmp_path / "old")
    with sqlite3.connect(data_dir / "kb.sqlite") as conn:
        conn.execute(
            """INSERT INTO documents (id, name, sha256, size, scope, state, created_at, updated_at)
               VALUES (8, 'handbook.md', 'ab12', 42, '*', 'failed', 4.0, 4.0),
                      (9, 'copy.md', 'ab12', 42, '*', 'pending', 5.0, 5.0)"""
        )
    conn.close()
    store = Store(data_dir)
    states = {d.id: (d.state, d.replaced_by) for d in store.documents()}
    assert states == {7: ("indexed", None), 8: ("replaced", 7), 9: ("replaced", 7)}
    assert len(store.chunk_rows(7)) == 2
    assert store.generation == 4
    details = [e.detail for e in store.audit_entries(None)]
    assert sorted(details) == ["replaced #8: the same content", "replaced #9: the same content"]
