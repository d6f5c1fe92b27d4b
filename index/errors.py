"""Errors of the storage and ingestion layer, and the tree of every error the product raises.

Every error the product raises on purpose derives from ``KBError``; this is
all of them (a test keeps the list complete)::

    KBError
    ├── ExtractionError              a document's bytes could not become text
    │   ├── EmptyDocument            no text in it
    │   ├── UnsupportedType          not a type the knowledge base reads
    │   ├── TooLarge                 over the upload limit
    │   ├── OverLimit                more pages or chunks than one document may have
    │   │   └── ReadingLimit         reading it needed more memory or time than one document may take
    │   ├── ReaderRefused            a reader process sent what a reader never sends
    │   └── CorruptDocument          damaged, encrypted, or not the type it claims
    ├── DocumentNotFound             no document matches a reference
    ├── NotAwaitingApproval          an approval or rejection of a document already decided
    ├── NotRestorable                a restore of a document that has no earlier version to bring back
    ├── QueryNotFound                no logged question has that id
    ├── OriginalMissing              a document's stored original is gone from the data dir
    ├── DatabaseUnavailable          the SQLite database cannot be opened
    ├── StorageError                 the data dir could not be written (an I/O error); nothing changed
    │   ├── DiskFull                 the data dir's disk is full; nothing changed
    │   │   └── DiskSpaceLow         free space is under the floor: new documents are refused
    │   └── DatabaseBusy             another process held the database's write lock too long; nothing changed
    ├── ReadersUnconfined            KB_READER_SANDBOX=required and the document readers cannot be confined
    ├── IndexOutOfSync               derived indexes disagree with SQLite
    ├── ReindexInProgress            a second reindex was asked for while one runs
    ├── AtomicWriteError             (index.files.atomic) a file could not be replaced
    ├── VectorIndexError             (index.search.vectors) FAISS failed; rebuild the index
    ├── EmbeddingModelUnavailable    (index.embed.base) the embedding model cannot be loaded or reached
    │   └── StoreModelUnavailable    (index.embed.base) the store moved to a model this server cannot load
    ├── SearchEngineUnavailable      (index.search.qdrant.engine) the search engine cannot be loaded, reached or opened
    ├── FetchFailed                  (index.sync.fetch) a URL refused by the fetch policy or not fetched
    │   └── ItemGone                 (index.sync.listed) a listed item is gone from its source: its document goes
    ├── ItemFailed                   (index.sync.listed) a listed item cannot be read now: its document stays
    ├── SyncConfigError              (index.sync.sources) a sync source or its config file is malformed
    ├── QueryAdapterError            (index.search.query_map) a stored query map cannot be read
    ├── StoreMigrationError          (index.storage.migrate) kb migrate-store could not move a knowledge base; nothing committed
    ├── McpTokenError                (index.storage.mcp_tokens) an MCP token cannot be issued or revoked as asked
    ├── UnknownSource                (index.storage.sources) no synced source has that name
    ├── SourceError                  (index.sources.contract) a synced source is configured wrongly
    ├── SourceFailed                 (index.sources.contract) a synced source cannot be read now
    │   └── SourceCredentialsRejected  the source refused the credentials: an admin must act
    ├── AnswerError                  (core.errors) the answer engine's errors
    │   ├── LLMUnavailable           the model endpoint is missing, refused, timed out or 5xx
    │   ├── BadLinkToken             a passage link's token is tampered, expired or for another doc
    │   ├── RerankerUnavailable      (core.rerank) the cross-encoder reranker cannot be loaded or run
    │   └── LinkSecretUnavailable    the link-signing secret file cannot be read, written, or is empty
    ├── EvalSetError                 (evaluation.inputs) an evaluation file is missing or malformed
    │   └── ComparisonError          (evaluation.compare) two results that cannot be paired query by query
    ├── DownloadFailed               (bot.slack.uploads) a Slack file could not be downloaded
    ├── BadToolCall                  (bot.mcp.tools) an MCP tool call's arguments cannot be used
    ├── NotServed                    (bot.mcp.people) the person an MCP call runs as is of another organisation
    ├── SkillRefused                 (bot.cli.slackbot) Slack did not create or update the Slackbot skill
    ├── CanvasListingFailed          (bot.slack.canvases) a channel's canvases cannot be listed now
    └── AccessCheckUnavailable       (bot.server.readers) who may read a document cannot be checked now

Foreign exceptions (sqlite3, FAISS, pypdf) are translated where they occur,
with ``raise ... from exc``, so callers only ever catch ``KBError``.
"""

