"""The sparse index: Okapi BM25 over chunk texts, scoring only chunks that share a query term.

Scores are those of ``rank_bm25.BM25Okapi`` (k1 = 1.2, b = 0.75, its term
frequency saturation and length normalisation, repeated query terms counted
each time) with one change: the IDF is Lucene's always-positive
``log(1 + (N - n + 0.5) / (n + 0.5))``. rank-bm25's own IDF is zero for a term in
exactly half of the chunks and is floored to a small epsilon above that, so on
a brand-new knowledge base of two chunks every score is zero. The tests check
the numbers against a ``BM25Okapi`` subclass with this IDF.

rank-bm25 itself is kept as the reference in the tests, not used here: it
looks every chunk up in a per-chunk dict for every query term, ~300 ms per
question at 100k chunks, and its ``get_batch_scores`` over only the chunks
sharing a term is no faster for real questions (common words such as "the"
or "how" appear in most chunks). Here postings are CSR arrays (term -> chunk
positions) holding each posting's precomputed score contribution, so a query
costs one vectorised add per query term over that term's postings: about
3 ms at 100k chunks.
"""

from __future__ import annotations

import json
import zipfile
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

from index.errors import IndexOutOfSync
from index.files import write_atomic
from index.search.tokens import ANALYZER, Analyzer

DEFAULT_K1 = 1.2
DEFAULT_B = 0.75
FORMAT_VERSION = 2  # 2: the impacts are saved, not computed again at every load

# Which chunks a search may return: a predicate on the chunk id, or the ids
# themselves (a set, a list or an int64 array; an array is the fastest).
Allowed: TypeAlias = Callable[[int], bool] | Collection[int] | np.ndarray | None


