"""Errors of the storage and ingestion layer.

Every error the product raises on purpose derives from ``KBError``::

    KBError
    ├── ExtractionError      a document's bytes could not become text
    │   ├── EmptyDocument
    │   ├── UnsupportedType
    │   ├── TooLarge
    │   └── CorruptDocument
    ├── DocumentNotFound     no document matches a reference
    ├── IndexOutOfSync       derived indexes disagree with SQLite
    ├── ReindexInProgress    a second reindex was asked for while one runs
    └── (core.errors)        AnswerError, LLMUnavailable, BadLinkToken ...

Foreign exceptions (sqlite3, FAISS, pypdf) are translated where they occur,
with ``raise ... from exc``, so callers only ever catch ``KBError``.
"""

from __future__ import annotations


class KBError(Exception):
    """Base class of every error the knowledge base raises on purpose."""


class ExtractionError(KBError):
    """A document's bytes could not be turned into text; ``reason`` says why."""

    def __init__(self, reason: str, *, filename: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.filename = filename


class EmptyDocument(ExtractionError):
    """The file is empty or contains no extractable text."""


class UnsupportedType(ExtractionError):
    """The file is of a type the knowledge base cannot read."""


class TooLarge(ExtractionError):
    """The file is larger than the configured upload limit."""


class CorruptDocument(ExtractionError):
    """The file claims a type but its bytes are damaged, encrypted or not that type."""


class DocumentNotFound(KBError):
    """No document matches the given id, name or sha256 prefix."""

    def __init__(self, ref: str) -> None:
        super().__init__(f"No document matches {ref!r}. List documents with `kb docs`.")
        self.ref = ref


class IndexOutOfSync(KBError):
    """A derived index (FAISS or BM25) does not match the chunks in SQLite."""


class ReindexInProgress(KBError):
    """A reindex was requested while another one is still running."""
