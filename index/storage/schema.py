"""The SQLite schema, as the numbered migrations that build it (sqlite-utils' ``Migrations``).

A data dir records the migrations applied to it in ``_sqlite_migrations``;
opening one applies the rest, in order (``index.storage.store.Store``). Migration 1 is
the schema exactly as releases before these migrations created it, with
``CREATE ... IF NOT EXISTS``: on a data dir made by those releases it changes
nothing and is recorded, so that data dir is upgraded from step 1. A migration
that has shipped is never edited; a change to the schema is a new one at the end.

The tables once every migration has run: ``documents``, ``chunks``, ``texts``,
``query_log``, ``feedback``, ``deliveries``, ``meta``, ``audit``,
``escalations``, ``posted_messages``, ``used_states``, ``mcp_tokens``,
``uploads``, ``people_heard``, and the synced sources' ``sources``, ``source_checkpoints``,
``source_items``, ``source_acl`` and ``source_group_members``. At most one live document (any state but ``replaced``) has
given bytes in a given scope.
"""

from __future__ import annotations

import time

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from index.near_copies import signature

__all__ = ["BUMP_GENERATION", "HOLD_GENERATION", "MIGRATIONS", "SCHEMA_BEFORE_MIGRATIONS"]

MIGRATIONS = Migrations("kb")

# One more change to the searchable chunks (``meta.generation`` is text, as every meta value).
BUMP_GENERATION = """INSERT INTO meta (key, value) VALUES ('generation', '1')
    ON CONFLICT (key) DO UPDATE SET value = CAST(CAST(meta.value AS INTEGER) + 1 AS TEXT)"""
# The generation counter's row taken and left as it is (``Store.stamped_models_held``).
HOLD_GENERATION = """INSERT INTO meta (key, value) VALUES ('generation', '0')
    ON CONFLICT (key) DO UPDATE SET value = meta.value"""

# Frozen: the schema before migrations were recorded.
SCHEMA_BEFORE_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS documents (
    -- AUTOINCREMENT: an id is never reused, so an old link or a cached
    -- search result can never point at a different, newer document.
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    title TEXT NOT NULL DEFAULT '',
    sha256 TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT '',
    size INTEGER NOT NULL,
    uploader TEXT NOT NULL DEFAULT '',
    scope TEXT NOT NULL DEFAULT '*',
    state TEXT NOT NULL,
    failure_reason TEXT,
    chunk_count INTEGER NOT NULL DEFAULT 0,
    window_splits INTEGER NOT NULL DEFAULT 0,
    text_length INTEGER NOT NULL DEFAULT 0,
    page_starts TEXT,
    embedding_model TEXT,
    dimensions INTEGER,
    pipeline_version TEXT,
    extractor_version TEXT,
    replaces INTEGER,
    worker_pid INTEGER,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    indexed_at REAL
);
CREATE INDEX IF NOT EXISTS documents_sha256 ON documents(sha256, scope);
CREATE INDEX IF NOT EXISTS documents_name ON documents(name, scope);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    document_id INTEGER NOT NULL REFERENCES documents(id),
    ordinal INTEGER NOT NULL,
    section TEXT NOT NULL,
    start INTEGER NOT NULL,
    "end" INTEGER NOT NULL,
    page INTEGER,
    content TEXT NOT NULL,
    text TEXT NOT NULL,
    token_count INTEGER NOT NULL,
    vector BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_document ON chunks(document_id);
