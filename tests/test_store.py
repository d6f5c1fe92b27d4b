"""The store on SQLite and on Postgres: schema migrations, typed records, the query log, event
de-duplication, locks, the database URL as a secret.

Tests taking ``database_url`` run on both (``tests.postgres``).
"""

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
import psycopg
import pytest

from index.errors import DatabaseUnavailable
from index.models import AuditAction
from index.records import AUDIT_COLUMNS, DOCUMENT_COLUMNS, QUERY_COLUMNS, AuditEntry, QueryRecord
from index.storage.database import masked_url
from index.storage.postgres import postgres_sql
from index.storage.schema import MIGRATIONS, SCHEMA_BEFORE_MIGRATIONS
from index.storage.store import NewDocument, Store

# Frozen in index.storage.schema as migration 1: what a data dir made before migrations holds.
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
    "0011_query_log_beside",
    "0012_posted_messages",
    "0013_used_signin_states",
    "0014_languages",
    "0015_mcp_tokens",
    "0016_latent_terms",
    "0017_uploads",
    "0018_failure_kind",
    "0019_sources",
    "0020_canvases_credited_to_their_source",
    "0021_chunk_languages_index",
    "0022_documents_stamp_index",
    "0023_source_acl_until",
    "0024_people_heard",
    "0025_near_copy_signatures",
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
    if store.database.dialect == "postgresql":
        return {t: [(c,) for c in cs] for t, cs in store.database.table_columns().items()}
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
        "posted_messages",
        "used_states",
        "mcp_tokens",
        "uploads",
        "people_heard",
        "sources",
        "source_checkpoints",
        "source_items",
        "source_acl",
        "source_group_members",
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
    assert store.queries.get(5).question == "When does the office open?"
    assert store.queries.thread_turns("C1", "1700000000.000100", 5) == [
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
from index.storage.store import Store

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
    assert store.queries.get(5).question == "When does the office open?"


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
    return store.queries.log(_record(question, channel=channel, thread_id=thread_id))


def test_thread_turns_are_the_logged_questions_of_that_thread(
    index_dir: Path, database_url: str
) -> None:
    store = Store(index_dir, database_url=database_url)
    _log(store, "first", channel="C1", thread_id="t1")
    _log(store, "elsewhere", channel="C1", thread_id="t2")
    _log(store, "second", channel="C1", thread_id="t1")
    assert store.queries.thread_turns("C1", "t1", 5) == [
        ("first", "answer to first"),
        ("second", "answer to second"),
    ]
    assert store.queries.thread_turns("C1", "t1", 1) == [("second", "answer to second")]
    assert store.queries.answered_in_thread("C1", "t2")
    assert not store.queries.answered_in_thread("C2", "t1")


def test_a_logged_question_reads_back_as_it_was_recorded(
    index_dir: Path, database_url: str
) -> None:
    store = Store(index_dir, database_url=database_url)
    record = _record("first", channel="C1", thread_id="t1")
    assert store.queries.get(store.queries.log(record)) == record


def test_records_have_exactly_the_columns_of_their_tables(
    index_dir: Path, database_url: str
) -> None:
    store = Store(index_dir, database_url=database_url)
    columns = store.database.table_columns()
    assert columns["documents"] == list(DOCUMENT_COLUMNS)
    assert columns["query_log"] == ["id", "created_at", *QUERY_COLUMNS]
    assert columns["audit"] == list(AUDIT_COLUMNS)


def test_the_audit_log_reads_back_newest_first_and_is_append_only(
    index_dir: Path, database_url: str
) -> None:
    store = Store(index_dir, database_url=database_url)
    first = AuditEntry(actor="U1", action=AuditAction.ADD, document_id=3, name="a.md", scope="*")
    second = AuditEntry(actor="cli", action=AuditAction.REINDEX, detail="1 documents")
    store.audit_log.add(first)
    store.audit_log.add(second)
    newest, oldest = store.audit_log.entries()
    assert (newest.action, newest.actor, newest.document_id) == ("reindex", "cli", None)
    assert oldest.to_dict() | {"id": 0, "at": 0.0} == first.to_dict()
    assert oldest.at > 0 and store.audit_log.entries(1) == [newest]
    for statement in ("UPDATE audit SET actor = 'someone else'", "DELETE FROM audit"):
        with pytest.raises((sqlite3.IntegrityError, psycopg.Error), match="append-only"):
            store.db.execute(statement)
    assert len(store.audit_log.entries()) == 2


def test_a_misspelt_field_is_a_type_error_not_a_new_column(
    index_dir: Path, database_url: str
) -> None:
    store = Store(index_dir, database_url=database_url)
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


def _first(store: Store, *keys: str) -> bool:
    """A claim whose lease never lapses in the test: won only by the delivery's first sight."""
    return store.deliveries.claim(list(keys), lease_seconds=3600.0)


def test_a_delivery_is_first_once(index_dir: Path, database_url: str) -> None:
    store = Store(index_dir, database_url=database_url)
    assert _first(store, "event-1")
    assert not _first(store, "event-1")
    assert _first(store, "event-2")
    # Several keys of one delivery: any one seen before makes it a redelivery.
    assert _first(store, "event-3", "message-3")
    assert not _first(store, "event-4", "message-3")
    assert not _first(store, "event-4")  # recorded by the redelivery all the same


def test_two_replicas_claiming_a_delivery_at_once_give_it_to_exactly_one(
    tmp_path: Path, database_url: str
) -> None:
    # Each replica names the keys in its own order, the worst case for key-by-key claims:
    # each could take one key first and both drop the event. Two stores, two threads:
    # two connections (on Postgres, two server sessions) racing for the same keys.
    replicas = [
        Store(
            tmp_path / f"replica{i}" if database_url else tmp_path / "kb", database_url=database_url
        )
        for i in range(2)
    ]
    rounds = 60
    barrier = threading.Barrier(2)
    won: list[list[bool]] = [[], []]

    def claim(i: int) -> None:
        for n in range(rounds):
            keys = [f"event-{n}", f"message-{n}"]
            barrier.wait()
            won[i].append(_first(replicas[i], *(keys if i == 0 else keys[::-1])))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a + b for a, b in zip(won[0], won[1], strict=True)] == [1] * rounds