from __future__ import annotations


class KBError(Exception):
    """Base class of every error the knowledge base raises on purpose."""


class ExtractionError(KBError):
    """A document's bytes could not be turned into text; ``reason`` says why.

    ``kind`` says what failed as data (stored with the failure, ``failure_kind``):
    each class has its own, and a limit names itself (``time``, ``memory``, ``pages``...);
    ``limit`` is the value of that limit the document went over, when there is one.
    Nothing reads ``reason`` back: it is for a person.
    """

    KIND = "unreadable"

    def __init__(
        self,
        reason: str,
        *,
        filename: str | None = None,
        kind: str | None = None,
        limit: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.filename = filename
        self.kind = kind or self.KIND
        self.limit = limit


class EmptyDocument(ExtractionError):
    """The file is empty or contains no extractable text."""

    KIND = "empty"


class UnsupportedType(ExtractionError):
    """The file is of a type the knowledge base cannot read."""

    KIND = "unsupported"


class TooLarge(ExtractionError):
    """The file is larger than the configured upload limit."""

    KIND = "size"


class OverLimit(ExtractionError):
    """The document has more pages or yields more chunks than the configured limits."""

    KIND = "over_limit"


class ReadingLimit(OverLimit):
    """Reading the document needed more memory or time than one document may take.

    ``kind`` is ``memory``, ``time`` or ``crash`` (the reader process died), ``limit``
    the megabytes or seconds it was allowed.
    """

    def __init__(
        self, reason: str, *, kind: str, limit: float, filename: str | None = None
    ) -> None:
        super().__init__(reason, filename=filename, kind=kind, limit=limit)


class ReaderRefused(ExtractionError):
    """A reader process sent what a reader never sends: not read, whatever it said.

    Its messages are data (JSON) checked before use; one that is not what a
    reader sends (another format, too big, the wrong shape) is refused unread.
    """

    KIND = "reader"


class ReadersUnconfined(KBError):
    """``KB_READER_SANDBOX=required`` and the document readers cannot be confined here."""


class CorruptDocument(ExtractionError):
    """The file claims a type but its bytes are damaged, encrypted or not that type."""

    KIND = "corrupt"


class DocumentNotFound(KBError):
    """No document matches the given id, name or sha256 prefix."""

    def __init__(self, ref: str) -> None:
        super().__init__(f"No document matches {ref!r}. List documents with `kb docs`.")
        self.ref = ref


class NotAwaitingApproval(KBError):
    """A document was approved or rejected that is not (or no longer) awaiting approval."""


class NotRestorable(KBError):
    """A document asked to be restored is not a replaced version and replaced none."""


class IndexOutOfSync(KBError):
    """A derived index (FAISS or BM25) does not match the chunks in SQLite."""


class ReindexInProgress(KBError):
    """A reindex was requested while another one is still running."""


class QueryNotFound(KBError):
    """No logged question has the given id."""

    def __init__(self, query_id: int) -> None:
        super().__init__(f"No logged question has id {query_id}.")
        self.query_id = query_id


class OriginalMissing(KBError):
    """A document's stored original is no longer in the data dir."""


class DatabaseUnavailable(KBError):
    """The SQLite database of the data dir cannot be opened."""


class StorageError(KBError):
    """The data dir could not be written; the change was rolled back.

    Raised for SQLite's I/O errors and the operating system's refusals to
    write, translated where they happen (``index.storage.store``).
    """


class DiskFull(StorageError):
    """The disk holding the data dir is full; the change was rolled back."""


class DiskSpaceLow(DiskFull):
    """Free space in the data dir is under the configured floor: new documents are refused."""


class DatabaseBusy(StorageError):
    """Another process held SQLite's write lock longer than a write waits; the change was rolled back.

    A write that cannot wait its turn is a write that did not happen, as on a
    full disk: what does not need it (an answer, an upload's progress) goes on.
    """
