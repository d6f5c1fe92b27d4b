"""Ingestion: bytes -> canonical text (+ page map) -> chunks, and each chunk's sentences.

``extract`` detects the type from the content and reads text, HTML, PDF (``ocr``
for scanned pages), Office files (``office``, ``office_zip``, ``sheets``);
``chunk`` cuts the canonical text at its boundaries with a contextual header;
``pipeline`` runs the stages, embedding included, without touching the database;
``isolated`` reads untrusted bytes in reader processes with memory and time limits,
each confined by ``sandbox`` to what reading needs.
"""

from __future__ import annotations

from index.ingest.chunk import SHEET_KINDS, chunk_document, markdown_structure, sheet_columns
from index.ingest.formats import EXTRACTOR_VERSION, FOLDER_SUFFIXES, SUPPORTED_SUFFIXES
from index.ingest.isolated import over_reading_limit
from index.ingest.ocr import ocr_pages
from index.ingest.pipeline import PIPELINE_VERSION, Prepared, prepare_document
from index.ingest.sandbox import readers_status
from index.ingest.sentences import from_blob, sentence_texts, to_blob

__all__ = [
    "EXTRACTOR_VERSION",
    "FOLDER_SUFFIXES",
    "PIPELINE_VERSION",
    "Prepared",
    "SHEET_KINDS",
    "SUPPORTED_SUFFIXES",
    "chunk_document",
    "from_blob",
    "markdown_structure",
    "ocr_pages",
    "over_reading_limit",
    "prepare_document",
    "readers_status",
    "sentence_texts",
    "sheet_columns",
    "to_blob",
]