_ADDER = """
import os, sys, time
from pathlib import Path
from index.config import IndexConfig
from index.knowledge_base import KnowledgeBase


class Unloaded:  # adding bytes embeds nothing: no model is loaded
    name = "sentence-transformers/all-MiniLM-L6-v2"
    dim = 384


url = os.environ.get("KB_TEST_DATABASE_URL", "")
config = IndexConfig(data_dir=Path(sys.argv[1]), database_url=url)
kb = KnowledgeBase(config, embedder=Unloaded())
go = Path(sys.argv[2])
Path(sys.argv[3]).touch()
while not go.exists():
    time.sleep(0.001)
for i in range(20):  # twenty races in a row
    added = kb.add_bytes(f"# Handbook {i}\\n\\nClaims are due in 30 days.\\n".encode(), "h.md")
    print(added.document.id, added.duplicate)
"""


def test_six_processes_adding_the_same_bytes_at_once_get_one_document(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "kb"
    Store(data_dir, database_url=database_url)  # migrated before the race: the race is the add's
    monkeypatch.setenv("KB_TEST_DATABASE_URL", database_url)
    results = _race(_ADDER, data_dir, tmp_path, 6)
    assert all(code == 0 for code, _, _ in results), [err for _, _, err in results]
    outputs = [(out, err) for _, out, err in results]
    store = Store(data_dir, database_url=database_url)
    docs = store.documents()
    assert len(docs) == 20
    for i, doc in enumerate(docs):
        told = sorted(out.splitlines()[i] for out, _ in outputs)
        assert told == [f"{doc.id} False"] + [f"{doc.id} True"] * 5


def test_one_live_document_per_content_and_scope_is_enforced_by_the_schema(
    index_dir: Path, database_url: str
) -> None:
    store = Store(index_dir, database_url=database_url)
    first = store.insert_document(NewDocument(name="a.md", sha256="ab", size=1))
    with pytest.raises(store.database.integrity_errors, match="(?i)unique"):
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
    details = [e.detail for e in store.audit_log.entries(None)]
    assert sorted(details) == ["replaced #8: the same content", "replaced #9: the same content"]


# ------------------------------------------------------------------ Postgres


def test_postgres_gets_the_tables_and_columns_sqlite_gets(
    tmp_path: Path, postgres_url: str
) -> None:
    # Both from the same migrations: a migration whose SQL Postgres would read
    # differently (a type, a reserved word) fails here.
    on_sqlite = Store(tmp_path / "sqlite").database.table_columns()
    on_postgres = Store(tmp_path / "pg", database_url=postgres_url).database.table_columns()
    assert set(on_postgres) - set(on_sqlite) == {"originals"}  # the originals' storage
    assert {t: on_postgres[t] for t in on_sqlite} == on_sqlite


def test_a_new_postgres_database_is_migrated_once_by_processes_opening_it_at_once(
    tmp_path: Path, postgres_server: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.postgres import create_database

    url = create_database(postgres_server, template="template0")
    monkeypatch.setenv("KB_TEST_DATABASE_URL", url)
    opener = _OPENER.replace("import sys, time", "import os, sys, time").replace(
        "Store(Path(sys.argv[1]))",
        "Store(Path(sys.argv[1]), database_url=os.environ['KB_TEST_DATABASE_URL'])",
    )
    outputs = _race(opener, tmp_path / "kb", tmp_path, 3)
    assert all(code == 0 for code, _, _ in outputs), [err for _, _, err in outputs]
    store = Store(tmp_path / "kb", database_url=url)
    assert store.database.applied_migrations(MIGRATIONS) == MIGRATION_NAMES


def test_postgres_values_read_back_with_their_types(index_dir: Path, postgres_url: str) -> None:
    store = Store(index_dir, database_url=postgres_url)
    record = replace(_record("é 100% ?", channel="C1", thread_id="t1"), user=None)
    assert store.queries.get(store.queries.log(record)) == record
    store.set_meta("calibration", '{"threshold": 0.675, "what": "50% ?"}')
    assert store.get_meta("calibration") == '{"threshold": 0.675, "what": "50% ?"}'
    digest = store.save_original(b"%PDF-1.4 \x00\xff bytes")
    assert store.read_original(digest) == b"%PDF-1.4 \x00\xff bytes"


def test_the_originals_on_postgres_are_shared_and_go_when_unused(
    tmp_path: Path, postgres_url: str
) -> None:
    one = Store(tmp_path / "one", database_url=postgres_url)
    other = Store(tmp_path / "other", database_url=postgres_url)
    digest = one.save_original(b"# Handbook")
    doc = one.insert_document(NewDocument(name="h.md", sha256=digest, size=10))
    assert other.read_original(digest) == b"# Handbook"
    served = other.original_file(digest)
    assert served is not None and served.read_bytes() == b"# Handbook"
    assert not (tmp_path / "one" / "originals").exists()  # nothing on the first replica's disk
    other.delete_document(doc)
    assert not one.originals.has(digest)
    assert not served.exists()  # nor this replica's copy of it
    assert one.original_file(digest) is None


def test_a_lock_on_postgres_is_held_across_replicas_until_released(
    tmp_path: Path, postgres_url: str
) -> None:
    one = Store(tmp_path / "one", database_url=postgres_url)
    other = Store(tmp_path / "other", database_url=postgres_url)
    with one.exclusive("reindex") as acquired:
        assert acquired and other.locked("reindex")
        with other.exclusive("reindex") as second:
            assert not second
    assert not other.locked("reindex")
    # Released means released at once for the next replica, every time (not
    # when the server gets round to ending the holder's backend).
    for _ in range(30):
        with one.exclusive("reindex") as acquired:
            assert acquired
        with other.exclusive("reindex") as taken:
            assert taken
    holder = one.worker.id
    assert not other.worker.interrupted(1, holder)
    one.worker = other.worker  # drop the first replica's only reference: its lock goes
    del one
    import gc

    gc.collect()
    assert other.worker.interrupted(1, holder)


def test_a_wrong_password_is_refused_clearly_without_showing_it(
    tmp_path: Path, postgres_server: object
) -> None:
    from tests.postgres import require_password

    url = require_password(postgres_server, "kb_canary_user", "canary-db-password-7f3a")
    assert Store(tmp_path / "ok", database_url=url).generation == 0
    wrong = url.replace("canary-db-password-7f3a", "canary-wrong-password-1b2c")
    with pytest.raises(DatabaseUnavailable) as refused:
        Store(tmp_path / "kb", database_url=wrong)
    message = str(refused.value)
    assert "password authentication failed" in message and "kb_canary_user" in message
    assert "canary-wrong-password-1b2c" not in message and "KB_DATABASE_URL" in message
    assert "canary-wrong-password-1b2c" not in repr(refused.value.__cause__)


def test_an_unreachable_server_is_a_clear_error_without_the_password(tmp_path: Path) -> None:
    url = "postgresql://kb:canary-db-secret-9d1e@127.0.0.1:9/kb"
    with pytest.raises(DatabaseUnavailable) as refused:
        Store(tmp_path / "kb", database_url=url)
    message = str(refused.value)
    assert "postgresql://kb:***@127.0.0.1:9/kb" in message
    assert "canary-db-secret-9d1e" not in message


def test_a_database_url_that_is_not_postgres_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DatabaseUnavailable, match="postgresql://") as refused:
        Store(tmp_path / "kb", database_url="mysql://kb:canary-db-secret-2e4f@db/kb")
    assert "canary-db-secret-2e4f" not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://kb:s3cret@db:5432/kb", "postgresql://kb:***@db:5432/kb"),
        ("postgresql://kb@db/kb", "postgresql://kb@db/kb"),
        (
            "postgresql://db/kb?password=s3cret&sslmode=require",
            "postgresql://db/kb?password=***&sslmode=require",
        ),
    ],
)
def test_a_database_url_is_shown_with_its_password_masked(url: str, shown: str) -> None:
    assert masked_url(url) == shown


@pytest.mark.parametrize(
    ("sqlite", "postgres"),
    [
        (
            "SELECT '?', ? FROM t WHERE a LIKE '100%' AND b = 'it''s ?'",
            "SELECT '?', %s FROM t WHERE a LIKE '100%%' AND b = 'it''s ?'",
        ),
        (
            "CREATE TABLE t (id INTEGER PRIMARY KEY, user TEXT, at REAL, v BLOB, n INTEGER)",
            'CREATE TABLE t (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, "user" TEXT, '
            "at DOUBLE PRECISION, v BYTEA, n BIGINT)",
        ),
        ("ALTER TABLE t ADD COLUMN user TEXT", 'ALTER TABLE t ADD COLUMN "user" TEXT'),
        # Only schema statements get types: a value that spells one is left alone.
        ("SELECT 'INTEGER' FROM t WHERE kind = ?", "SELECT 'INTEGER' FROM t WHERE kind = %s"),
    ],
)
def test_the_store_sql_is_translated_for_postgres(sqlite: str, postgres: str) -> None:
    assert postgres_sql(sqlite) == postgres