CREATE TABLE IF NOT EXISTS texts (
    document_id INTEGER PRIMARY KEY REFERENCES documents(id),
    text TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    document_id INTEGER,
    state TEXT NOT NULL,
    detail TEXT,
    created_at REAL NOT NULL,
    finished_at REAL
);
CREATE TABLE IF NOT EXISTS query_log (
    id INTEGER PRIMARY KEY,
    created_at REAL NOT NULL,
    question TEXT NOT NULL,
    scopes TEXT NOT NULL,
    outcome TEXT NOT NULL,
    model_called INTEGER NOT NULL,
    kept TEXT NOT NULL,
    cited TEXT NOT NULL,
    invalid_citations TEXT NOT NULL DEFAULT '[]',
    latency_ms REAL NOT NULL,
    timings TEXT NOT NULL,
    user TEXT,
    channel TEXT,
    thread_ts TEXT,
    answer TEXT
);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY,
    query_id INTEGER NOT NULL REFERENCES query_log(id),
    user TEXT,
    value INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS slack_events (
    key TEXT PRIMARY KEY,
    seen_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


@MIGRATIONS(name="0001_initial")
def _initial(db: Database) -> None:
    # One statement at a time: executescript() would commit the transaction
    # the migration and its record run in. No statement holds a ";".
    for statement in filter(str.strip, SCHEMA_BEFORE_MIGRATIONS.split(";")):
        db.execute(statement)


@MIGRATIONS(name="0002_drop_jobs")
def _drop_jobs(db: Database) -> None:
    # Written by job bookkeeping that nothing ever read.
    db.execute("DROP TABLE IF EXISTS jobs")


@MIGRATIONS(name="0003_deliveries")
def _rename_deliveries(db: Database) -> None:
    db.execute("ALTER TABLE slack_events RENAME TO deliveries")


@MIGRATIONS(name="0004_query_log_thread_id")
def _rename_thread_id(db: Database) -> None:
    db.execute("ALTER TABLE query_log RENAME COLUMN thread_ts TO thread_id")


@MIGRATIONS(name="0005_publishing")
def _publishing(db: Database) -> None:
    # Documents from before publishing rules were added by whoever could add
    # them then: they keep replacing their older versions as they did.
    db.execute("ALTER TABLE documents ADD COLUMN publish TEXT NOT NULL DEFAULT 'direct'")
    db.execute("ALTER TABLE documents ADD COLUMN replaced_by INTEGER")
    # No foreign key to documents: an entry outlives the document it is about.
    db.execute(
        """CREATE TABLE audit (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at REAL NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            document_id INTEGER,
            name TEXT NOT NULL DEFAULT '',
            scope TEXT NOT NULL DEFAULT '',
            old_sha256 TEXT,
            new_sha256 TEXT,
            detail TEXT NOT NULL DEFAULT ''
        )"""
    )
    db.execute("CREATE INDEX audit_document ON audit(document_id)")
    # Append-only: no code path may rewrite or drop what happened.
    if _dialect(db) == "postgresql":
        _append_only_on_postgres(db)
        return
    for event in ("UPDATE", "DELETE"):
        db.execute(
            f"""CREATE TRIGGER audit_no_{event.lower()} BEFORE {event} ON audit
                BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END"""
        )


@MIGRATIONS(name="0006_worker_locks")
def _worker_locks(db: Database) -> None:
    # Who is indexing a document, as the id of a lock its process holds
    # (index.storage.workers): a pid says nothing once a container restarts.
    db.execute("ALTER TABLE documents ADD COLUMN worker TEXT")


@MIGRATIONS(name="0007_one_live_document_per_content")
def _one_live_document_per_content(db: Database) -> None:
    # Processes adding the same bytes at the same instant could each insert a
    # row. The duplicates become replaced versions of the row kept (the
    # searchable one, else the oldest): their links keep opening, nothing is
    # lost, and only one of them is ever searched.
    groups = db.execute(
        f"""SELECT sha256, scope FROM documents WHERE {_LIVE}
            GROUP BY sha256, scope HAVING COUNT(*) > 1"""
    ).fetchall()
    for sha256, scope in groups:
        _retire_duplicates(db, sha256, scope)
    db.execute(
        f"CREATE UNIQUE INDEX documents_live_content ON documents(sha256, scope) WHERE {_LIVE}"
    )


@MIGRATIONS(name="0008_escalations")
def _escalations(db: Database) -> None:
    # One hand-off to a person per logged question (index.storage.escalations); no
    # foreign key: the record outlives a query log that is ever trimmed.
    db.execute(
        """CREATE TABLE escalations (
            query_id INTEGER PRIMARY KEY,
            user TEXT NOT NULL,
            at REAL NOT NULL,
            channel TEXT,
            ts TEXT
        )"""
    )


@MIGRATIONS(name="0009_query_log_nearest")
def _query_log_nearest(db: Database) -> None:
    # A refusal keeps no passage; its nearest miss is what an admin needs to see
    # why (core.gaps). The time index serves the gaps' and reviews' windows.
    db.execute("ALTER TABLE query_log ADD COLUMN nearest TEXT")
    db.execute("CREATE INDEX query_log_created_at ON query_log(created_at)")


@MIGRATIONS(name="0010_sentence_vectors")
def _sentence_vectors(db: Database) -> None:
    # A chunk's sentences' vectors (index.ingest.sentences), one float32 blob; NULL for
    # a chunk of one sentence and for chunks indexed before: ranked by the chunk alone.
    db.execute("ALTER TABLE chunks ADD COLUMN sentence_vectors BLOB")


@MIGRATIONS(name="0011_query_log_beside")
def _query_log_beside(db: Database) -> None:
    # The possibly related passages an answer listed beside its sources
    # (core.gate.beside_answer): what the asker was shown, not what the model read.
    db.execute("ALTER TABLE query_log ADD COLUMN beside TEXT")


@MIGRATIONS(name="0012_posted_messages")
def _posted_messages(db: Database) -> None:
    # The bot's messages about a document (index.storage.messages): a click edits only
    # one of these, and every copy of an approval request is updated once decided.
    db.execute(
        """CREATE TABLE posted_messages (
            channel TEXT NOT NULL,
            ts TEXT NOT NULL,
            document_id INTEGER NOT NULL,
            kind TEXT NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (channel, ts)
        )"""
    )
    db.execute("CREATE INDEX posted_messages_document ON posted_messages(document_id, kind)")


@MIGRATIONS(name="0013_used_signin_states")
def _used_signin_states(db: Database) -> None:
    # Sign-in states already used (index.storage.used_states), shared by every replica.
    db.execute(
        """CREATE TABLE used_states (
            state TEXT PRIMARY KEY,
            expires_at REAL NOT NULL
        )"""
    )
    db.execute("CREATE INDEX used_states_expires_at ON used_states(expires_at)")


@MIGRATIONS(name="0014_languages")
def _languages(db: Database) -> None:
    # The language of each passage and of its document (index.languages): BM25
    # analyses a passage with its language's stemmer, and `kb status` tells an
    # admin which languages the knowledge base holds. NULL: indexed before, or
    # no language could be told; such passages are analysed as before.
    db.execute("ALTER TABLE documents ADD COLUMN language TEXT")
    db.execute("ALTER TABLE chunks ADD COLUMN language TEXT")


@MIGRATIONS(name="0015_mcp_tokens")
def _mcp_tokens(db: Database) -> None:
    # Bearer tokens of MCP clients (index.storage.mcp_tokens): only their SHA-256 is
    # kept; a revoked one stays, so a name in the query log always means one token.
    db.execute(
        """CREATE TABLE mcp_tokens (
            name TEXT PRIMARY KEY,
            token_sha256 TEXT NOT NULL UNIQUE,
            user_id TEXT NOT NULL,
            scopes TEXT NOT NULL,
            created_at REAL NOT NULL,
            expires_at REAL,
            revoked_at REAL
        )"""
    )
    # Where a question came from: every question before this one came from Slack
    # (or kb ask); an MCP call names its token in `client`.
    db.execute("ALTER TABLE query_log ADD COLUMN surface TEXT NOT NULL DEFAULT 'slack'")
    db.execute("ALTER TABLE query_log ADD COLUMN client TEXT")


@MIGRATIONS(name="0016_latent_terms")
def _latent_terms(db: Database) -> None:
    # A chunk's latent terms from its model's sparse head (index.embed.latent), one
    # blob; NULL for a model without one and for chunks indexed before: the answer
    # order then leaves that leg out.
    db.execute("ALTER TABLE chunks ADD COLUMN latent_terms BLOB")


@MIGRATIONS(name="0017_uploads")
def _uploads(db: Database) -> None:
    # Who holds a delivery's claim (bot.slack.deliveries): only its holder renews it
    # or marks it answered, so a holder that lost it to a takeover finds out.
    # NULL: claimed before holders were recorded.
    db.execute("ALTER TABLE deliveries ADD COLUMN holder TEXT")
    # The files of an upload until each is indexed or failed with its uploader told
    # (index.storage.uploads): what a replica taking over the delivery's claim resumes.
    db.execute(
        """CREATE TABLE uploads (
            delivery TEXT NOT NULL,
            file_id TEXT NOT NULL,
            claim_keys TEXT NOT NULL,
            request TEXT NOT NULL,
            status_channel TEXT,
            status_ts TEXT,
            document_id INTEGER,
            position INTEGER NOT NULL DEFAULT 0,
            attempts INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            done_at REAL,
            PRIMARY KEY (delivery, file_id)
        )"""
    )
    db.execute("CREATE INDEX uploads_open ON uploads(delivery) WHERE done_at IS NULL")


@MIGRATIONS(name="0018_failure_kind")
def _failure_kind(db: Database) -> None:
    # What a failure was, as data (index.errors.ExtractionError.kind: time, memory,
    # pages, corrupt...), and the value of the limit it went over; `kb reindex` skips a
    # document by these, never by reading its reason. Failures recorded before have
    # neither: such a document is read once more and fails with both.
    db.execute("ALTER TABLE documents ADD COLUMN failure_kind TEXT")
    db.execute("ALTER TABLE documents ADD COLUMN failure_limit REAL")
    db.execute(
        "UPDATE documents SET failure_kind = 'interrupted' WHERE failure_reason = ?",
        ["Indexing was interrupted before it finished; retry it."],
    )


@MIGRATIONS(name="0019_sources")
def _sources(db: Database) -> None:
    # The places documents are synced from (index.sources): their settings (never a
    # credential: those stay in the environment or a secret file), how the last run
    # went and when one last succeeded (``kb source list``, ``/readyz``).
    db.execute(
        """CREATE TABLE sources (
            name TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            settings TEXT NOT NULL,
            created_at REAL NOT NULL,
            last_run_at REAL,
            last_good_at REAL,
            last_error TEXT,
            retry_at REAL
        )"""
    )
    # Where an incremental poll resumes: written in the run's last transaction, so a
    # run killed midway resumes from the previous one and loses nothing.
    db.execute(
        """CREATE TABLE source_checkpoints (
            source TEXT PRIMARY KEY,
            checkpoint TEXT NOT NULL,
            updated_at REAL NOT NULL
        )"""
    )
    # One row per item a source gave: the document it is now, where it opens in the
    # source, and the scope every version of it is filed under.
    db.execute(
        """CREATE TABLE source_items (
            source TEXT NOT NULL,
            item TEXT NOT NULL,
            scope TEXT NOT NULL UNIQUE,
            document_id INTEGER,
            url TEXT NOT NULL DEFAULT '',
            title TEXT NOT NULL DEFAULT '',
            version TEXT NOT NULL DEFAULT '',
            sha256 TEXT NOT NULL DEFAULT '',
            synced_at REAL NOT NULL,
            acl_synced_at REAL,
            PRIMARY KEY (source, item)
        )"""
    )
    # A source document's permissions, by its scope: kind user (an email), group (a
    # source group), domain (an email domain), public (everyone in the organisation),
    # unknown (nobody). No row at all is unknown too.
    db.execute(
        """CREATE TABLE source_acl (
            scope TEXT NOT NULL,
            kind TEXT NOT NULL,
            principal TEXT NOT NULL DEFAULT '',
            PRIMARY KEY (scope, kind, principal)
        )"""
    )
    db.execute("CREATE INDEX source_acl_principal ON source_acl(kind, principal)")
    # A source group's members by email, as the source's API expanded them last.
    db.execute(
        """CREATE TABLE source_group_members (
            source TEXT NOT NULL,
            group_name TEXT NOT NULL,
            email TEXT NOT NULL,
            PRIMARY KEY (source, group_name, email)
        )"""
    )
    db.execute("CREATE INDEX source_group_email ON source_group_members(email)")


# What canvases were credited to before they were their source's.
_OLD_CANVAS_UPLOADER = "slack-canvases"
# A synced document's name: its source's id, this, then the item (index.sync.sources).
_SYNCED_NAME_SEPARATOR = " › "


@MIGRATIONS(name="0020_canvases_credited_to_their_source")
def _canvases_credited_to_their_source(db: Database) -> None:
    # Canvases synced before they were credited to their source (bot.slack.canvases:
    # ``source:canvases-<channel>``, index.models.source_uploader) were credited to
    # ``slack-canvases``, which an upload may be too: an upload named like such a canvas
    # would replace it, and its own next version would not. Every version of each is its
    # source's now, found by its name (``canvases-<channel> › <canvas id>.md``).
    rows = db.execute(
        "SELECT id, name FROM documents WHERE uploader = ?", [_OLD_CANVAS_UPLOADER]
    ).fetchall()
    for doc_id, name in rows:
        source, separator, _ = str(name).partition(_SYNCED_NAME_SEPARATOR)
        if separator and source.startswith("canvases-"):
            db.execute(
                "UPDATE documents SET uploader = ? WHERE id = ?", [f"source:{source}", doc_id]
            )


@MIGRATIONS(name="0021_chunk_languages_index")
def _chunk_languages_index(db: Database) -> None:
    # What a server reads of every chunk at start (its id, document and language: the
    # search snapshot's ids, versions, scopes and languages, and the language counts)
    # from an index of a few MB instead of the chunks' rows (their texts and vectors:
    # 400 MB at 100k chunks). It leads with document_id, so it also serves every look-up
    # the index it replaces served.
    db.execute("CREATE INDEX chunks_document_language ON chunks(document_id, language, id)")
    db.execute("DROP INDEX chunks_document")


@MIGRATIONS(name="0022_documents_stamp_index")
def _documents_stamp_index(db: Database) -> None:
    # The indexed documents' model stamps (``Store.stamped_models``), read by every commit
    # of a document in a knowledge base that may keep the earlier model, and by a server
    # each time the store changes, from an index instead of every document row: 2.5 ms
    # instead of 28 at 20k documents.
    db.execute("CREATE INDEX documents_state_model ON documents(state, embedding_model)")


@MIGRATIONS(name="0023_source_acl_until")
def _source_acl_until(db: Database) -> None:
    # When a synced document's permission stops admitting (epoch seconds; NULL: it
    # lasts): a grant the source gives until a time admits nobody past it, read at
    # every look-up by the store's clock, not dropped at the next sync. Rows already
    # there are grants that last, as they were.
    db.execute("ALTER TABLE source_acl ADD COLUMN until REAL")


@MIGRATIONS(name="0024_people_heard")
def _people_heard(db: Database) -> None:
    # What Slack said of a person or a channel (a member made a guest, someone joined a
    # channel), which Slack delivers to one replica only: every replica reads the rows
    # written since it last looked before it decides who reads along, so none goes on
    # from its own, older lists. Rows are kept an hour (``index.storage.people_heard``).
    db.execute(
        """CREATE TABLE people_heard (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,
            subject TEXT NOT NULL,
            heard_at REAL NOT NULL
        )"""
    )
    db.execute("CREATE INDEX people_heard_at ON people_heard(heard_at)")


@MIGRATIONS(name="0025_near_copy_signatures")
def _near_copy_signatures(db: Database) -> None:
    # A document's text summed up for near-copy look-ups (index.near_copies), beside the
    # text: its number of distinct runs of words and their MinHash signature, 512 bytes;
    # NULL for a text without a word. The index serves the look-up's range of sizes.
    db.execute("ALTER TABLE texts ADD COLUMN near_shingles INTEGER")
    db.execute("ALTER TABLE texts ADD COLUMN near_minhash BLOB")
    db.execute("CREATE INDEX texts_near_shingles ON texts(near_shingles)")
    # Texts stored before are signed here, one at a time: about 2 ms for 1,000 words
    # (bench/near_copies.py), a minute for 10,000 documents of 2,000 words.
    ids = [row[0] for row in db.execute("SELECT document_id FROM texts").fetchall()]
    for doc_id in ids:
        text = db.execute("SELECT text FROM texts WHERE document_id = ?", [doc_id]).fetchone()[0]
        if (signed := signature(text)) is not None:
            db.execute(
                "UPDATE texts SET near_shingles = ?, near_minhash = ? WHERE document_id = ?",
                [signed.shingles, signed.minhash, doc_id],
            )


def _dialect(db: Database) -> str:
    # A migration runs on sqlite-utils' Database, or on index.storage.database's Postgres connection.
    return "sqlite" if isinstance(db, Database) else "postgresql"


def _append_only_on_postgres(db: Database) -> None:
    db.execute(
        """CREATE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'the audit log is append-only'; END $$"""
    )
    for event in ("UPDATE", "DELETE"):
        db.execute(
            f"""CREATE TRIGGER audit_no_{event.lower()} BEFORE {event} ON audit
                FOR EACH ROW EXECUTE FUNCTION audit_append_only()"""
        )


# The rows the unique index covers: every document but a replaced version (the
# same bytes uploaded again after a replace are a new version of their own).
_LIVE = "state != 'replaced'"


def _retire_duplicates(db: Database, sha256: str, scope: str) -> None:
    rows = db.execute(
        f"""SELECT id, name FROM documents WHERE sha256 = ? AND scope = ? AND {_LIVE}
            ORDER BY state != 'indexed', state != 'awaiting_approval', id""",
        [sha256, scope],
    ).fetchall()
    kept = rows[0][0]
    now = time.time()
    for doc_id, name in rows[1:]:
        db.execute("DELETE FROM chunks WHERE document_id = ?", [doc_id])
        db.execute(
            """UPDATE documents SET state = 'replaced', replaced_by = ?, updated_at = ?,
                   failure_reason = NULL WHERE id = ?""",
            [kept, now, doc_id],
        )
        db.execute(
            """INSERT INTO audit (at, actor, action, document_id, name, scope, old_sha256,
                                  new_sha256, detail)
               VALUES (?, 'kb', 'replace', ?, ?, ?, ?, ?, ?)""",
            [now, kept, name, scope, sha256, sha256, f"replaced #{doc_id}: the same content"],
        )
    db.execute(BUMP_GENERATION)
