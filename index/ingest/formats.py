"""Which files are read, and the version of the reading: what the server needs of ``extract``.

Apart from ``extract`` so that the server, which reads documents only in
reader processes, never loads the parsers (PDF, HTML, Office) to know them.
"""

from __future__ import annotations

from index.ingest.office_zip import LEGACY_SUFFIXES, OFFICE_SUFFIXES

__all__ = ["EXTRACTOR_VERSION", "FOLDER_SUFFIXES", "SUPPORTED_SUFFIXES", "SUPPORTED_TYPES"]

# Stamped on documents: bump whenever the same bytes would extract differently.
EXTRACTOR_VERSION = "2"

SUPPORTED_SUFFIXES: tuple[str, ...] = (
    ".md", ".markdown", ".txt", ".html", ".htm", ".xhtml", ".pdf", *OFFICE_SUFFIXES, ".csv", ".tsv",
)  # fmt: skip
# The files of a folder that are ingested: those read, and legacy Office files,
# which fail with the advice to save them in the modern format.
FOLDER_SUFFIXES: tuple[str, ...] = SUPPORTED_SUFFIXES + LEGACY_SUFFIXES
SUPPORTED_TYPES = (
    "Markdown (.md), plain text (.txt), HTML (.html), PDF (.pdf), Word (.docx), "
    "PowerPoint (.pptx), Excel (.xlsx), their macro-enabled and template variants, and CSV (.csv)"
)
