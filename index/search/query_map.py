"""A query-side linear map learnt from the knowledge base itself, for the hybrid dense leg.

Employees ask in their own words; the model was not trained on the company's
vocabulary. The corpus itself says what its passages are about: each sentence
of a chunk (its stored sentence vector, ``index.ingest.sentences``) should find that
chunk among the others. A 384 x 384 matrix ``W``, starting at the identity, is
fitted so that ``normalise(W s)`` ranks the sentence's own chunk first against
sampled other chunks (softmax over cosine similarities, as in-batch-negatives
training of the model itself, here on frozen vectors: numpy, no PyTorch, a few
seconds on 2 cores). A model that pools its sentence vectors from the passage's
own pass (``index.embed.passages``, the multilingual preset) stores sentence
vectors that carry their passage's context; its fit encodes a bounded sample
of the sentences alone instead (``ALONE``; tens of seconds, at the fit only).
At query time the hybrid search re-scores its dense and BM25 candidates with
``normalise(W q)`` for the fusion.

What it never touches: chunk vectors, the FAISS index, the distances the gate
refuses on, anything shown or logged (every distance stays the model's own).
Only the order of the hybrid fusion changes. Measured on both bundled sets in
studies/2026-12-02-query-map.md.

The map is stored in the store's ``meta`` table (every replica and engine
reads the same one), stamped with the model and dimensions it was fitted on;
a map of another model is never applied. It is fitted again when the
searchable chunks have changed by a tenth since the last fit: a map fitted on
fewer documents is still a map of the same model, only less tuned.

Where the fit runs is the knowledge base's choice: in the writer's thread
(the offline tools: ``kb ingest``, ``kb eval``, ``kb reindex``, deterministic),
or, in the server, on a thread of its own (``BackgroundFits``): the writer
returns once its passages are searchable, searches keep the map in use until
the new one is written whole (map and stamp in one transaction) and read. A
server's move to another model (``core.switch``) asks that thread for the new
model's map too: the searches held for the move do not wait for its fit, and
search in the new model's order (or on the map the store keeps for that model,
never another model's) until it is written.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from index.embed import Embedder, passage_encoder
from index.errors import KBError
from index.ingest import from_blob, sentence_texts
from index.storage import Store

__all__ = [
    "MAX_DIMENSIONS",
    "BackgroundFits",
    "FitStopped",
    "QueryAdapter",
    "QueryAdapters",
    "fit_matrix",
    "meta_keys",
]

log = logging.getLogger(__name__)

# One map per model and size (``meta_keys``): a store holding two models' chunks
# (a migration under way) keeps both maps. Beside each, the stamp (model,
# dimensions, when fitted) read every RELOAD_SECONDS instead of the map itself;
# written after the map, so a reader that sees a new stamp reads the new map.
META_KEY = "query_adapter"
STAMP_KEY = "query_adapter_stamp"
# Chunks whose sentences are used, and sentences at most: the fit stays a few
# seconds whatever the corpus size (a sample of a large corpus teaches as much).
MAX_CHUNKS = 4096
MAX_ANCHORS = 16_384
# A model that pools its sentence vectors from the passage's own pass
# (``index.embed.passages``) stores vectors that carry the passage's context: a
# map fitted on them learns little of how a question, a short text alone, looks.
# Its fit encodes at most this many of the sampled sentences alone instead (as a
# model without one pass stores them), whatever the corpus size: ingestion stays
# one pass. Measured in
# studies/2026-12-07-query-map-sentences.md.
ALONE = 2048
# Fewer sentences than this teach nothing reliable: no map, the model's order.
MIN_ANCHORS = 64
# The matrix is dimensions squared: a 1,536-dimension endpoint model would need
# 9 MB in the meta table and minutes of fitting, for an effect not measured.
MAX_DIMENSIONS = 1024
# Refit when the searchable chunks differ from the fitted count by this share.
REFIT_SHARE = 0.1
# How often a process looks for a map another process fitted (seconds).
RELOAD_SECONDS = 5.0
# The recipe, chosen on pip-black and confirmed on prometheus
# (studies/2026-12-02-query-map.md).
EPOCHS = 5
BATCH = 256
NEGATIVES = 1024
SCALE = 20.0
LEARNING_RATE = 1e-3
SEED = 0
# How much lower the server's fitting thread runs than the rest of the process
# (Linux: that thread's own nice value): questions embedded during a fit of tens
# of seconds get the cores first.
FIT_NICENESS = 10


class QueryAdapterError(KBError):
    """A stored map that cannot be read (damaged, or of another shape)."""


class FitStopped(Exception):
    """A fit given up before it wrote anything: the server stops, or its model was replaced."""


Stopped = Callable[[], bool]
"""Asked between batches of a fit: ``True`` gives the fit up (``FitStopped``)."""


def _check(stopped: Stopped | None) -> None:
    if stopped is not None and stopped():
        raise FitStopped("the fit was stopped before it wrote a map")


@dataclass(frozen=True)
class QueryAdapter:
    """A fitted map and what it was fitted on.

    Attributes:
        matrix: ``(dim, dim)`` float32; a query ``q`` becomes ``normalise(matrix @ q)``.
        embedding_model: the model whose vectors it maps.
        chunks: searchable chunks when it was fitted (the refit rule counts from it).
        anchors: sentences it was fitted on.
        fitted_at: when (epoch seconds).
    """

    matrix: np.ndarray
    embedding_model: str
    chunks: int
    anchors: int
    fitted_at: float

    @property
    def dimensions(self) -> int:
        """The vector size it maps."""
        return int(self.matrix.shape[0])

    def apply(self, vector: np.ndarray) -> np.ndarray:
        """``vector`` mapped and normalised to unit length (float32)."""
        mapped = self.matrix @ np.asarray(vector, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(mapped))
        return (mapped / norm if norm > 0 else mapped).astype(np.float32)

    def to_meta(self) -> str:
        """The JSON text stored under ``meta.query_adapter``."""
        raw = np.ascontiguousarray(self.matrix, dtype="<f4").tobytes()
        return json.dumps(
            {
                "embedding_model": self.embedding_model,
                "dimensions": self.dimensions,
                "chunks": self.chunks,
                "anchors": self.anchors,
                "fitted_at": self.fitted_at,
                "matrix": base64.b64encode(raw).decode("ascii"),
            }
        )

    @classmethod
    def from_meta(cls, text: str) -> QueryAdapter:
        """The map stored as ``to_meta`` wrote it.

        Raises:
            QueryAdapterError: the text is not such a map.
        """
        try:
            data = json.loads(text)
            dim = int(data["dimensions"])
            raw = base64.b64decode(data["matrix"], validate=True)
            matrix = np.frombuffer(raw, dtype="<f4").reshape(dim, dim).astype(np.float32)
            adapter = cls(
                matrix=matrix,
                embedding_model=str(data["embedding_model"]),
                chunks=int(data["chunks"]),
                anchors=int(data["anchors"]),
                fitted_at=float(data["fitted_at"]),
            )
        except Exception as exc:  # any damage (overflow, nesting, shape) is one refusal
            raise QueryAdapterError(
                f"The stored query map cannot be read ({type(exc).__name__}: {exc})."
            ) from exc
        if not np.isfinite(adapter.matrix).all():
            raise QueryAdapterError("The stored query map holds values that are not numbers.")
        return adapter

    def stamp(self) -> str:
        """What names this map among the ones ever stored (its stamp key's value)."""
        return f"{self.embedding_model}|{self.dimensions}|{self.fitted_at!r}"

    def describe(self) -> dict[str, object]:
        """What ``kb status`` shows of it."""
        return {
            "embedding_model": self.embedding_model,
            "chunks": self.chunks,
            "sentences": self.anchors,
            "fitted_at": self.fitted_at,
        }


def fit_matrix(
    anchors: np.ndarray,
    positives: np.ndarray,
    chunks: np.ndarray,
    *,
    seed: int = SEED,
    stopped: Stopped | None = None,
) -> np.ndarray:
    """``W`` (from the identity) ranking each ``anchors[i]`` nearest its chunk ``chunks[positives[i]]``.

    Adam on the softmax cross-entropy of ``SCALE * normalise(W a) . c`` over the
    positive and ``NEGATIVES`` sampled chunks of each batch. Deterministic for a
    seed. Anchors and chunks are unit vectors.

    Its matrix products run on one BLAS thread: the library's own threads would
    escape the lowered priority of the server's fit thread (``FIT_NICENESS``; they
    are made at import, at normal priority), spin against the questions on a
    small machine (three times the CPU of one thread for the same fit on 2
    cores), and sum in an order that depends on how many there are.

    Raises:
        FitStopped: ``stopped()`` said so before a batch.
    """
    with threadpool_limits(limits=1, user_api="blas"):
        return _fitted(anchors, positives, chunks, seed=seed, stopped=stopped)


def _fitted(
    anchors: np.ndarray,
    positives: np.ndarray,
    chunks: np.ndarray,
    *,
    seed: int,
    stopped: Stopped | None,
) -> np.ndarray:
    """``fit_matrix``'s Adam, on the BLAS threads its caller allows."""
    rng = np.random.default_rng(seed)
    dim = anchors.shape[1]
    eye = np.eye(dim)
    w = eye.copy()
    m, v = np.zeros_like(w), np.zeros_like(w)
    pool = chunks.astype(np.float64)
    step = 0
    for _ in range(EPOCHS):
        order = rng.permutation(len(anchors))
        for at in range(0, len(order), BATCH):
            _check(stopped)
            rows = order[at : at + BATCH]
            grad = _gradient(w, anchors[rows].astype(np.float64), positives[rows], pool, rng)
            step += 1
            m = 0.9 * m + 0.1 * grad
            v = 0.999 * v + 0.001 * grad * grad
            m_hat, v_hat = m / (1 - 0.9**step), v / (1 - 0.999**step)
            w -= LEARNING_RATE * m_hat / (np.sqrt(v_hat) + 1e-8)
    return w.astype(np.float32)


def _gradient(
    w: np.ndarray,
    anchors: np.ndarray,
    positives: np.ndarray,
    pool: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """d(mean cross-entropy)/dW of one batch."""
    if len(pool) > NEGATIVES:
        sampled = rng.choice(len(pool), NEGATIVES, replace=False)
        columns = np.unique(np.concatenate([positives, sampled]))
        targets = np.searchsorted(columns, positives)
        pool = pool[columns]
    else:
        targets = positives
    mapped = anchors @ w.T
    norms = np.linalg.norm(mapped, axis=1, keepdims=True)
    unit = mapped / norms
    logits = SCALE * unit @ pool.T
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    probs[np.arange(len(anchors)), targets] -= 1.0
    probs /= len(anchors)
    d_unit = SCALE * probs @ pool
    d_mapped = (d_unit - unit * (unit * d_unit).sum(axis=1, keepdims=True)) / norms
    return np.asarray(d_mapped.T @ anchors)


def fit(
    store: Store,
    embedding_model: str,
    dimensions: int,
    ids: np.ndarray,
    *,
    encoder: Embedder | None = None,
    stopped: Stopped | None = None,
) -> QueryAdapter | None:
    """A map fitted on a seeded sample of the searchable chunks ``ids``; ``None`` if too few sentences.

    Its anchors are the chunks' stored sentence vectors, or with ``encoder`` (a
    model pooling them from the passage's pass) at most ``ALONE`` of their
    sentences encoded alone. ``stopped`` is asked after each batch the model
    encodes and before each batch of the fit.

    Raises:
        FitStopped: ``stopped()`` said so.
        ValueError: ``encoder`` gave vectors of another shape, or not numbers; it
            raises what else it raises (``refit_if_due`` logs either, the
            previous map stands).
    """
    rng = np.random.default_rng(SEED)
    sample = ids if len(ids) <= MAX_CHUNKS else np.sort(rng.choice(ids, MAX_CHUNKS, replace=False))
    width = 4 * dimensions
    vectors = {
        int(r["id"]): from_blob(r["vector"], dimensions)[0]
        for r in store.searchable_chunks(embedding_model, dimensions, [int(c) for c in sample])
        if len(r["vector"]) == width  # a damaged row is the index's to report, not the fit's
    }
    row = {c: i for i, c in enumerate(vectors)}
    if encoder is not None:
        anchors, positives = _alone(store, encoder, row, rng, stopped)
    else:
        anchors, positives = _stored(store, dimensions, row, rng)
    if len(anchors) < MIN_ANCHORS:
        return None
    chunks = np.vstack([vectors[c] for c in vectors])
    return QueryAdapter(
        matrix=fit_matrix(anchors, positives, chunks, stopped=stopped),
        embedding_model=embedding_model,
        chunks=len(ids),
        anchors=len(anchors),
        fitted_at=time.time(),
    )


def _stored(
    store: Store, dimensions: int, row: dict[int, int], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The chunks' stored sentence vectors (at most ``MAX_ANCHORS``) and each one's chunk row."""
    sentence_vectors = {
        c: m for c, m in store.sentence_vectors(list(row)).items() if m.shape[1] == dimensions
    }
    owned = [c for c in row if c in sentence_vectors]
    if not owned:
        return np.zeros((0, dimensions), dtype=np.float32), np.zeros(0, dtype=np.int64)
    anchors = np.concatenate([sentence_vectors[c] for c in owned])
    positives = np.concatenate([np.full(len(sentence_vectors[c]), row[c]) for c in owned])
    if len(anchors) > MAX_ANCHORS:
        keep = np.sort(rng.choice(len(anchors), MAX_ANCHORS, replace=False))
        anchors, positives = anchors[keep], positives[keep]
    return anchors, positives


def _alone(
    store: Store,
    encoder: Embedder,
    row: dict[int, int],
    rng: np.random.Generator,
    stopped: Stopped | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``ALONE`` of the chunks' sentences encoded alone, and each one's chunk row.

    Each as a model without one pass embeds it for the sentence leg
    (``sentence_texts``: the heading path, then the sentence; a passage).
    """
    pairs = [
        (row[c], text)
        for c, chunk in sorted(store.chunks_by_id(list(row)).items())
        for text in sentence_texts(chunk.text, chunk.content)
    ]
    if len(pairs) > ALONE:
        pairs = [pairs[i] for i in np.sort(rng.choice(len(pairs), ALONE, replace=False))]
    if len(pairs) < MIN_ANCHORS:  # too few to fit: nothing is encoded
        return np.zeros((0, encoder.dim), dtype=np.float32), np.zeros(0, dtype=np.int64)
    anchors = encoder.encode([t for _, t in pairs], on_batch=lambda _: _check(stopped))
    if anchors.shape != (len(pairs), encoder.dim) or not np.isfinite(anchors).all():
        raise ValueError(f"the model gave sentence vectors of shape {anchors.shape}")
    return anchors, np.array([r for r, _ in pairs], dtype=np.int64)


def meta_keys(embedding_model: str, dimensions: int) -> tuple[str, str]:
    """The ``meta`` keys of a model's map and of its stamp."""
    name = f"{embedding_model}:{dimensions}"
    return f"{META_KEY}:{name}", f"{STAMP_KEY}:{name}"


class QueryAdapters:
    """The map of one knowledge base and model: fitted when due, read from the store, cached.

    Shared by the knowledge base (which refits after its writes) and its search
    index (which applies it). Another process's new map is read within
    ``RELOAD_SECONDS``.

    Args:
        store: where the map is kept (``meta``).
        embedding_model: stamp of the running model; a map of another is ignored.
        dimensions: its vector size.
        enabled: ``False``: never fitted nor applied (``KB_QUERY_ADAPTER=false``).
        reload_seconds: how often the store is asked for another process's new map.
        embedder: the running model; one that pools sentence vectors from its
            passage's pass (``index.embed.passages``) encodes ``ALONE`` sentences
            alone at each fit. ``None``: the stored sentence vectors only.
        fits: where a due fit runs (``refit_if_due``): ``None``, in the caller's
            thread; else on ``fits``' thread (the server's).
    """

    def __init__(
        self,
        store: Store,
        *,
        embedding_model: str,
        dimensions: int,
        enabled: bool = True,
        reload_seconds: float = RELOAD_SECONDS,
        embedder: Embedder | None = None,
        fits: BackgroundFits | None = None,
    ) -> None:
        self.store = store
        self.fits = fits
        self.encoder = embedder if passage_encoder(embedder) is not None else None
        self.embedding_model = embedding_model
        self.dimensions = dimensions
        self.enabled = enabled and dimensions <= MAX_DIMENSIONS
        self.map_key, self.stamp_key = meta_keys(embedding_model, dimensions)
        self._lock = threading.Lock()
        self._adapter: QueryAdapter | None = None
        self._stamp: str | None = None
        self._checked = float("-inf")
        self.reload_seconds = reload_seconds
        # One fit of this map at a time, whichever thread asks (a reindex's forced
        # fit waits for a background one, and its map is the one that stays).
        self._fitting = threading.Lock()
        # Replaced by another model's (``retire``): a fit of it writes nothing.
        self.retired = False

    def status(self) -> dict[str, object] | str:
        """What ``kb status`` and ``kb eval`` show: ``"off"``, ``"none yet"`` or the map in use."""
        if not self.enabled:
            return "off"
        adapter = self.current()
        return adapter.describe() if adapter is not None else "none yet"

    def current(self) -> QueryAdapter | None:
        """The map to apply now, or ``None`` (none fitted, disabled, another model's, unreadable)."""
        if not self.enabled:
            return None
        with self._lock:
            if time.monotonic() - self._checked >= self.reload_seconds:
                self._reload()
            return self._adapter

    def _reload(self) -> None:
        self._checked = time.monotonic()
        try:
            stamp = self.store.get_meta(self.stamp_key)
            if stamp == self._stamp:
                return
            text = self.store.get_meta(self.map_key) if stamp is not None else None
        except Exception as exc:  # a store that cannot be read now must not fail a search
            log.warning(
                "query map not read (%s: %s); the model's order is used", type(exc).__name__, exc
            )
            return
        self._stamp, self._adapter = stamp, None
        if text is None:
            return
        try:
            adapter = QueryAdapter.from_meta(text)
        except QueryAdapterError as exc:
            log.warning("%s The model's order is used until it is fitted again.", exc)
            return
        if (adapter.embedding_model, adapter.dimensions) == (self.embedding_model, self.dimensions):
            self._adapter = adapter

    def refit_if_due(self, *, force: bool = False, wait: bool | None = None) -> QueryAdapter | None:
        """Fit and store a new map when none fits or the chunks changed by ``REFIT_SHARE``.

        With ``fits`` (the server), a fit this does not wait for is only asked of
        ``fits`` (it runs on their thread): this returns at once with the map in
        use now. Otherwise it fits here, before returning.

        Args:
            force: fit even when not due (a reindex rebuilt the chunks).
            wait: fit here even with ``fits``. By default only a ``force``d fit
                does (a reindex's is the writer's); ``False``: a move to this
                model, whose held searches must not wait for its map.

        Never raises for the store or the fit: a knowledge base whose map cannot be
        fitted or written searches in the model's order, and says so in the log.
        """
        if not self.enabled or self.store.read_only or self.retired:
            return self.current()
        if self.fits is not None and not (force if wait is None else wait):
            self.fits.request(self, force=force)
            return self.current()
        return self.refit(force=force)

    def refit(self, *, force: bool = False, stopped: Stopped | None = None) -> QueryAdapter | None:
        """``refit_if_due`` in this thread; ``stopped`` (asked between batches) gives the fit up.

        A fit given up, or of a map ``retire``d meanwhile, writes nothing: the map
        in use stays, and the next start finds the fit due again.
        """
        if not self.enabled or self.store.read_only or self.retired:
            return self.current()

        def given_up() -> bool:
            return self.retired or (stopped is not None and stopped())

        try:
            with self._fitting:
                return self._refit(force, given_up)
        except FitStopped:
            log.info("query map fit stopped (the server stops, or its model was replaced)")
            return self.current()
        except Exception as exc:  # the write that called this has already succeeded
            log.warning(
                "query map not fitted (%s: %s); the previous map or the model's order is used",
                type(exc).__name__,
                exc,
            )
            return self.current()

    def retire(self) -> None:
        """This map's model is no longer run here: a fit of it under way writes nothing."""
        self.retired = True

    def _refit(self, force: bool, stopped: Stopped) -> QueryAdapter | None:
        current = self.current()
        count = self.store.searchable_chunk_count(self.embedding_model, self.dimensions)
        if not force and current is not None and not _drifted(current.chunks, count):
            return current
        ids, _ = self.store.searchable_chunk_versions(self.embedding_model, self.dimensions)
        count = len(ids)
        started = time.perf_counter()
        adapter = fit(
            self.store,
            self.embedding_model,
            self.dimensions,
            ids,
            encoder=self.encoder,
            stopped=stopped,
        )
        if adapter is None:
            # Too few sentences left: an earlier map of the same model still
            # maps its queries; an empty knowledge base keeps none.
            if current is not None and count == 0:
                with self._writing():
                    self._forget(stopped)
            return current if count else None
        if not np.isfinite(adapter.matrix).all():
            raise ValueError("the fit diverged (values that are not numbers)")
        with self._writing(), self.store.transaction():  # the map and its stamp: read whole
            # Asked once the store is ours: a stop or a move while the write waited for
            # another writer (up to the busy timeout) writes nothing either.
            _check(stopped)
            self.store.set_meta(self.map_key, adapter.to_meta())
            self.store.set_meta(self.stamp_key, adapter.stamp())
        with self._lock:
            self._checked = float("-inf")
        log.info(
            "query map fitted: %d chunks, %d sentences, %.1f s",
            adapter.chunks,
            adapter.anchors,
            time.perf_counter() - started,
        )
        return self.current()

    def _writing(self) -> AbstractContextManager[object]:
        """Held while a fit checks it may write and writes (``BackgroundFits.writing``)."""
        return self.fits.writing if self.fits is not None else nullcontext()

    def _forget(self, stopped: Stopped) -> None:
        with self.store.transaction():
            _check(stopped)
            # The rows in the order a write takes them (map, then stamp): two
            # replicas on Postgres never wait on each other's second row.
            self.store.delete_meta(self.map_key)
            self.store.delete_meta(self.stamp_key)
        with self._lock:
            self._checked = float("-inf")


class BackgroundFits:
    """The server's fits of query maps, on one thread of their own (``kb serve``).

    One fit at a time; the requests for a map while a fit runs coalesce into
    at most one more (which finds out then whether it is still due). ``close``
    (the server stops) drops the fits not started and stops the one running at
    its next batch, or once its write has the store: it writes nothing, and the
    next start finds it due again. ``close`` waits for none of it.
    """

    def __init__(self) -> None:
        # The thread starts at the first request: a server with nothing due has none.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-query-map")
        self._lock = threading.Lock()
        self._queued: dict[QueryAdapters, Future[QueryAdapter | None]] = {}
        # The queued ones asked to fit even when not due (``force``).
        self._forced: set[QueryAdapters] = set()
        self._latest: Future[QueryAdapter | None] | None = None
        self._closed = False
        # Whether the thread runs at ``FIT_NICENESS`` yet (``_run``).
        self._yielding = False
        # Held by a fit writing its map (one write at a time in this process); ``close``
        # never waits for it.
        self.writing = threading.Lock()

    def request(
        self, adapters: QueryAdapters, *, force: bool = False
    ) -> Future[QueryAdapter | None] | None:
        """Fit ``adapters`` if due (or ``force``), on this thread; the fit's future (``None``: closed).

        A request while another for the same map waits to start is that one
        (``force``d if either is).
        """
        with self._lock:
            if self._closed:
                return None
            if force:
                self._forced.add(adapters)
            queued = self._queued.get(adapters)
            if queued is None:
                queued = self._executor.submit(self._run, adapters)
                self._queued[adapters] = self._latest = queued
            return queued

    def latest(self) -> Future[QueryAdapter | None] | None:
        """The future of the last fit requested (``None``: none yet): the map a write asked for."""
        with self._lock:
            return self._latest

    def _run(self, adapters: QueryAdapters) -> QueryAdapter | None:
        with self._lock:
            self._queued.pop(adapters, None)  # started: a request from now on queues another
            force = adapters in self._forced
            self._forced.discard(adapters)
        encoder = adapters.encoder
        if not self._yielding and (encoder is None or encoder.loaded):
            # Only once the model is loaded (the server warms each before it fits it):
            # threads its runtime started from this one would run as low, questions too.
            self._yielding = _yield_to_questions()
        return adapters.refit(force=force, stopped=self.closed)

    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed

    def close(self) -> None:
        """Stop: no fit starts from now on, and none writes.

        Returns at once, even while a fit's write waits for the store (another
        writer holds it): the server calls this on its event loop. That write
        asks once the store is its own, and gives up.
        """
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)


def _yield_to_questions() -> bool:
    """Lower the calling thread's CPU priority by ``FIT_NICENESS``, for good; whether it was.

    Linux only: there ``setpriority`` of a thread's id changes that thread alone
    (elsewhere it would name a process). An unprivileged thread cannot raise
    its priority again: only the fits' own thread calls this.
    """
    if sys.platform != "linux":
        return False
    thread = threading.get_native_id()
    try:
        niceness = min(19, os.getpriority(os.PRIO_PROCESS, thread) + FIT_NICENESS)
        os.setpriority(os.PRIO_PROCESS, thread, niceness)
    except OSError as exc:
        log.info("the query map's fits run at the server's priority (%s)", exc)
        return False
    return True


def _drifted(fitted: int, now: int) -> bool:
    return abs(now - fitted) >= max(1, REFIT_SHARE * max(fitted, now))
