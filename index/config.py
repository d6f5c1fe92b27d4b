"""What the storage and ingestion layer needs to know, and nothing else.

Built at the entry point from the product's one settings object
(``bot.settings.Settings.index_config``); tests and tools build it directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DATA_DIR = Path("kb-data")
# The multilingual preset (``index.embed.e5``): the people this serves write Czech,
# Danish, French and Romanian as well as English, and all-MiniLM-L6-v2 reads English
# only. A knowledge base built on the earlier default keeps answering on it until
# `kb reindex` (``index.kept_model``).
DEFAULT_EMBEDDING_MODEL = "multilingual"
PREVIOUS_DEFAULT_MODEL = "bundled:all-MiniLM-L6-v2"
# The local model's runtime: ONNX Runtime embeds a query in a fraction of
# PyTorch's time and keeps PyTorch out of the server (bench/footprint.py).
DEFAULT_ENCODER_RUNTIME = "onnx"
ENCODER_RUNTIMES = ("onnx", "torch")
DEFAULT_MAX_UPLOAD_BYTES = 20 * 1024 * 1024
# Seconds one file's download may take in all, from Slack or a source (KB_DOWNLOAD_TIMEOUT).
DEFAULT_DOWNLOAD_TIMEOUT = 120.0
# Characters a passage is packed up to, per model (``index.embed.passage_budget``):
# 512 for MiniLM, whose window is 256 tokens (the seed study's strategy E), and
# for any model an operator brings. The multilingual preset reads 512 tokens;
# its passages of 768 characters found the needle more often on both
# multilingual sets (final R@4 +16/-10 and +15/-10 against 512, 1,024 mixed;
# studies/2026-12-03-multilingual-preset.md).
DEFAULT_CHUNK_BUDGET = 512
MULTILINGUAL_CHUNK_BUDGET = 768
DEFAULT_KEEP_VERSIONS = 5
# A 2,000-page manual passes; one document cannot tie up the indexing slot for
# more than a few minutes (5,000 full chunks take about 2.5 minutes to embed on 2 cores).
DEFAULT_MAX_PAGES = 2000
DEFAULT_MAX_CHUNKS = 5000
# Characters of text one document may extract into, counted while it is read:
# an Office file's parts can be referenced many times (one shared string in
# every cell, one sheet or slide listed again and again), so a 50 KB upload
# could otherwise expand to hundreds of MB of text. 10 million characters is
# a 2,000-page manual (KB_MAX_PAGES) at 5,000 characters a page, and four times
# what KB_MAX_CHUNKS passages of KB_CHUNK_BUDGET characters hold (about 2.6
# million), so an honest document meets the chunk limit first. A hostile file
# stops as it passes the limit: a workbook of one 64 KB shared string in 1,600
# cells stops after 0.3 s and about 40 MB (without the limit: 105 MB of text,
# 290 MB of memory).
DEFAULT_MAX_TEXT_CHARS = 10_000_000
# Room kept free on the data dir's disk: SQLite, the index files and the
# stored originals of the documents already there must still be writable.
DEFAULT_MIN_FREE_BYTES = 200 * 1024 * 1024
DEFAULT_FAILED_RETENTION_DAYS = 7.0
# An embeddings endpoint: texts per request (OpenAI accepts up to 2,048), seconds
# one batch may take with its retries, retries on 429/5xx/connection errors.
DEFAULT_EMBEDDING_BATCH_SIZE = 64
DEFAULT_EMBEDDING_TIMEOUT = 60.0
DEFAULT_EMBEDDING_MAX_RETRIES = 4
# The window assumed for a remote model: OpenAI's embedding models take 8,191
# tokens. Texts are counted by UTF-8 bytes, an upper bound that is far above the
# real count for English, so a window set to a BERT-sized model's (256-512)
# splits most passages needlessly and costs recall (studies/2026-12-01-stronger-models-measured.md); the
# chunk budget keeps passages a few hundred tokens long anyway.
DEFAULT_EMBEDDING_MAX_TOKENS = 8191
# OCR of scanned PDF pages: Tesseract takes about 2 s of CPU per page, 10-20 s
# on a busy 2-core machine (bench/ocr.py): 200 pages hold the indexing slot for
# 7 minutes on an idle machine, and a page that takes a minute is broken.
DEFAULT_OCR_LANGUAGE = "eng"
DEFAULT_OCR_PAGE_TIMEOUT = 60.0
DEFAULT_OCR_MAX_PAGES = 200
DEFAULT_TESSERACT_CMD = "tesseract"
# Reading one untrusted document happens in a reader process of its own
# (index.ingest.isolated) with these limits. The reader's interpreter and its
# libraries take about 200 MB of address space before a document is opened;
# reading a 10 MB Markdown file up to KB_MAX_TEXT_CHARS peaked at 235 MB
# (measured here), so 768 MB is three times that, while two readers at their limit and
# the server (about 600 MB with the ONNX model) still fit a 2 GB machine's memory.
# 120 s is ten times what the slowest honest upload takes to read on a loaded
# 2-core machine; Tesseract's time on scanned pages is counted too (KB_OCR_TIMEOUT
# also bounds each page). Workers 0: min(2, CPU cores), and one more reader for small files.
DEFAULT_EXTRACT_MEMORY_MB = 768
DEFAULT_EXTRACT_TIMEOUT = 120.0
DEFAULT_EXTRACT_WORKERS = 0
# Readers confine themselves with Landlock and a seccomp filter (index.ingest.sandbox):
# auto where the kernel can, required (never read unconfined) or off.
READER_SANDBOX_MODES = ("auto", "required", "off")
DEFAULT_READER_SANDBOX = "auto"


@dataclass(frozen=True)
class EmbeddingEndpoint:
    """An OpenAI-compatible embeddings endpoint (used when the model is ``openai:<name>``).

    Attributes:
        base_url: the endpoint (``.../v1``); empty: the OpenAI API.
        api_key: sent as a bearer token; never in a repr.
        batch_size: texts per request.
        timeout: seconds one batch may take in all, retries and back-off included.
        max_retries: retries of one batch on 408/409/429, 5xx and connection errors.
        max_tokens: the model's window; texts are counted one token per UTF-8 byte.
        dimensions: asked of the endpoint when set (models that can shorten vectors); 0: its own.
    """

    base_url: str = ""
    api_key: str = field(default="", repr=False)
    batch_size: int = DEFAULT_EMBEDDING_BATCH_SIZE
    timeout: float = DEFAULT_EMBEDDING_TIMEOUT
    max_retries: int = DEFAULT_EMBEDDING_MAX_RETRIES
    max_tokens: int = DEFAULT_EMBEDDING_MAX_TOKENS
    dimensions: int = 0


@dataclass(frozen=True)
class OcrConfig:
    """How scanned PDF pages are read (``index.ingest.ocr``).

    Attributes:
        language: Tesseract language(s), ``eng`` or ``eng+deu``.
        page_timeout: seconds Tesseract may spend on one page.
        max_pages: most pages of one document read by OCR.
        tesseract_cmd: the Tesseract program (a name on PATH or a path).
    """

    language: str = DEFAULT_OCR_LANGUAGE
    page_timeout: float = DEFAULT_OCR_PAGE_TIMEOUT
    max_pages: int = DEFAULT_OCR_MAX_PAGES
    tesseract_cmd: str = DEFAULT_TESSERACT_CMD


@dataclass(frozen=True)
class ExtractLimits:
    """What reading one untrusted document may cost (``index.ingest.isolated``).

    Attributes:
        memory_mb: address space of the reader process while it reads one
            document (``RLIMIT_AS``), its interpreter included.
        timeout: seconds one document may take to read, on the wall clock (the
            reader is killed) and in processor time (``RLIMIT_CPU``); the time
            Tesseract spends on scanned pages is counted too (``OcrConfig.page_timeout``
            also bounds each page).
        workers: reader processes, the most documents read at once; 0: min(2, CPU cores).
        sandbox: how readers are confined (``index.ingest.sandbox``): ``auto`` where the
            kernel can, ``required`` (read nothing unconfined) or ``off``.
    """

    memory_mb: int = DEFAULT_EXTRACT_MEMORY_MB
    timeout: float = DEFAULT_EXTRACT_TIMEOUT
    workers: int = DEFAULT_EXTRACT_WORKERS
    sandbox: str = DEFAULT_READER_SANDBOX

    @property
    def pool_size(self) -> int:
        """How many reader processes run at most."""
        return self.workers if self.workers > 0 else min(2, os.cpu_count() or 1)


@dataclass(frozen=True)
class IndexConfig:
    """Where the knowledge base lives and how documents become searchable chunks.

    Attributes:
        data_dir: folder of the SQLite database, the derived index files and the originals.
        database_url: a ``postgresql://`` URL of the database shared by replicas
            (originals included); empty: SQLite in ``data_dir``. A secret: never in a repr.
        embedding_model: ``bundled:all-MiniLM-L6-v2``, ``multilingual`` (the
            multilingual preset, ``index.embed.e5``), a local folder, a model
            name, or ``openai:<model>`` for ``embedding_endpoint``.
        query_prefix: put before every question; ``None``: the model family's
            (``index.embed.base.family_prefixes``), ``""``: nothing.
        document_prefix: put before every passage, likewise.
        embedding_endpoint: the endpoint of an ``openai:`` model.
        encoder_runtime: what runs a local model: ``onnx`` (an export kept in
            ``encoders/`` in the data dir) or ``torch``; the vectors agree.
        encoder_cache: where ONNX exports are kept; None: ``encoders/`` in the data dir.
        search_engine: the ``SearchIndex`` engine (``index.search.SEARCH_ENGINES``).
        qdrant_url: the Qdrant engine of ``search_engine`` ``qdrant``: a server's URL;
            empty, an embedded engine in the data dir (one process at a time).
        qdrant_api_key: the Qdrant server's API key; never in a repr.
        max_upload_bytes: largest document accepted.
        chunk_budget: chunk size budget in characters; ``None``: the model's
            (``index.embed.passage_budget``).
        keep_versions: versions kept of each document name and scope: the
            current one and the earlier ones ``KnowledgeBase.restore`` can bring back.
        max_pages: most pages one PDF may have, checked before any text is extracted.
        max_chunks: most chunks one document may yield, checked before any is embedded.
        max_text_chars: most characters of text one document may extract into, counted
            while it is read (``index.ingest.office.TextBudget``).
        min_free_bytes: free space the data dir's disk must keep; new documents
            that would leave less are refused before anything is stored.
        failed_retention_days: days a failed document (its row and stored
            original) is kept for a retry before it is deleted.
        ocr: how scanned PDF pages are read.
        extract: the limits of reading one document in a reader process;
            ``None``: read in this process, without limits (tools that trust their files).
        query_adapter: fit and apply the knowledge base's query map (``index.search.query_map``).
        latent_terms: store each passage's latent terms when the model has a sparse
            head (``index.embed.latent``); a second encoder pass per passage.
    """

    data_dir: Path = DEFAULT_DATA_DIR
    database_url: str = field(default="", repr=False)
    embedding_model: str = DEFAULT_EMBEDDING_MODEL
    query_prefix: str | None = None
    document_prefix: str | None = None
    encoder_runtime: str = DEFAULT_ENCODER_RUNTIME
    encoder_cache: Path | None = None
    search_engine: str = "local"
    qdrant_url: str = ""
    qdrant_api_key: str = field(default="", repr=False)
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    chunk_budget: int | None = None
    keep_versions: int = DEFAULT_KEEP_VERSIONS
    max_pages: int = DEFAULT_MAX_PAGES
    max_chunks: int = DEFAULT_MAX_CHUNKS
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES
    failed_retention_days: float = DEFAULT_FAILED_RETENTION_DAYS
    query_adapter: bool = True
    latent_terms: bool = True
    embedding_endpoint: EmbeddingEndpoint = field(default_factory=EmbeddingEndpoint)
    ocr: OcrConfig = field(default_factory=OcrConfig)
    extract: ExtractLimits | None = field(default_factory=ExtractLimits)
