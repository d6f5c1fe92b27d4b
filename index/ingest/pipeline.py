"""The pure ingestion pipeline: bytes -> canonical text -> chunks -> vectors.

Nothing here touches the database; ``index.knowledge_base`` records the
result and moves the document through its states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from index.config import (
    DEFAULT_MAX_CHUNKS,
    DEFAULT_MAX_PAGES,
    DEFAULT_MAX_TEXT_CHARS,
    ExtractLimits,
    OcrConfig,
)
from index.embed import Embedder, LatentTerms, latent_encoder, passage_encoder
from index.errors import EmptyDocument, OverLimit
from index.ingest.chunk import CHUNKER_VERSION, chunk_document
from index.ingest.formats import EXTRACTOR_VERSION
from index.ingest.isolated import read_isolated
from index.ingest.sentences import SENTENCES_VERSION, embed_sentences, sentence_spans
from index.languages import passage_languages
from index.models import Chunking, Extracted
from index.near_copies import Signature, signature
from index.records import Stamp

# Stamped on every document: bump when chunking, headers or extraction change
# in a way that changes chunks or their sentence vectors, so older documents
# are reported stale (and ``kb reindex`` embeds them again).
PIPELINE_VERSION = f"chunker-{CHUNKER_VERSION}+sentences-{SENTENCES_VERSION}"


@dataclass(frozen=True)
class Prepared:
    """Everything needed to commit one document's chunks."""

    extracted: Extracted
    chunking: Chunking
    vectors: np.ndarray
    token_counts: list[int]
    # Per chunk, its sentences' vectors (``None``: one sentence); see index.ingest.sentences.
    sentence_vectors: list[np.ndarray | None] | None = None
    # The language most of its passages are in (index.languages), None when none was told.
    language: str | None = None
    # Per chunk, its latent terms (index.embed.latent); None: the model has no sparse head.
    latent_terms: list[LatentTerms] | None = None
    # What the vectors were made with, set by the knowledge base that embedded them: a
    # document is stamped with the model that embedded it, even when the knowledge base
    # moved to another model before it was committed (None: the committing one's).
    stamp: Stamp | None = None
    # The text's near-copy signature (index.near_copies); None: the text has no word.
    near: Signature | None = None


def prepare_document(
    data: bytes,
    filename: str,
    *,
    embedder: Embedder,
    max_bytes: int,
    budget: int,
    max_pages: int = DEFAULT_MAX_PAGES,
    max_chunks: int = DEFAULT_MAX_CHUNKS,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
    title: str | None = None,
    on_batch: Callable[[int], None] | None = None,
    on_chunked: Callable[[int], None] | None = None,
    chunker: Callable[[Extracted], Chunking] | None = None,
    ocr: OcrConfig | None = None,
    limits: ExtractLimits | None = None,
    owner: str = "",
    latent_terms: bool = False,
) -> Prepared:
    """Extract, chunk and embed one document.

    Args:
        max_pages: most pages of a PDF, counted before any text is extracted.
        max_chunks: most chunks, counted before any is embedded.
        max_text_chars: most characters of text, counted while the bytes are read.
        on_batch: called with the number of passages embedded after each batch.
        on_chunked: called with the number of passages to embed, before the first is.
        chunker: replaces the product's chunker; ``kb eval --strategies`` uses it
            to index a corpus with the study's other chunking strategies.
        ocr: how scanned PDF pages are read.
        latent_terms: also give each chunk its latent terms, if the model has a sparse head.
        limits: read the bytes in a reader process within these limits
            (``index.ingest.isolated``); ``None``: in this process, without limits.
        owner: whose document it is (a reader is shared fairly among owners).

    Raises:
        ExtractionError: the bytes cannot become text, hold no text to index, or
            are over a limit (``OverLimit``; ``ReadingLimit`` over ``limits``).
    """
    if limits is None:
        # In this process only without limits (tools, tests): the server reads in readers.
        from index.ingest.extract import extract

        extracted = extract(
            data,
            filename,
            max_bytes=max_bytes,
            max_pages=max_pages,
            max_text_chars=max_text_chars,
            ocr=ocr,
        )
    else:
        extracted = read_isolated(
            data,
            filename,
            limits=limits,
            max_bytes=max_bytes,
            max_pages=max_pages,
            max_text_chars=max_text_chars,
            ocr=ocr,
            owner=owner,
        )
    if title:
        extracted = Extracted(
            text=extracted.text, title=title, kind=extracted.kind, page_starts=extracted.page_starts
        )
    if chunker is not None:
        chunking = chunker(extracted)
    else:
        chunking = chunk_document(
            extracted,
            budget=budget,
            count_tokens=embedder.count_tokens,
            max_tokens=embedder.max_tokens,
            max_chunks=max_chunks,
        )
    if chunking.too_many_headings is not None:
        raise OverLimit(
            f"{filename} is too long to index: it has more than "
            f"{chunking.too_many_headings:,} headings, the limit per document (twice "
            "KB_MAX_CHUNKS). Split it into smaller files, or ask an admin to raise KB_MAX_CHUNKS.",
            filename=filename,
            kind="chunks",
            limit=max_chunks,
        )
    if len(chunking.chunks) > max_chunks:
        raise OverLimit(
            f"{filename} is too long to index: it makes more than {max_chunks:,} passages, "
            "the limit per document. Split it into smaller files, or ask an admin to raise "
            "KB_MAX_CHUNKS.",
            filename=filename,
            kind="chunks",
            limit=max_chunks,
        )
    if not chunking.chunks:
        raise EmptyDocument(
            f"{filename} has no text to index (it may contain only headings or whitespace).",
            filename=filename,
        )
    chunking, language = with_languages(chunking)
    texts = [c.text for c in chunking.chunks]
    if on_chunked:
        on_chunked(len(texts))
    token_counts = embedder.count_tokens_many(texts)
    head = latent_encoder(embedder) if latent_terms else None
    one_pass = passage_encoder(embedder)
    if one_pass is not None:
        encoded = one_pass.encode_passages(
            texts,
            [sentence_spans(c.text, c.content) for c in chunking.chunks],
            latent=head is not None,
            on_batch=on_batch,
        )
        vectors, sentence_vectors, latents = encoded.vectors, encoded.spans, encoded.latent
    else:
        vectors = embedder.encode(texts, on_batch=on_batch)
        sentence_vectors = embed_sentences(embedder, chunking.chunks)
        latents = head.encode_latent(texts) if head is not None else None
    return Prepared(
        extracted,
        chunking,
        vectors,
        token_counts,
        sentence_vectors,
        language,
        latents,
        near=signature(extracted.text),
    )


def with_languages(chunking: Chunking) -> tuple[Chunking, str | None]:
    """``chunking`` with each chunk's language set, and the document's (``index.languages``)."""
    languages, document = passage_languages([c.content for c in chunking.chunks])
    chunks = [replace(c, language=code) for c, code in zip(chunking.chunks, languages, strict=True)]
    return replace(chunking, chunks=chunks), document


__all__ = ["EXTRACTOR_VERSION", "PIPELINE_VERSION", "Prepared", "prepare_document"]