class BM25Index:
    """An immutable BM25 index over chunk texts, keyed by chunk id.

    Args:
        chunk_ids: the id of each chunk (unique).
        texts: the text of each chunk, aligned with ``chunk_ids``; turned into
            terms by ``analyzer``.
        languages: the language of each chunk (``Analyzer.document_terms``);
            ``None``: all analysed by English rules.
        k1: term-frequency saturation.
        b: length normalisation.
        analyzer: how texts and queries become terms (the product's by default;
            ``bench/levers.py`` measures others).

    Raises:
        ValueError: ``chunk_ids`` and ``texts`` differ in length, or ids repeat.
    """

    def __init__(
        self,
        chunk_ids: Sequence[int] | np.ndarray,
        texts: Sequence[str],
        *,
        k1: float = DEFAULT_K1,
        b: float = DEFAULT_B,
        analyzer: Analyzer = ANALYZER,
        languages: Sequence[str | None] | None = None,
    ) -> None:
        if len(chunk_ids) != len(texts):
            raise ValueError(f"{len(chunk_ids)} chunk ids but {len(texts)} texts.")
        ids = np.array(chunk_ids, dtype=np.int64).reshape(-1)  # a copy: it is made read-only
        vocab, doc_len, indptr, postings, tf = _invert(_analysed(analyzer, texts, languages))
        self._setup(ids, vocab, doc_len, indptr, postings, tf, k1=k1, b=b, analyzer=analyzer)

    def _setup(
        self,
        ids: np.ndarray,
        vocab: list[str],
        doc_len: np.ndarray,
        indptr: np.ndarray,
        postings: np.ndarray,
        tf: np.ndarray,
        *,
        k1: float,
        b: float,
        analyzer: Analyzer,
        impacts: np.ndarray | None = None,
    ) -> None:
        # Sorted view of the ids, for id sets too sparse for the table; and the check
        # that they are unique (a sort, not np.unique: half the time of a load went there).
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        if bool((sorted_ids[1:] == sorted_ids[:-1]).any()):
            raise ValueError("chunk ids must be unique.")
        self._order, self._sorted_ids = order, sorted_ids
        self._ids = ids
        self._ids.flags.writeable = False
        self._vocab = {term: i for i, term in enumerate(vocab)}
        self._terms = vocab
        self._doc_len = doc_len
        self._indptr = indptr
        self._postings = postings
        self._tf = tf
        self.k1 = k1
        self.b = b
        self.analyzer = analyzer
        if impacts is None:
            impacts = _impacts(doc_len, indptr, postings, tf, k1=k1, b=b)
        self._impacts = impacts
        self._lut_base, self._lut = _position_table(ids)

    def __len__(self) -> int:
        return int(self._ids.size)

    @property
    def chunk_ids(self) -> np.ndarray:
        """The indexed chunk ids, in build order (read-only int64 array)."""
        return self._ids

    def updated(
        self,
        remove_ids: Sequence[int] | np.ndarray,
        add_ids: Sequence[int] | np.ndarray,
        add_texts: Sequence[str],
        add_languages: Sequence[str | None] | None = None,
    ) -> BM25Index:
        """A new index with some chunks removed and others added; this one is left unchanged.

        Only ``add_texts`` are tokenised: the surviving postings are kept as they
        are and merged with the new ones, then IDF and impacts are recomputed
        for the new chunk count and average length. Scores equal those of an
        index built from scratch over the same chunks.

        Args:
            remove_ids: ids to drop; ids not in the index are ignored.
            add_ids: ids of the new chunks, none of them left in the index.
            add_texts: their texts, aligned with ``add_ids``.
            add_languages: their languages (``None``: English rules for all).

        Returns:
            The new index, its chunk ids in ascending order (as a build from the
            store, which reads chunks by id, has them).

        Raises:
            ValueError: ``add_ids`` and ``add_texts`` differ in length, or an id
                would be in the index twice.
        """
        if len(add_ids) != len(add_texts):
            raise ValueError(f"{len(add_ids)} chunk ids but {len(add_texts)} texts.")
        keep = ~np.isin(self._ids, np.asarray(remove_ids, dtype=np.int64))
        new_ids = np.array(add_ids, dtype=np.int64).reshape(-1)
        ids = np.concatenate([self._ids[keep], new_ids])
        vocab, new_len, new_indptr, new_postings, new_tf = _invert(
            _analysed(self.analyzer, add_texts, add_languages), dict(self._vocab)
        )
        # Renumber every chunk by its rank in id order: survivors keep their
        # relative order, so their (term, position) keys stay sorted.
        order = np.argsort(ids, kind="stable")
        rank = np.empty(ids.size, dtype=np.int64)
        rank[order] = np.arange(ids.size)
        n_kept = int(keep.sum())
        old_pos = np.full(len(self), -1, dtype=np.int64)
        old_pos[keep] = rank[:n_kept]
        old_terms = np.repeat(np.arange(len(self._terms), dtype=np.int64), np.diff(self._indptr))
        old_new_pos = old_pos[self._postings]
        alive = old_new_pos >= 0
        new_terms = np.repeat(np.arange(len(vocab), dtype=np.int64), np.diff(new_indptr))
        terms = np.concatenate([old_terms[alive], new_terms])
        positions = np.concatenate([old_new_pos[alive], rank[n_kept + new_postings]])
        tf = np.concatenate([self._tf[alive].astype(np.uint32), new_tf.astype(np.uint32)])
        doc_len = np.concatenate([self._doc_len[keep], new_len])[order]
        return _from_pairs(
            ids[order], vocab, doc_len, terms, positions, tf, k1=self.k1, b=self.b, an=self.analyzer
        )

    def search(
        self,
        query: str,
        k: int,
        allowed: Allowed = None,
        languages: Sequence[str | None] = (None,),
    ) -> list[tuple[int, float]]:
        """The ``k`` best chunks for ``query``, best first; ties go to the lower chunk id.

        Args:
            query: the question, analysed like the chunks (``Analyzer.query_terms``)
                in ``languages`` (``index.search.tokens.query_languages``).
            k: how many results at most.
            allowed: if given, only these chunks (ids, or a predicate on the id)
                are ranked, so a narrow scope still gets its full ``k``.

        Returns:
            ``(chunk_id, score)`` pairs, only chunks with a score above zero
            (i.e. sharing at least one term with the query).
        """
        return self.search_terms(self.analyzer.query_terms(query, languages), k, allowed)

    def search_terms(
        self, terms: Sequence[str], k: int, allowed: Allowed = None
    ) -> list[tuple[int, float]]:
        """As ``search``, for terms already analysed (a repeated term counts each time)."""
        if k <= 0 or not len(self):
            return []
        scores = self._accumulate(terms)
        if scores is None:
            return []
        if allowed is None or callable(allowed):
            candidates = np.flatnonzero(scores)
        else:
            mask = np.zeros(len(self), dtype=bool)
            mask[self._positions(allowed)] = True
            candidates = np.flatnonzero(mask & (scores > 0))
        cand_scores = scores[candidates]
        if callable(allowed):
            top = self._walk(candidates, cand_scores, k, allowed)
        else:
            top = candidates[self._top(candidates, cand_scores, k)]
        return [(int(self._ids[p]), float(scores[p])) for p in top]

    def _accumulate(self, terms: Sequence[str]) -> np.ndarray | None:
        # rank-bm25 adds a term's contribution once per occurrence in the
        # query, so a repeated term is weighted by its count.
        weights = Counter(self._vocab[t] for t in terms if t in self._vocab)
        if not weights:
            return None
        scores = np.zeros(len(self), dtype=np.float32)
        for term_id, count in weights.items():
            lo, hi = self._indptr[term_id], self._indptr[term_id + 1]
            # A term's postings hold each chunk once, so fancy-index += is exact.
            scores[self._postings[lo:hi]] += count * self._impacts[lo:hi]
        return scores

    def _positions(self, allowed: Collection[int] | np.ndarray) -> np.ndarray:
        """Positions of the allowed ids that are in the index (unordered, maybe repeated)."""
        if isinstance(allowed, np.ndarray):
            wanted = allowed.astype(np.int64, copy=False).reshape(-1)
        else:
            wanted = np.fromiter(allowed, dtype=np.int64, count=len(allowed))
        if self._lut is not None:
            offset = wanted - self._lut_base
            offset = offset[(offset >= 0) & (offset < self._lut.size)]
            found = self._lut[offset]
            return found[found >= 0]
        at = np.searchsorted(self._sorted_ids, wanted)
        inside = at < self._sorted_ids.size
        inside[inside] = self._sorted_ids[at[inside]] == wanted[inside]
        return self._order[at[inside]]

    def _top(self, candidates: np.ndarray, cand_scores: np.ndarray, k: int) -> np.ndarray:
        """Indices into ``candidates`` of the best ``k``, ordered by (-score, chunk id)."""
        if candidates.size > k:
            kth = cand_scores[np.argpartition(-cand_scores, k - 1)[k - 1]]
            # Keep every tie of the k-th score so the id tie-break is exact.
            keep = np.flatnonzero(cand_scores >= kth)
        else:
            keep = np.arange(candidates.size)
        order = np.lexsort((self._ids[candidates[keep]], -cand_scores[keep]))
        return keep[order[:k]]

    def _walk(
        self,
        candidates: np.ndarray,
        cand_scores: np.ndarray,
        k: int,
        allowed: Callable[[int], bool],
    ) -> list[int]:
        # Test the predicate in rank order on growing windows rather than on
        # every candidate: a broad scope stops after about k calls.
        accepted: list[int] = []
        checked = 0
        window = max(4 * k, 64)
        while len(accepted) < k and checked < candidates.size:
            ranked = candidates[self._top(candidates, cand_scores, window)]
            for pos in ranked[checked:]:
                if allowed(int(self._ids[pos])):
                    accepted.append(int(pos))
                    if len(accepted) == k:
                        break
            checked = ranked.size
            window *= 4
        return accepted

    # ------------------------------------------------------------- persistence

    def save(self, path: Path, generation: int) -> None:
        """Write the index to ``path`` atomically.

        The file is an uncompressed ``.npz`` (zip of ``.npy`` arrays): the CSR
        postings and term frequencies as integer arrays, each posting's score
        contribution as float32 (the very numbers a build computes: computing
        them again took a third of a second of every start at 100k chunks), the
        vocabulary as newline-joined UTF-8 (terms never contain whitespace) and
        a JSON header. Chosen over pickle because loading it runs no code
        (``allow_pickle=False``) and it does not depend on this class's layout;
        left uncompressed because saving and loading speed matter more than
        disk space for a file that can always be rebuilt.

        Args:
            path: the file to create or replace.
            generation: the store generation the index was built from.

        Raises:
            AtomicWriteError: the file could not be written; the old one is intact.
        """
        meta = {
            "format": FORMAT_VERSION,
            "tokenizer": self.analyzer.signature,
            "generation": int(generation),
            "k1": self.k1,
            "b": self.b,
        }
        arrays: dict[str, Any] = {
            "meta": _text_array(json.dumps(meta)),
            "vocab": _text_array("\n".join(self._terms)),
            "chunk_ids": self._ids,
            "doc_len": self._doc_len,
            "indptr": self._indptr,
            "postings": self._postings,
            "tf": self._tf,
            "impacts": self._impacts,
        }

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a path
                np.savez(f, **arrays)

        write_atomic(Path(path), write)

    @classmethod
    def load(cls, path: Path, analyzer: Analyzer = ANALYZER) -> tuple[BM25Index, int]:
        """Read an index written by ``save``.

        Args:
            path: the file.
            analyzer: the analysis the index must have been built with.

        Returns:
            The index and the generation it was saved with.

        Raises:
            IndexOutOfSync: the file is missing, unreadable, written with another
                format or another analysis (``TOKENIZER_VERSION``, stemming, stop
                words), or internally inconsistent; rebuild it from the store.
        """
        try:
            meta, raw, arrays = _read_npz(Path(path))
            version, generation = meta.get("format"), int(meta["generation"])
            k1, b = float(meta["k1"]), float(meta["b"])
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as exc:
            raise IndexOutOfSync(
                f"The BM25 index {path} cannot be read ({exc}); rebuild it."
            ) from exc
        if version != FORMAT_VERSION or meta.get("tokenizer") != analyzer.signature:
            raise IndexOutOfSync(
                f"The BM25 index {path} was written by another version (format {version!r}, "
                f"tokenizer {str(meta.get('tokenizer'))[:40]!r}); rebuild it."
            )
        vocab = raw.split("\n") if raw else []
        _check_shapes(path, vocab, arrays)
        index = cls.__new__(cls)
        try:
            index._setup(
                arrays["chunk_ids"].astype(np.int64, copy=False),
                vocab,
                arrays["doc_len"],
                arrays["indptr"],
                arrays["postings"],
                arrays["tf"],
                k1=k1,
                b=b,
                analyzer=analyzer,
                impacts=arrays["impacts"],
            )
        except ValueError as exc:  # a chunk id twice
            raise IndexOutOfSync(
                f"The BM25 index {path} is inconsistent ({exc}); rebuild it."
            ) from exc
        return index, generation


