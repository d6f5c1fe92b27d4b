"""One encoder pass per passage: its vector, its sentences' vectors and its latent terms together.

An embedder that offers ``encode_passages`` (``passage_encoder`` tells) gives
a passage's sentence vectors from the token states of the passage's own pass
(the mean of the states of each sentence's tokens) and its latent terms from the
sparse head over the same states, instead of encoding each sentence again and
the passage a second time for the head. Others keep embedding sentences apart
(``index.ingest.sentences.embed_sentences``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from index.embed.base import DEFAULT_BATCH_SIZE, Role
from index.embed.latent import LatentTerms

__all__ = ["Encoded", "PassageEncoder", "Span", "passage_encoder"]

Span = tuple[tuple[int, int], ...]
"""Part of a text: its ranges of characters (``start``, ``end``), pooled together."""


@dataclass
class Encoded:
    """What one pass gives for each text.

    Attributes:
        vectors: ``(n, dim)`` unit vectors, as ``Embedder.encode`` gives them.
        spans: per text, one unit vector per span asked for (``None``: none asked).
        latent: per text, its latent terms (``None``: not asked for).
    """

    vectors: np.ndarray
    spans: list[np.ndarray | None] | None = None
    latent: list[LatentTerms] | None = None


@runtime_checkable
class PassageEncoder(Protocol):
    """An embedder that pools parts of a text from the text's own pass."""

    def encode_passages(
        self,
        texts: Sequence[str],
        spans: Sequence[Sequence[Span]] | None = None,
        *,
        latent: bool = False,
        role: Role = "document",
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Callable[[int], None] | None = None,
    ) -> Encoded:
        """``texts``' vectors and, from the same pass, each span's and the latent terms."""
        ...


def passage_encoder(embedder: object) -> PassageEncoder | None:
    """``embedder`` as a ``PassageEncoder`` if it pools spans from one pass, else ``None``."""
    return embedder if isinstance(embedder, PassageEncoder) else None
