"""Embedding models: one ``Embedder`` contract; ONNX Runtime, PyTorch and remote implementations.

Operators may name a local folder or a sentence-transformers model name in
``KB_EMBEDDING_MODEL`` instead of the bundled copy, or ``openai:<model>`` for an
OpenAI-compatible embeddings endpoint (``index.embed.remote``). A local model
runs with ONNX Runtime (``index.embed.onnx``, the default) or PyTorch
(``index.embed.pytorch``); both give the same vectors. ``load_embedder`` picks
the implementation from ``KB_EMBEDDING_MODEL`` and ``KB_ENCODER_RUNTIME``; each
is imported only when chosen, so the server never loads PyTorch it does not use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from index.embed.base import (
    DEFAULT_BATCH_SIZE,
    Embedder,
    EmbeddingModelUnavailable,
    resolve_model,
)

if TYPE_CHECKING:
    from index.config import IndexConfig

from index.embed.base import load_offline

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "Embedder",
    "EmbeddingModelUnavailable",
    "load_embedder",
    "load_offline",
    "resolve_model",
]


def load_embedder(config: IndexConfig) -> Embedder:
    """The embedder ``config.embedding_model`` names: an endpoint's for ``openai:``, else local,
    run by ``config.encoder_runtime``.

    Raises:
        EmbeddingModelUnavailable: the runtime is neither ``onnx`` nor ``torch``.
    """
    from index.config import ENCODER_RUNTIMES
    from index.embed.remote import REMOTE_PREFIX, RemoteEmbedder

    if config.embedding_model.startswith(REMOTE_PREFIX):
        return RemoteEmbedder(config.embedding_model, config.embedding_endpoint)
    if config.encoder_runtime not in ENCODER_RUNTIMES:
        raise EmbeddingModelUnavailable(
            f"KB_ENCODER_RUNTIME is {config.encoder_runtime!r}; set it to 'onnx' or 'torch'."
        )
    if config.encoder_runtime == "onnx":
        from index.embed.onnx import ENCODERS_DIR, OnnxEmbedder

        cache = config.encoder_cache or config.data_dir / ENCODERS_DIR
        return OnnxEmbedder(config.embedding_model, cache)
    from index.embed.pytorch import LocalEmbedder

    return LocalEmbedder(config.embedding_model)