def _analysed(
    analyzer: Analyzer, texts: Sequence[str], languages: Sequence[str | None] | None
) -> list[list[str]]:
    if languages is None:
        return [analyzer.document_terms(t) for t in texts]
    if len(languages) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(languages)} languages.")
    return [analyzer.document_terms(t, c) for t, c in zip(texts, languages, strict=True)]


def _invert(
    docs: list[list[str]], vocab: dict[str, int] | None = None
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Build ``(vocab, doc_len, indptr, postings, tf)`` from tokenised documents.

    Postings of term ``t`` are ``postings[indptr[t]:indptr[t + 1]]`` (document
    positions, ascending) with the matching term frequencies in ``tf``.

    Args:
        docs: the tokenised documents.
        vocab: term ids to start from (extended in place with new terms), so
            the postings of an update share an existing index's term ids.
    """
    if vocab is None:
        vocab = {}
    term_ids = np.fromiter(
        (vocab.setdefault(t, len(vocab)) for doc in docs for t in doc), dtype=np.int64
    )
    doc_len = np.fromiter((len(doc) for doc in docs), dtype=np.int32, count=len(docs))
    doc_of = np.repeat(np.arange(len(docs), dtype=np.int64), doc_len)
    # One sort of (term, doc) keys yields term-major, doc-ascending postings
    # and the term frequencies as run lengths.
    keys, tf = np.unique(term_ids * max(len(docs), 1) + doc_of, return_counts=True)
    terms_of, postings = np.divmod(keys, max(len(docs), 1))
    indptr = np.zeros(len(vocab) + 1, dtype=np.int64)
    np.cumsum(np.bincount(terms_of, minlength=len(vocab)), out=indptr[1:])
    tf_dtype = np.uint16 if tf.size == 0 or tf.max() <= np.iinfo(np.uint16).max else np.uint32
    return list(vocab), doc_len, indptr, postings.astype(np.int32), tf.astype(tf_dtype)


def _from_pairs(
    ids: np.ndarray,
    vocab: list[str],
    doc_len: np.ndarray,
    terms: np.ndarray,
    positions: np.ndarray,
    tf: np.ndarray,
    *,
    k1: float,
    b: float,
    an: Analyzer,
) -> BM25Index:
    """An index from unordered ``(term, position, tf)`` postings.

    Terms left without postings are dropped, so the vocabulary (and the saved
    file) matches a fresh build's and does not grow with every removal.
    """
    df = np.bincount(terms, minlength=len(vocab))
    used = df > 0
    term_ids = np.cumsum(used) - 1
    n_docs = max(ids.size, 1)
    keys = term_ids[terms] * n_docs + positions
    # Stable sort: the survivors' keys are already sorted and the new ones
    # sorted among themselves, so this merges two runs in linear time.
    perm = np.argsort(keys, kind="stable")
    indptr = np.zeros(int(used.sum()) + 1, dtype=np.int64)
    np.cumsum(df[used], out=indptr[1:])
    tf_sorted = tf[perm]
    small = tf_sorted.size == 0 or tf_sorted.max() <= np.iinfo(np.uint16).max
    index = BM25Index.__new__(BM25Index)
    index._setup(
        ids,
        [t for t, u in zip(vocab, used.tolist(), strict=True) if u],
        doc_len.astype(np.int32, copy=False),
        indptr,
        positions[perm].astype(np.int32),
        tf_sorted.astype(np.uint16 if small else np.uint32),
        k1=k1,
        b=b,
        analyzer=an,
    )
    return index


def _position_table(ids: np.ndarray) -> tuple[int, np.ndarray | None]:
    """``(base, table)`` with ``table[id - base]`` = position of ``id``, or -1.

    Chunk ids come from an SQLite autoincrement, so they are dense enough for a
    direct table (4 bytes per id in the range); this makes a scope of 50k ids
    cost well under a millisecond instead of ~15 ms of sorting and searching.
    ``None`` when the ids are too sparse for the table to stay small.
    """
    if ids.size == 0:
        return 0, None
    base, span = int(ids.min()), int(ids.max() - ids.min()) + 1
    if span > 8 * ids.size + 4096:
        return base, None
    table = np.full(span, -1, dtype=np.int32)
    table[ids - base] = np.arange(ids.size, dtype=np.int32)
    return base, table


def _impacts(
    doc_len: np.ndarray,
    indptr: np.ndarray,
    postings: np.ndarray,
    tf: np.ndarray,
    *,
    k1: float,
    b: float,
) -> np.ndarray:
    """Each posting's score contribution: ``idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))``."""
    n_docs = doc_len.size
    total = int(doc_len.sum(dtype=np.int64))
    avgdl = total / n_docs if total else 1.0
    df = np.diff(indptr).astype(np.float64)
    # Lucene's IDF: positive for every term, even one in every chunk.
    idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
    norm = k1 * (1.0 - b + b * doc_len.astype(np.float64) / avgdl)
    freq = tf.astype(np.float64)
    term_of = np.repeat(np.arange(df.size), np.diff(indptr))
    impacts: np.ndarray = idf[term_of] * freq * (k1 + 1.0) / (freq + norm[postings])
    return impacts.astype(np.float32)


_ARRAYS = ("chunk_ids", "doc_len", "indptr", "postings", "tf", "impacts")


def _read_npz(path: Path) -> tuple[dict[str, Any], str, dict[str, np.ndarray]]:
    # Our own file handle: np.load given a path leaks it when the content is
    # not an archive.
    with open(path, "rb") as f:
        data = np.load(f, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive")
        with data:
            meta = json.loads(_array_text(data["meta"]))
            vocab = _array_text(data["vocab"])
            arrays = {n: data[n] for n in _ARRAYS if n in data.files}
    if not isinstance(meta, dict):
        raise ValueError("the header is not a JSON object")
    return meta, vocab, arrays


def _check_shapes(path: Path, vocab: list[str], arrays: dict[str, np.ndarray]) -> None:
    if set(arrays) != set(_ARRAYS):
        raise IndexOutOfSync(f"The BM25 index {path} lacks arrays; rebuild it.")
    n_docs = arrays["chunk_ids"].size
    indptr = arrays["indptr"]
    ok = (
        arrays["doc_len"].size == n_docs
        and indptr.size == len(vocab) + 1
        and indptr[0] == 0
        and indptr[-1] == arrays["postings"].size == arrays["tf"].size == arrays["impacts"].size
        and arrays["impacts"].dtype == np.float32
        and bool(np.all(np.diff(indptr) >= 0))
        and (
            arrays["postings"].size == 0
            or 0 <= arrays["postings"].min() <= arrays["postings"].max() < n_docs
        )
    )
    if not ok:
        raise IndexOutOfSync(f"The BM25 index {path} is inconsistent; rebuild it.")


def _text_array(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def _array_text(array: np.ndarray) -> str:
    return array.tobytes().decode("utf-8")
