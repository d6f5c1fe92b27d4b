"""The chunking strategies the evaluation compares with the product's chunker.

The study behind the product's chunker built six strategies from three
independent ingredients and measured them on the same questions:

===  ============================  =========================================
A    blind                         cut every ``budget`` characters
B    blind + overlap               A, each chunk also carries the last 64
                                   characters of the previous one
C    boundaries                    never cut inside a paragraph (E's cuts)
D    boundaries + overlap          C with the 64-character overlap
E    boundaries + header           the product: ``index.ingest.chunk.chunk_document``
F    boundaries + header + overlap E with the 64-character overlap
===  ============================  =========================================

C, D and F are derived from E's own chunks, so the ablation changes one
ingredient at a time: C has exactly E's cuts and differs only by the missing
header, which is how the study separated "boundaries" from "header".

Offsets are always found in the canonical text. For the non-overlap strategies
``canonical[start:end] == content``. For the overlap strategies ``content`` is
the previous chunk's tail followed by the chunk's own words (the study's
definition: that is what gets embedded and quoted), and ``start`` moves back
so that ``canonical[start:end] == content`` still holds.

Only ``kb eval --strategies`` uses this module; the product indexes with E.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import replace

from index.ingest import chunk_document
from index.models import Chunk, Chunking, Extracted

Chunker = Callable[[Extracted], Chunking]
"""What ``KnowledgeBase(chunker=...)`` accepts: canonical text in, chunks out."""

OVERLAP_CHARS = 64
"""Characters of the previous chunk copied into the next one (the study's value)."""

PRODUCT = "E"
"""The strategy the product ships (``index.ingest.chunk.chunk_document``)."""

STRATEGIES: dict[str, str] = {
    "A": "blind",
    "B": "blind + overlap",
    "C": "boundaries",
    "D": "boundaries + overlap",
    "E": "boundaries + header (product)",
    "F": "boundaries + header + overlap",
}
"""Strategy letter -> short description, in the study's order."""


def blind(extracted: Extracted, *, size: int) -> Chunking:
    """Strategy A: cut the canonical text every ``size`` characters, looking at nothing.

    Surrounding whitespace is trimmed from each piece (offsets adjusted), and
    all-blank pieces are dropped; nothing else is skipped, heading lines included.

    Args:
        extracted: the document.
        size: characters per cut, at least 1.

    Returns:
        Chunks whose ``text`` is their ``content`` (no header).
    """
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    text = extracted.text
    chunks: list[Chunk] = []
    for cut in range(0, len(text), size):
        piece = text[cut : cut + size]
        content = piece.strip()
        if not content:
            continue
        start = cut + (len(piece) - len(piece.lstrip()))
        chunks.append(
            Chunk(
                ordinal=len(chunks),
                start=start,
                end=start + len(content),
                content=content,
                text=content,
                section="",
                page=_page(extracted, start),
            )
        )
    return Chunking(chunks)


def without_header(chunking: Chunking) -> Chunking:
    """Strategy C from E: the same chunks, embedding only their own words."""
    return Chunking(
        [replace(c, text=c.content) for c in chunking.chunks],
        window_splits=chunking.window_splits,
        notes=list(chunking.notes),
    )


def with_overlap(
    chunking: Chunking, extracted: Extracted, *, overlap: int = OVERLAP_CHARS
) -> Chunking:
    """Prepend the previous chunk's last ``overlap`` characters to each chunk.

    The new ``start`` is ``overlap`` characters before the previous chunk's
    end (never before its start), and ``content`` becomes
    ``canonical[start:end]``: the tail, whatever lies between the two chunks
    (a heading line, blank lines), then the chunk's own words. A header, if
    the chunk had one, stays in front of ``text``.

    Args:
        chunking: chunks of one document, in order.
        extracted: the document they were cut from.
        overlap: characters to carry over.

    Returns:
        The overlapping chunks (the first chunk is unchanged).
    """
    canonical = extracted.text
    out: list[Chunk] = []
    for prev, chunk in zip([None, *chunking.chunks], chunking.chunks, strict=False):
        if prev is None or overlap <= 0:
            out.append(chunk)
            continue
        start = max(prev.start, prev.end - overlap)
        # A tail that begins inside whitespace would quote a stray blank.
        while start < chunk.start and canonical[start].isspace():
            start += 1
        content = canonical[start : chunk.end]
        out.append(
            replace(
                chunk,
                start=start,
                content=content,
                text=_header_of(chunk) + content,
                page=_page(extracted, start),
            )
        )
    return Chunking(out, window_splits=chunking.window_splits, notes=list(chunking.notes))


def make_chunker(
    name: str,
    *,
    budget: int,
    count_tokens: Callable[[str], int],
    max_tokens: int,
) -> Chunker | None:
    """The chunker of one strategy, for ``KnowledgeBase(chunker=...)``.

    Args:
        name: a strategy letter, ``A`` to ``F``.
        budget: the chunk budget in characters (the blind cut size too, so
            every strategy is compared at the same size).
        count_tokens: the embedder's word-piece counter (E splits by it).
        max_tokens: the encoder window.

    Returns:
        The chunker, or ``None`` for E: the product's own code path is used
        unchanged.

    Raises:
        ValueError: for an unknown strategy.
    """
    name = name.upper()
    if name not in STRATEGIES:
        raise ValueError(f"unknown chunking strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    if name == PRODUCT:
        return None

    def product(extracted: Extracted) -> Chunking:
        return chunk_document(
            extracted, budget=budget, count_tokens=count_tokens, max_tokens=max_tokens
        )

    chunkers: dict[str, Chunker] = {
        "A": lambda ex: blind(ex, size=budget),
        "B": lambda ex: with_overlap(blind(ex, size=budget), ex),
        "C": lambda ex: without_header(product(ex)),
        "D": lambda ex: with_overlap(without_header(product(ex)), ex),
        "F": lambda ex: with_overlap(product(ex), ex),
    }
    return chunkers[name]


def _header_of(chunk: Chunk) -> str:
    # The product builds ``text`` as header + content; whatever precedes the
    # content is the header, whatever its exact format.
    if not chunk.text.endswith(chunk.content):
        raise ValueError(
            f"chunk {chunk.ordinal}: its text does not end with its content, "
            "so its header cannot be separated for the overlap variant"
        )
    return chunk.text[: len(chunk.text) - len(chunk.content)]


def _page(extracted: Extracted, offset: int) -> int | None:
    if not extracted.page_starts:
        return None
    return bisect.bisect_right(extracted.page_starts, offset)
