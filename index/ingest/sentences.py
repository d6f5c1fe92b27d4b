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

An embedder that pools a passage's parts from its own pass
(``index.embed.passages``) is given where each sentence lies instead
(``sentence_spans``), and no sentence is embedded again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from index.embed import Span
from index.ingest.chunk import _PARAGRAPH, _SENTENCE_END
from index.models import Chunk

if TYPE_CHECKING:
    from index.embed import Embedder

# Stamped on documents through ``index.ingest.pipeline.PIPELINE_VERSION``: bump when
# the same chunk would get other sentence vectors.
SENTENCES_VERSION = "1"
MIN_CHARS = 20
# Whether a sentence pooled from its passage's pass (``sentence_spans``) takes in the
# heading path's tokens too, as a sentence embedded apart reads it.
SPANS_WITH_HEADER = False


def sentences(content: str) -> list[str]:
    """The sentences of a chunk's content, in order."""
    out: list[str] = []
    for para in _PARAGRAPH.finditer(content):
        text = para.group()
        pieces, pos = [], 0
        for m in _SENTENCE_END.finditer(text):
            pieces.append(text[pos : m.end()])
            pos = m.end()
        pieces.append(text[pos:])
        out += _joined([" ".join(p.split()) for p in pieces if p.strip()])
    return out


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
    ranges: list[tuple[int, int]] = []
    for para in _PARAGRAPH.finditer(content):
        piece_text = para.group()
        bounds, pos = [], 0
        for m in _SENTENCE_END.finditer(piece_text):
            bounds.append((pos, m.end()))
            pos = m.end()
        bounds.append((pos, len(piece_text)))
        # The same joining as ``_joined``, on each piece's collapsed length.
        joined: list[tuple[int, int, int]] = []
        for a, b in bounds:
            size = len(" ".join(piece_text[a:b].split()))
            if not size:
                continue
            if joined and (size < MIN_CHARS or joined[-1][2] < MIN_CHARS):
                start, _, before = joined[-1]
                joined[-1] = (start, b, before + 1 + size)
            else:
                joined.append((a, b, size))
        at = offset + para.start()
        ranges += [(at + a, at + b) for a, b, _ in joined]
    if len(ranges) < 2:
        return []
    return [(*head, r) for r in ranges]


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
    "SENTENCES_VERSION",
    "embed_sentences",
    "from_blob",
    "sentence_spans",
    "sentence_texts",
    "sentences",
    "to_blob",
]
