"""``kb eval --compare A --compare B``: two configurations of models run through the same set.

A configuration names an embedding model and a reranker, as comma-separated
``key=value`` parts; a part left out keeps the configured setting::

    emb=bundled:all-MiniLM-L6-v2                 # KB_EMBEDDING_MODEL
    emb=openai:text-embedding-3-small            # an embeddings endpoint
    rerank=/models/ms-marco-MiniLM-L-6-v2        # KB_RERANKER (a local CrossEncoder)
    emb=openai:text-embedding-3-small,rerank=none

A bare value (no ``=``) is an embedding model. Both runs index the corpus with
the product's own code and answer the same queries, so ``evaluation.compare``
pairs them query by query.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from core.config import EngineConfig
from evaluation.inputs import EvalSetError
from index.config import IndexConfig

EMBEDDING_KEYS = ("emb", "embedding", "embedding_model")
RERANKER_KEYS = ("rerank", "reranker")
NO_RERANKER = ("", "none", "off")


@dataclass(frozen=True)
class Variant:
    """One configuration of models to evaluate.

    Attributes:
        embedding_model: a ``KB_EMBEDDING_MODEL`` value.
        reranker: a ``KB_RERANKER`` value; empty: none.
    """

    embedding_model: str
    reranker: str = ""

    @property
    def label(self) -> str:
        """How tables name it."""
        return f"emb={self.embedding_model}" + (f",rerank={self.reranker}" if self.reranker else "")

    def index_config(self, base: IndexConfig) -> IndexConfig:
        """``base`` with this embedding model."""
        return replace(base, embedding_model=self.embedding_model)

    def engine_config(self, base: EngineConfig) -> EngineConfig:
        """``base`` with this reranker."""
        return replace(base, reranker=self.reranker)


def parse_variant(spec: str, *, embedding_model: str, reranker: str) -> Variant:
    """The configuration ``spec`` names, over the configured ``embedding_model`` and ``reranker``.

    Raises:
        EvalSetError: a part names no known key, or a value is empty.
    """
    emb, rr = embedding_model, reranker
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep:
            key, value = EMBEDDING_KEYS[0], part
        if key in EMBEDDING_KEYS:
            if not value:
                raise EvalSetError(f"--compare {spec!r}: emb= needs a model.")
            emb = value
        elif key in RERANKER_KEYS:
            rr = "" if value.lower() in NO_RERANKER else value
        else:
            raise EvalSetError(
                f"--compare {spec!r}: unknown part {key!r}; use emb=MODEL and/or rerank=MODEL|none."
            )
    return Variant(emb, rr)
