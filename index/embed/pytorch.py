"""The local model run with PyTorch through sentence-transformers (``KB_ENCODER_RUNTIME=torch``).

ONNX Runtime (``index.embed.onnx``) is the default and gives the same vectors;
this one needs PyTorch (the ``pytorch`` extra), loaded on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from index.embed.base import (
    DEFAULT_BATCH_SIZE,
    EmbeddingModelUnavailable,
    Prefixes,
    Role,
    chosen_prefixes,
    load_offline,
    pytorch_missing,
    resolve_model,
    stamp_name,
)


class LocalEmbedder:
    """A sentence-transformers model run in this process, in batches.

    Args:
        spec: a ``KB_EMBEDDING_MODEL`` value.
        device: torch device; the product runs on CPU.
        prefixes: what questions and passages are prefixed with; ``None``: the
            model family's (``index.embed.base.family_prefixes``).
    """

    def __init__(self, spec: str, *, device: str = "cpu", prefixes: Prefixes | None = None) -> None:
        self.spec = spec
        model, self._load_from = resolve_model(spec)
        self.prefixes = prefixes or chosen_prefixes(model, None, None)
        self.name = stamp_name(model, self.prefixes)
        self._device = device

    @cached_property
    def _model(self) -> Any:
        self.check_runnable()
        try:
            return load_offline("SentenceTransformer", self._load_from, device=self._device)
        except Exception as exc:  # the library raises many types (OSError, HF errors)
            raise EmbeddingModelUnavailable(
                f"Could not load the embedding model {self.spec!r} ({exc}). Set "
                "KB_EMBEDDING_MODEL to 'bundled:all-MiniLM-L6-v2' or to a local model folder."
            ) from exc

    def check_runnable(self) -> None:
        """See ``Embedder.check_runnable``: PyTorch and sentence-transformers are installed."""
        missing = pytorch_missing(
            "KB_ENCODER_RUNTIME=torch runs the embedding model",
            ", or set KB_ENCODER_RUNTIME=onnx",
        )
        if missing:
            raise EmbeddingModelUnavailable(missing)

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory (it loads on first use)."""
        return "_model" in self.__dict__

    @property
    def dim(self) -> int:
        """Number of dimensions of the vectors."""
        return int(self._model.get_embedding_dimension())

    def expect_dimensions(self, dimensions: int) -> None:
        """See ``Embedder.expect_dimensions``: the model's files say its size."""

    @property
    def max_tokens(self) -> int:
        """The encoder window in word-pieces (special tokens included)."""
        return int(self._model.max_seq_length)

    def count_tokens(self, text: str) -> int:
        """Word-pieces the encoder sees for ``text`` as a passage, prefix and special tokens
        included."""
        return self.count_tokens_many([text])[0]

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        """``count_tokens`` of each text, in one batched tokenizer call."""
        if not texts:
            return []
        given = self.prefixes.add(texts, "document")
        ids = self._model.tokenizer(given, add_special_tokens=True, truncation=False)["input_ids"]
        return [len(x) for x in ids]

    def encode(
        self,
        texts: Sequence[str],
        *,
        role: Role = "document",
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts`` as an ``(n, dim)`` float32 array of unit vectors.

        Args:
            texts: the texts to embed.
            role: what they are (``Embedder.encode``); its prefix is added.
            batch_size: texts per forward pass.
            on_batch: called with the number of texts done after each batch (progress bars).
        """
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = []
        for i in range(0, len(texts), batch_size):
            batch = self.prefixes.add(texts[i : i + batch_size], role)
            vecs = self._model.encode(
                batch,
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
            parts.append(np.asarray(vecs, dtype=np.float32))
            if on_batch:
                on_batch(len(batch))
        return np.ascontiguousarray(np.vstack(parts), dtype=np.float32)

    def encode_query(self, text: str) -> np.ndarray:
        """Embed one question as a ``(dim,)`` unit vector."""
        return self.encode([text], role="query")[0]
