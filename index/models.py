"""Plain data passed between the ingestion stages and to the layers above."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

EVERYONE = "*"  # the scope of a document every channel may see
# Logged as a question's scopes when nothing restricted what it could see. Not
# EVERYONE: asked with the scopes {EVERYONE}, a question sees only the documents
# for everyone, like a direct message (logged as no scopes at all).
ALL_SCOPES = "*all*"
# What a synced source's documents are credited to, before the source's id: never
# a person, so no upload is credited so. A source's documents and uploads of the
# same name and scope never replace each other (``KnowledgeBase``).
SOURCE_UPLOADER_PREFIX = "source:"


def source_uploader(source_id: str) -> str:
    """Who the documents of the synced source ``source_id`` are credited to."""
    return f"{SOURCE_UPLOADER_PREFIX}{source_id}"


def is_source_uploader(uploader: str) -> bool:
    """Whether ``uploader`` is a synced source's (its documents are kept apart from uploads)."""
    return uploader.startswith(SOURCE_UPLOADER_PREFIX)


class OnlyScopes(frozenset[str]):
    """Scopes that do **not** bring the documents for everyone with them.

    A plain set of scopes always sees the everyone-scoped documents too. This
    one is for a place where even those must stay out: a channel shared with
    other organisations sees only what was added to that channel.
    """


class DocState(StrEnum):
    """Life cycle of a document row."""

    PENDING = "pending"  # stored original, waiting to be indexed
    INDEXING = "indexing"  # a worker is extracting / chunking / embedding it
    INDEXED = "indexed"  # its chunks are committed and searchable
    FAILED = "failed"  # extraction or indexing failed; `failure_reason` says why; retryable
    AWAITING_APPROVAL = "awaiting_approval"  # indexed, not searchable until an admin approves it
    REPLACED = "replaced"  # an earlier version, kept (original and text) so it can be restored


class Publish(StrEnum):
    """How a document may become searchable: decided by who added it where, kept on its row."""

    DIRECT = "direct"  # searchable once indexed; replaces older versions of its name and scope
    OWN = "own"  # searchable once indexed; replaces only its uploader's own older versions
    APPROVAL = "approval"  # waits for an admin's approval, then publishes like DIRECT


class AuditAction(StrEnum):
    """What an audit entry records."""

    ADD = "add"
    REPLACE = "replace"
    REMOVE = "remove"
    SUBMIT = "submit"  # sent for approval
    APPROVE = "approve"
    REJECT = "reject"
    REINDEX = "reindex"
    RESTORE = "restore"
    PRUNE = "prune"  # an old replaced version deleted beyond ``IndexConfig.keep_versions``
    READERS = "readers"  # who reads a synced source's documents changed (``kb source readers``)


# Every ``Extracted.kind`` a reader may give.
EXTRACTED_KINDS = frozenset({"md", "txt", "html", "pdf", "docx", "pptx", "xlsx", "csv"})


@dataclass(frozen=True)
class Extracted:
    """The canonical text of one document; every chunk offset refers to ``text``.

    Attributes:
        text: canonical text (newlines normalised to ``\\n``).
        title: a human title (first heading, HTML <title>, PDF metadata or file stem).
        kind: detected type: ``md``, ``txt``, ``html``, ``pdf``, ``docx``, ``pptx``,
            ``xlsx`` or ``csv``.
        page_starts: for paged formats, the offset in ``text`` where each page
            starts (``page_starts[0] == 0``); ``None`` otherwise.
    """

    text: str
    title: str
    kind: str
    page_starts: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Chunk:
    """One retrievable passage of a document.

    Invariant: ``canonical[start:end] == content``.

    Attributes:
        ordinal: position of the chunk in its document, from 0.
        start, end: code-point offsets of ``content`` in the canonical text.
        content: the chunk's own words, quoted back to users.
        text: contextual header + content; what is embedded and BM25-indexed.
        section: ``Section > Subsection`` path ("" before the first heading).
        page: 1-based page of ``start`` for paged documents, else ``None``.
        language: the language its content is written in (``index.languages``;
            its document's when the passage alone cannot tell), ``None`` when unknown.
    """

    ordinal: int
    start: int
    end: int
    content: str
    text: str
    section: str
    page: int | None = None
    language: str | None = None


@dataclass(frozen=True)
class Chunking:
    """The result of chunking one document.

    Attributes:
        chunks: the chunks, in document order.
        window_splits: how many chunks had to be split further because their
            embedded ``text`` would not fit the encoder's word-piece window.
        too_many_headings: the most headings it could have, when the document
            had more and was not chunked (``index.ingest.chunk.HEADINGS_PER_PASSAGE``).
    """

    chunks: list[Chunk]
    window_splits: int = 0
    notes: list[str] = field(default_factory=list)
    too_many_headings: int | None = None
