"""The optional cross-encoder reranker (``KB_RERANKER``), applied after the gate has decided.

The gate alone decides whether a question is answered and how many passages
are kept, on dense distances only: refusals never wait for a model. The
reranker then reads the question with each passage that passed the
threshold (not only the kept ones) and chooses which of them are kept, in its
order. It can never bring in a passage the threshold turned away.

The model is a sentence-transformers ``CrossEncoder``, by name or local
folder, loaded like the embedding model: from disk only (``HF_HUB_OFFLINE``),
with PyTorch (the ``pytorch`` extra).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from core.errors import AnswerError
from core.retrieve import Candidate
from index.embed import load_offline, pytorch_missing, resolve_model
from index.records import ChunkRow

RERANK_BATCH_SIZE = 32


class RerankerUnavailable(AnswerError):
    """The configured reranker could not be loaded or run."""


class Reranker:
    """Scores (question, passage) pairs with a cross-encoder; higher is more relevant.

    Args:
        spec: a sentence-transformers CrossEncoder name or a local folder.
        device: torch device; the product runs on CPU.
    """

    def __init__(self, spec: str, *, device: str = "cpu") -> None:
        self.spec = spec
        self.name, self._load_from = resolve_model(spec)
        self._device = device

    @cached_property
    def _model(self) -> Any:
        missing = pytorch_missing(
            f"The reranker {self.spec!r} (KB_RERANKER) runs",
            ", or leave KB_RERANKER empty to rank passages without it",
        )
        if missing:
            raise RerankerUnavailable(missing)
        try:
            return load_offline("CrossEncoder", self._load_from, device=self._device)
        except Exception as exc:  # the library raises many types (OSError, HF errors)
            raise RerankerUnavailable(
                f"Could not load the reranker {self.spec!r} ({exc}). Set KB_RERANKER to a local "
                "CrossEncoder folder, or empty to rank passages without it."
            ) from exc

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory (it loads on first use)."""
        return "_model" in self.__dict__

    def load(self) -> None:
        """Load the model now (a server does at start, not on its first question)."""
        _ = self._model

    def scores(self, question: str, passages: Sequence[str]) -> list[float]:
        """One relevance score per passage for ``question``."""
        if not passages:
            return []
        pairs = [(question, p) for p in passages]
        try:
            raw = self._model.predict(pairs, batch_size=RERANK_BATCH_SIZE, show_progress_bar=False)
        except RerankerUnavailable:
            raise
        except Exception as exc:
            raise RerankerUnavailable(f"The reranker {self.spec!r} failed: {exc}") from exc
        return [float(s) for s in raw]


def passage_text(row: ChunkRow) -> str:
    """What the reranker reads of a passage: the text that was embedded (header and content)."""
    return row.text or row.content


def rerank(
    reranker: Reranker,
    question: str,
    candidates: Sequence[Candidate],
    rows: dict[int, ChunkRow],
    *,
    threshold: float,
    keep: int,
) -> list[Candidate]:
    """The ``keep`` best of the candidates within ``threshold``, in the reranker's order.

    Only candidates that passed the threshold are scored, so a passage the
    gate turned away is never kept; ties keep the fused order. Candidates
    without a row (removed meanwhile) are left out.
    """
    passing = [c for c in candidates if c.distance <= threshold and c.chunk_id in rows]
    if keep <= 0 or not passing:
        return []
    scores = reranker.scores(question, [passage_text(rows[c.chunk_id]) for c in passing])
    order = sorted(range(len(passing)), key=lambda i: -scores[i])
    return [passing[i] for i in order[:keep]]
