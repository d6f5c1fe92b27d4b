"""Typed records of what the store reads and writes.

``DocumentRow`` has exactly the columns of ``documents``, ``QueryRecord``
those of ``query_log`` (less its id and time) and ``AuditEntry`` those of
``audit``, so a misspelt field is a ``TypeError`` where it is written, never a
new column in someone's database.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from index.models import AuditAction, DocState, Publish

__all__ = [
    "AUDIT_COLUMNS",
    "DOCUMENT_COLUMNS",
    "QUERY_COLUMNS",
    "AskedQuestion",
    "AuditEntry",
    "ChunkRow",
    "DislikedAnswer",
    "DocumentFacts",
    "DocumentRow",
    "LoggedQuestion",
    "QueryRecord",
    "Stamp",
]


@dataclass(frozen=True)
class DocumentRow:
    """One row of ``documents``.

    Attributes:
        name: the file name it was uploaded as.
        title: a human title (empty until indexing finds one, unless given).
        sha256: the stored original's digest (``Store.original_path``).
        kind: detected type (``md``, ``txt``, ``html``, ``pdf``); empty until indexed.
        scope: who may see it: ``index.models.EVERYONE`` or a channel id.
        failure_reason: why it is ``failed``, for a person.
        failure_kind: what the failure was, as data (``index.errors.ExtractionError.kind``:
            ``time``, ``memory``, ``pages``, ``corrupt``, ``interrupted``...).
        failure_limit: the value of the limit it went over, when it went over one.
        window_splits: chunks split further to fit the encoder's window.
        text_length: length of the canonical text, in code points.
        page_starts: for paged documents, the comma-separated offsets where pages start.
        embedding_model, dimensions, pipeline_version, extractor_version: the
            ``Stamp`` it was indexed with.
        replaces: unused (kept for data dirs that have it); see ``replaced_by``.
        worker_pid: the process indexing it, while ``indexing`` (for people: a pid
            is reused, see ``worker``).
        created_at, updated_at, indexed_at: Unix times.
        publish: how it may become searchable (who added it where).
        replaced_by: for a ``replaced`` version, the document that replaced it.
        worker: while ``indexing``, the lock id of the process indexing it (``index.storage.workers``).
        language: the language most of its passages are written in (ISO 639-1,
            ``index.languages``); ``None`` until indexed or when none could be told.
    """

    id: int
    name: str
    title: str
    sha256: str
    kind: str
    size: int
    uploader: str
    scope: str
    state: DocState
    failure_reason: str | None
    chunk_count: int
    window_splits: int
    text_length: int
    page_starts: str | None
    embedding_model: str | None
    dimensions: int | None
    pipeline_version: str | None
    extractor_version: str | None
    replaces: int | None
    worker_pid: int | None
    created_at: float
    updated_at: float
    indexed_at: float | None
    publish: Publish = Publish.DIRECT
    replaced_by: int | None = None
    worker: str | None = None
    language: str | None = None
    failure_kind: str | None = None
    failure_limit: float | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> DocumentRow:
        """The record of a row selected with ``DOCUMENT_COLUMNS``."""
        return cls(**{**row, "state": DocState(row["state"]), "publish": Publish(row["publish"])})


DOCUMENT_COLUMNS = tuple(f.name for f in fields(DocumentRow))


@dataclass(frozen=True)
class DocumentFacts:
    """Document columns learnt while indexing, written with its chunks."""

    title: str
    kind: str
    text_length: int
    page_starts: str | None
    language: str | None = None


@dataclass(frozen=True)
class QueryRecord:
    """One question's outcome, as the query log keeps it.

    Attributes:
        scopes: the scopes the asker may see, or ``[index.models.ALL_SCOPES]``
            when nothing was restricted.
        outcome: how it ended (``core.answer.Outcome``).
        kept: ``(chunk id, distance)`` of each passage that passed the gate
            (for ``related``, of each possibly related passage shown).
        cited: chunk ids of the sources the answer cites.
        invalid_citations: citations that named no source.
        timings: milliseconds per stage.
        thread_id: the conversation thread the question was asked in.
        nearest: ``(chunk id, distance)`` of the closest passage retrieved,
            whatever the outcome (a refusal's near miss, for the knowledge gaps).
        beside: ``(chunk id, distance)`` of each possibly related passage an
            answer listed beside its sources (never given to the model).
        surface: where it was asked: ``slack``, ``cli`` (``kb ask``), or ``mcp`` (a tool
            call of an agent).
        client: for ``mcp``, the name of the token the call came with.
    """

    question: str
    scopes: Sequence[str]
    outcome: str
    model_called: bool
    kept: Sequence[tuple[int, float]]
    cited: Sequence[int]
    invalid_citations: Sequence[str]
    latency_ms: float
    timings: Mapping[str, float]
    user: str | None = None
    channel: str | None = None
    thread_id: str | None = None
    answer: str | None = None
    nearest: tuple[int, float] | None = None
    beside: Sequence[tuple[int, float]] = ()
    surface: str = "slack"
    client: str | None = None

    def to_row(self) -> dict[str, Any]:
        """The columns' values (lists and mappings as JSON)."""
        return {
            "question": self.question,
            "scopes": json.dumps(list(self.scopes)),
            "outcome": self.outcome,
            "model_called": int(self.model_called),
            "kept": json.dumps([list(k) for k in self.kept]),
            "cited": json.dumps(list(self.cited)),
            "invalid_citations": json.dumps(list(self.invalid_citations)),
            "latency_ms": self.latency_ms,
            "timings": json.dumps(dict(self.timings)),
            "user": self.user,
            "channel": self.channel,
            "thread_id": self.thread_id,
            "answer": self.answer,
            "nearest": json.dumps(list(self.nearest)) if self.nearest else None,
            "beside": json.dumps([list(b) for b in self.beside]) if self.beside else None,
            "surface": self.surface,
            "client": self.client,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> QueryRecord:
        """The record of a row selected with ``QUERY_COLUMNS``."""
        return cls(
            question=row["question"],
            scopes=tuple(json.loads(row["scopes"])),
            outcome=row["outcome"],
            model_called=bool(row["model_called"]),
            kept=tuple((int(c), float(d)) for c, d in json.loads(row["kept"])),
            cited=tuple(json.loads(row["cited"])),
            invalid_citations=tuple(json.loads(row["invalid_citations"])),
            latency_ms=row["latency_ms"],
            timings=json.loads(row["timings"]),
            user=row["user"],
            channel=row["channel"],
            thread_id=row["thread_id"],
            answer=row["answer"],
            nearest=_pair(row["nearest"]),
            beside=tuple((int(c), float(d)) for c, d in json.loads(row["beside"] or "[]")),
            surface=row["surface"],
            client=row["client"],
        )


def _pair(raw: str | None) -> tuple[int, float] | None:
    """A JSON ``[chunk id, distance]`` column, or ``None``."""
    if not raw:
        return None
    chunk_id, distance = json.loads(raw)
    return int(chunk_id), float(distance)


QUERY_COLUMNS = tuple(f.name for f in fields(QueryRecord))


@dataclass(frozen=True)
class AskedQuestion:
    """One row of the query log as ``kb questions`` lists it: who asked what, where, and when.

    Attributes:
        id: its row of the query log.
        at: when it was asked (Unix time).
        record: what was logged.
    """

    id: int
    at: float
    record: QueryRecord

    def to_dict(self) -> dict[str, Any]:
        """Its fields as plain data (for ``--json``)."""
        return {"id": self.id, "at": self.at, **asdict(self.record)}


@dataclass(frozen=True)
class LoggedQuestion:
    """A logged question as the knowledge gaps read it.

    Attributes:
        id: its row of the query log.
        scopes: as in ``QueryRecord``.
        kept: as in ``QueryRecord``: ``(chunk id, distance)`` pairs.
        created_at: when it was asked (Unix time).
        channel: the conversation it was asked in (``None`` outside Slack).
        nearest: as in ``QueryRecord``.
        user: who asked (a Slack user id; ``None`` outside Slack).
    """

    id: int
    question: str
    outcome: str
    kept: tuple[tuple[int, float], ...]
    scopes: tuple[str, ...]
    created_at: float
    channel: str | None = None
    nearest: tuple[int, float] | None = None
    user: str | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LoggedQuestion:
        """The record of a row of ``query_log``."""
        return cls(
            id=int(row["id"]),
            question=row["question"],
            outcome=row["outcome"],
            kept=tuple((int(c), float(d)) for c, d in json.loads(row["kept"])),
            scopes=tuple(json.loads(row["scopes"])),
            created_at=float(row["created_at"]),
            channel=row.get("channel"),
            nearest=_pair(row.get("nearest")),
            user=row.get("user"),
        )


@dataclass(frozen=True)
class DislikedAnswer:
    """A logged answer that got a thumbs-down, for an admin to review.

    Attributes:
        id: its row of the query log.
        answer: the text the asker was shown (``None`` if it was not logged).
        user, channel, thread_id: who asked, and where.
        created_at: when it was asked (Unix time).
        dislikes: how many people gave it a thumbs-down.
        disliked_at: the latest thumbs-down (Unix time).
    """

    id: int
    question: str
    answer: str | None
    outcome: str
    user: str | None
    channel: str | None
    thread_id: str | None
    created_at: float
    dislikes: int
    disliked_at: float


@dataclass(frozen=True)
class ChunkRow:
    """A stored chunk with the facts about its document that answers need."""

    id: int
    document_id: int
    document: str
    kind: str
    scope: str
    ordinal: int
    section: str
    start: int
    end: int
    page: int | None
    content: str
    text: str
    language: str | None = None


@dataclass(frozen=True)
class Stamp:
    """What a document's vectors and chunks were made with."""

    embedding_model: str
    dimensions: int
    pipeline_version: str
    extractor_version: str


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    """One change to the knowledge base: who did what to which document, and when.

    Attributes:
        id: its position in the log (0 until written).
        at: Unix time (set when written).
        actor: the Slack user id, or ``cli`` for the operator's ``kb`` commands.
        document_id, name, scope: the document changed (none for a reindex).
        old_sha256: the content it replaced or removed, if any.
        new_sha256: the content it added, if any.
        detail: anything else worth knowing, for a person.
    """

    id: int = 0
    at: float = 0.0
    actor: str
    action: AuditAction
    document_id: int | None = None
    name: str = ""
    scope: str = ""
    old_sha256: str | None = None
    new_sha256: str | None = None
    detail: str = ""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AuditEntry:
        """The record of a row selected with ``AUDIT_COLUMNS``."""
        return cls(**{**row, "action": AuditAction(row["action"])})

    def to_dict(self) -> dict[str, Any]:
        """Its fields as plain JSON values."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"action": str(self.action)}


AUDIT_COLUMNS = tuple(f.name for f in fields(AuditEntry))
