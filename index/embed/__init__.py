"""Embedding models: one ``Embedder`` contract; ONNX Runtime, PyTorch and remote implementations.

Operators may name ``multilingual`` (multilingual-e5-small, ``index.embed.e5``),
a local folder or a sentence-transformers model name in ``KB_EMBEDDING_MODEL``
instead of the bundled copy, or ``openai:<model>`` for an OpenAI-compatible
embeddings endpoint (``index.embed.remote``). Asymmetric models are given their
family's question and passage prefixes (``Prefixes``), unless the operator
sets their own. A local model
runs with ONNX Runtime (``index.embed.onnx``, the default) or PyTorch
(``index.embed.pytorch``); both give the same vectors. ``load_embedder`` picks
the implementation from ``KB_EMBEDDING_MODEL`` and ``KB_ENCODER_RUNTIME``; each
is imported only when chosen, so the server never loads PyTorch it does not use.
A model with a sparse head also gives texts their latent terms (``index.embed.latent``),
and one that pools a passage's parts from its own pass gives its sentences'
vectors with it (``index.embed.passages``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from index.config import DEFAULT_CHUNK_BUDGET, MULTILINGUAL_CHUNK_BUDGET
from index.embed.base import (
    BUNDLED_MODEL_NAME,
    DEFAULT_BATCH_SIZE,
    Embedder,
    EmbeddingModelUnavailable,
    Prefixes,
    Role,
    StoreModelUnavailable,
    chosen_prefixes,
    family_prefixes,
    is_bundled,
    pytorch_missing,
    resolve_model,
)
from index.embed.e5 import MULTILINGUAL_MODEL_NAME, MULTILINGUAL_PRESET
from index.embed.latent import LatentEncoder, LatentTerms, latent_encoder
from index.embed.passages import Encoded, PassageEncoder, Span, passage_encoder

if TYPE_CHECKING:
    from index.config import IndexConfig

from index.embed.base import load_offline

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "Embedder",
    "EmbeddingModelUnavailable",
    "Encoded",
    "LatentEncoder",
    "LatentTerms",
    "MULTILINGUAL_MODEL_NAME",
    "MULTILINGUAL_PRESET",
    "PassageEncoder",
    "Prefixes",
    "Role",
    "Span",
    "StoreModelUnavailable",
    "chosen_prefixes",
    "family_prefixes",
    "latent_encoder",
    "load_embedder",
    "load_offline",
    "model_name",
    "passage_budget",
    "passage_encoder",
    "pytorch_missing",
    "resolve_model",
]


def load_embedder(config: IndexConfig) -> Embedder:
    """The embedder ``config.embedding_model`` names: an endpoint's for ``openai:``, else local,
    run by ``config.encoder_runtime``.

    Raises:
        EmbeddingModelUnavailable: the runtime is neither ``onnx`` nor ``torch``, or the
            bundled model's files are not installed.
    """
    from index.config import ENCODER_RUNTIMES
    from index.embed.remote import REMOTE_PREFIX, RemoteEmbedder

    spec = config.embedding_model
    if spec.strip().lower() == MULTILINGUAL_PRESET:
        from index.embed.e5 import E5Embedder
        from index.embed.onnx import ENCODERS_DIR

        return E5Embedder(
            spec,
            config.encoder_cache or config.data_dir / ENCODERS_DIR,
            prefixes=_operator_prefixes(config, MULTILINGUAL_MODEL_NAME),
        )
    base = spec[len(REMOTE_PREFIX) :] if spec.startswith(REMOTE_PREFIX) else resolve_model(spec)[0]
    prefixes = _operator_prefixes(config, base) or chosen_prefixes(base, None, None)
    if spec.startswith(REMOTE_PREFIX):
        return RemoteEmbedder(spec, config.embedding_endpoint, prefixes)
    if config.encoder_runtime not in ENCODER_RUNTIMES:
        raise EmbeddingModelUnavailable(
            f"KB_ENCODER_RUNTIME is {config.encoder_runtime!r}; set it to 'onnx' or 'torch'."
        )
    if config.encoder_runtime == "onnx":
        from index.embed.onnx import ENCODERS_DIR, OnnxEmbedder

        cache = config.encoder_cache or config.data_dir / ENCODERS_DIR
        return OnnxEmbedder(spec, cache, prefixes=prefixes)
    from index.embed.pytorch import LocalEmbedder

    return LocalEmbedder(spec, prefixes=prefixes)


def _operator_prefixes(config: IndexConfig, model: str) -> Prefixes | None:
    """The prefixes the operator set (each unset one the family's), or ``None`` if neither is set."""
    if config.query_prefix is None and config.document_prefix is None:
        return None
    return chosen_prefixes(model, config.query_prefix, config.document_prefix)


def passage_budget(config: IndexConfig, embedder: Embedder) -> int:
    """Characters a passage is packed up to: ``chunk_budget``, else the running model's own.

    The embedder that runs decides, not ``config.embedding_model``: a knowledge
    base kept on its earlier model (``index.kept_model``) or given an embedder
    cuts passages for the model that reads them.
    """
    if config.chunk_budget is not None:
        return config.chunk_budget
    if embedder.name.startswith(MULTILINGUAL_MODEL_NAME):
        return MULTILINGUAL_CHUNK_BUDGET
    return DEFAULT_CHUNK_BUDGET


def model_name(spec: str) -> str:
    """The name ``spec`` (a ``KB_EMBEDDING_MODEL`` value) is known by, without loading it
    (nor its package: a knowledge base opens without the bundled model's files)."""
    if spec.strip().lower() == MULTILINGUAL_PRESET:
        return MULTILINGUAL_MODEL_NAME
    if is_bundled(spec):
        return BUNDLED_MODEL_NAME
    from index.embed.remote import REMOTE_PREFIX

    return spec if spec.startswith(REMOTE_PREFIX) else resolve_model(spec)[0]
