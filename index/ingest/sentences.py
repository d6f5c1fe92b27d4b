"""A chunk's sentences, embedded beside it: a ranking signal, never the gate's.

A passage of several sentences is one averaged vector; a question is often
about one of its sentences. Each sentence of a chunk is embedded with the
chunk's heading path (``header + "\\n" + sentence``, the way the chunk itself
is embedded), and an answered question's candidates are re-ordered by their
best sentence (``core.retrieve.sentence_order``). The gate, the related
passages and every distance shown or logged stay on the chunk vectors: measured
on both bundled sets, sentence scores made the gate much worse
(studies/2026-12-01-sentence-vectors.md).

Sentences: the chunk's paragraphs (``index.ingest.chunk``'s pattern) cut at sentence
ends (the chunker's own pattern), whitespace collapsed; a piece under
``MIN_CHARS`` characters joins its neighbour ("e.g." is no sentence). A chunk
of one sentence has no sentence vectors: its chunk vector says the same.

A chunk has at most one sentence per ``MIN_CHARS`` characters of its content
(``MIN_SENTENCES_CAP`` in a shorter one): past that (a chunk of 170 one-word
paragraphs, each its own piece) consecutive sentences are joined into that many,
so a full chunk embeds at most one sentence per 20 characters, whatever its
shape. No chunk of the bundled evaluation sets reaches it (at most 25 sentences
in 768 characters; 4 in a chunk of 67).

An embedder that pools a passage's parts from its own pass
(``index.embed.passages``) is given where each sentence lies instead
(``sentence_spans``), and no sentence is embedded again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from index.embed import Span
from index.ingest.chunk import _PARAGRAPH, sentence_ends
from index.models import Chunk

if TYPE_CHECKING:
    from index.embed import Embedder

# Stamped on documents through ``index.ingest.pipeline.PIPELINE_VERSION``: bump when
# the same chunk would get other sentence vectors.
SENTENCES_VERSION = "1"
MIN_CHARS = 20
# A short chunk (a list of related links) keeps up to this many sentences whatever its length.
MIN_SENTENCES_CAP = 8
# Whether a sentence pooled from its passage's pass (``sentence_spans``) takes in the
# heading path's tokens too, as a sentence embedded apart reads it.
SPANS_WITH_HEADER = False


def sentences(content: str) -> list[str]:
    """The sentences of a chunk's content, in order."""
    return [" ".join(content[a:b].split()) for a, b in _sentence_ranges(content)]


def _sentence_ranges(content: str) -> list[tuple[int, int]]:
    """Where each of ``sentences``' sentences lies in ``content``: one splitter for both."""
    ranges: list[tuple[int, int]] = []
    for para in _PARAGRAPH.finditer(content):
        text = para.group()
        bounds, pos = [], 0
        for _, end in sentence_ends(text):
            bounds.append((pos, end))
            pos = end
        bounds.append((pos, len(text)))
        at = para.start()
        ranges += [(at + a, at + b) for a, b in _joined(text, bounds)]
    return _at_most(ranges, max(MIN_SENTENCES_CAP, len(content) // MIN_CHARS))


def _at_most(ranges: list[tuple[int, int]], most: int) -> list[tuple[int, int]]:
    """``ranges`` joined, in order, into ``most`` runs of nearly equal counts, if there are more."""
    if len(ranges) <= most:
        return ranges
    n = len(ranges)
    runs = [ranges[i * n // most : (i + 1) * n // most] for i in range(most)]
    return [(run[0][0], run[-1][1]) for run in runs]


def _joined(text: str, bounds: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A paragraph's pieces, each short one joined to the one before (or after, if first).

    Lengths are of the pieces' words joined by single spaces, as ``sentences`` shows them;
    blank pieces are left out.
    """
    out: list[tuple[int, int, int]] = []
    for a, b in bounds:
        size = len(" ".join(text[a:b].split()))
        if not size:
            continue
        if out and (size < MIN_CHARS or out[-1][2] < MIN_CHARS):
            start, _, before = out[-1]
            out[-1] = (start, b, before + 1 + size)
        else:
            out.append((a, b, size))
    return [(a, b) for a, b, _ in out]


def sentence_texts(text: str, content: str) -> list[str]:
    """What is embedded for a chunk's sentences (its ``text``: header, newline, content).

    Empty for a chunk of one sentence.
    """
    parts = sentences(content)
    header = text[: len(text) - len(content)].rstrip("\n") if text.endswith(content) else ""
    if len(parts) < 2:
        return []
    return [f"{header}\n{s}" if header else s for s in parts]


def sentence_spans(text: str, content: str, *, header: bool = SPANS_WITH_HEADER) -> list[Span]:
    """Where each of ``sentence_texts``' sentences lies in the chunk's ``text``.

    Each sentence is a range of ``text``; with ``header`` the chunk's heading
    path is pooled with it, as ``sentence_texts`` puts the header before it. Empty
    for a chunk of one sentence (or a text that does not end with its content).
    """
    if not text.endswith(content):
        return []
    offset = len(text) - len(content)
    head: tuple[tuple[int, int], ...] = ((0, offset),) if header and offset else ()
    ranges = _sentence_ranges(content)
    if len(ranges) < 2:
        return []
    return [(*head, (offset + a, offset + b)) for a, b in ranges]


def embed_sentences(embedder: Embedder, chunks: Sequence[Chunk]) -> list[np.ndarray | None]:
    """Each chunk's sentence vectors (``None`` for one sentence), embedded shortest first.

    Sorting by length keeps each batch's padding small: sentences vary from a
    few words to a whole paragraph.
    """
    texts = [sentence_texts(c.text, c.content) for c in chunks]
    flat = [t for ts in texts for t in ts]
    order = sorted(range(len(flat)), key=lambda i: len(flat[i]))
    vectors = np.zeros((len(flat), embedder.dim), dtype=np.float32)
    if flat:
        vectors[order] = embedder.encode([flat[i] for i in order])
    out: list[np.ndarray | None] = []
    at = 0
    for ts in texts:
        out.append(vectors[at : at + len(ts)] if ts else None)
        at += len(ts)
    return out


def to_blob(vectors: np.ndarray | None) -> bytes | None:
    """A chunk's sentence vectors as stored (``None``: it has none)."""
    if vectors is None or not len(vectors):
        return None
    return np.ascontiguousarray(vectors, dtype=np.float32).tobytes()


def from_blob(blob: bytes, dimensions: int) -> np.ndarray:
    """Stored sentence vectors back as an ``(n, dimensions)`` array."""
    return np.frombuffer(blob, dtype=np.float32).reshape(-1, dimensions)


__all__ = [
    "MIN_CHARS",
    "MIN_SENTENCES_CAP",
    "SENTENCES_VERSION",
    "embed_sentences",
    "from_blob",
    "sentence_spans",
    "sentence_texts",
    "sentences",
    "to_blob",
]
