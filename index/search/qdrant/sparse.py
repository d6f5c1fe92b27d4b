"""BM25 as Qdrant sparse vectors: the product's own terms hashed to indices, Okapi's values.

Qdrant multiplies a stored value by the IDF ``index.search.bm25`` uses, so the
stored value is the term-frequency saturation with length normalisation.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from index.search.bm25 import DEFAULT_B, DEFAULT_K1
from index.search.tokens import ANALYZER

if TYPE_CHECKING:
    pass


def term_index(term: str) -> int:
    """A term's sparse-vector index: the first 32 bits of its BLAKE2b hash."""
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8"), digest_size=4).digest(), "big")


def query_sparse(
    text: str, languages: Sequence[str | None] = (None,)
) -> tuple[list[int], list[float]]:
    """A question's sparse vector, analysed in ``languages``: each term's count (rank-bm25
    counts a repeated term each time)."""
    counts = Counter(term_index(t) for t in ANALYZER.query_terms(text, languages))
    return list(counts), [float(c) for c in counts.values()]


def bm25_values(
    terms: Sequence[str], avgdl: float, *, k1: float = DEFAULT_K1, b: float = DEFAULT_B
) -> tuple[list[int], list[float]]:
    """A chunk's sparse vector: Okapi's saturated, length-normalised term frequencies."""
    counts = Counter(term_index(t) for t in terms)
    norm = k1 * (1.0 - b + b * len(terms) / avgdl)
    return list(counts), [tf * (k1 + 1.0) / (tf + norm) for tf in counts.values()]
