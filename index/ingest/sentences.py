"""A chunk's sentences, embedded beside it: a ranking signal, never the gate's.

A passage of several sentences is one averaged vector; a question is often
about one of its sentences. Each sentence of a chunk is embedded with the
chunk's heading path (``header + "\\n" + sentence``, the way the chunk itself
is embedded), and an answered question's candidates are re-ordered by their
best sentence (``core.retrieve.sentence_order``). The gate, the related
passages and every distance shown or logged stay on the chunk vectors: measured
on both bundled sets, sentence scores made the gate much worse
(docs/evaluation.md).

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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

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


def sentences(content: str) -> list[str]:
    """The sentences of a chunk's content, in order."""
    out: list[str] = []
    for para in _PARAGRAPH.finditer(content):
        text = para.group()
        pieces, pos = [], 0
        for _, end in sentence_ends(text):
            pieces.append(text[pos:end])
            pos = end
        pieces.append(text[pos:])
        out += _joined([" ".join(p.split()) for p in pieces if p.strip()])
    return _at_most(out, max(MIN_SENTENCES_CAP, len(content) // MIN_CHARS))


def _at_most(parts: list[str], most: int) -> list[str]:
    """``parts`` joined, in order, into ``most`` runs of nearly equal counts, if there are more."""
    if len(parts) <= most:
        return parts
    n = len(parts)
    return [" ".join(parts[i * n // most : (i + 1) * n // most]) for i in range(most)]


def _joined(pieces: list[str]) -> list[str]:
    """A paragraph's pieces, each short one joined to the one before (or after, if first)."""
    out: list[str] = []
    for piece in pieces:
        if out and (len(piece) < MIN_CHARS or len(out[-1]) < MIN_CHARS):
            out[-1] = f"{out[-1]} {piece}"
        else:
            out.append(piece)
    return out


def sentence_texts(text: str, content: str) -> list[str]:
    """What is embedded for a chunk's sentences (its ``text``: header, newline, content).

    Empty for a chunk of one sentence.
    """
    parts = sentences(content)
    header = text[: len(text) - len(content)].rstrip("\n") if text.endswith(content) else ""
    if len(parts) < 2:
        return []
    return [f"{header}\n{s}" if header else s for s in parts]


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
    "sentence_texts",
    "sentences",
    "to_blob",
]
