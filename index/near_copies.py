"""Near-copies: documents whose text is nearly another's (the same document in another format).

A ``.docx`` and its PDF export, an HTML page and its Markdown, a PDF whose lines
end in hyphenated half-words and whose pages carry a running header: the same
document, read into slightly different texts. Their passages are not the same
(``KnowledgeBase.copies`` does not tell them), so answers would cite both.

Each document's text is read as words (:func:`words`: ``same_text``, case
folded, a word hyphenated at a line end joined again, every other hyphen and
every punctuation mark gone), cut into overlapping runs of :data:`SHINGLE_WORDS`
words, and summed up at indexing in a MinHash signature (:func:`signature`):
:data:`PERMUTATIONS` 32-bit minima, 512 bytes a document, beside its number of
distinct runs. The share of equal minima estimates the Jaccard similarity of the
two sets of runs (Broder, "On the resemblance and containment of documents",
1997), within about 0.04 (one standard error at 0.5).

What it costs: a signature is 2-4 ms per 1,000 words at indexing, its words
held as 8-byte hashes (a text of millions of short words: about 11 times its
size in memory at most, where its words as strings would take 30); a look-up
reads the signatures of the documents of a size it can be a near-copy of (by
an index on the size) and compares them at once: 23,000 of 100,000 documents
read and compared in 0.2-0.4 s (``bench/near_copies.py``), 51 MB of signatures
stored for 100,000 documents.

Two documents are near-copies when that estimate is at least
:data:`NEAR_COPY_THRESHOLD`. Measured (``bench/near_copies.py``, 4-word runs):
57 pages (the sample handbook's and the Prometheus documentation's) each as
Markdown, HTML, ``.docx`` and PDF (lines hyphenated, a running header and page
numbers) scored 0.71 or more in all 342 pairs of formats of one page (median
0.95); 2,714 pairs of different pages on one subject (the sample handbook, each
evaluation corpus, one page's translations) scored 0.24 at most (median 0).
3-word runs separate as well (0.73 / 0.21), 5-word ones less (0.60 / 0.19).

Jaccard similarity ``J`` of two sets is at most ``min(n, m) / max(n, m)`` of
their sizes: a document of ``n`` runs is compared only with documents of
between ``n * J`` and ``n / J`` runs, which the store finds by an index.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from index.normal_form import same_text

__all__ = [
    "NEAR_COPY_THRESHOLD",
    "PERMUTATIONS",
    "SHINGLE_WORDS",
    "Signature",
    "Stored",
    "signature",
    "similarities",
    "size_range",
    "words",
]

# Words in one run (shingle). Shorter runs make documents on one subject alike
# (their common phrases); longer ones make one changed word cost more runs.
SHINGLE_WORDS = 4
# Minima in a signature: the estimate's standard error is sqrt(J(1 - J) / 128).
PERMUTATIONS = 128
# The least estimated Jaccard similarity of two near-copies (bench/near_copies.py):
# between the lowest pair of formats (0.71) and the highest pair of pages (0.24), each
# more than five standard errors of the estimate (0.044) away.
NEAR_COPY_THRESHOLD = 0.5

# A word cut at a line end by a hyphen (``exam-\nple``, a PDF's; a soft hyphen too), joined
# again. Each pattern here is tried only where a hyphen or a ``](`` is, and backtracks over
# the run of spaces or the title after it at most: linear in the text, whatever it holds
# (a member's document).
_LINE_END_HYPHEN = re.compile(r"[-\u00ad\u2010][ \t]*\r?\n\s*(?=\w)")
# Hyphens (``e-mail`` is ``email``): gone once words cut at line ends are joined.
_HYPHENS = str.maketrans("", "", "-\u2010\u2011")
# A Markdown link's or image's target (``[text](/docs/x "title")``): the page shows its
# text alone, and an export of it (HTML, PDF, Word) has only that text.
_LINK_TARGET = re.compile(r"\]\([^()\s]*(?:\s+\"[^\"]*\")?\)")
_WORD = re.compile(r"\w+")
# White space as ``str.split`` takes it (both read Unicode's).
_SPACE = re.compile(r"\s")
# The permutations' seeds: fixed, so that signatures stored at any time compare.
_SEEDS = np.frombuffer(
    hashlib.blake2b(b"kb near-copies v1", digest_size=64).digest() * (PERMUTATIONS // 8),
    dtype=np.uint64,
) ^ np.arange(PERMUTATIONS, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
# Runs hashed at a time: PERMUTATIONS x this many 64-bit values (8 MB).
_BLOCK = 8192
# Characters of a text read into words at a time (then kept as 64-bit hashes).
_PART_CHARS = 1 << 16
# Distinct words whose hashes are remembered across pieces (a text's vocabulary, mostly).
_MOST_HASHES_KEPT = 1 << 16


@dataclass(frozen=True)
class Signature:
    """A document's text summed up for near-copy comparison.

    Attributes:
        shingles: how many distinct runs of words its text has.
        minhash: :data:`PERMUTATIONS` little-endian 32-bit minima.
    """

    shingles: int
    minhash: bytes


def words(text: str) -> list[str]:
    """The words of ``text`` as near-copies are compared: case folded, without punctuation.

    A word a line end hyphenated (``exam-`` then ``ple``) is one word again; a
    hyphen inside a word goes (``e-mail`` is ``email``): one format keeps a
    hyphen another drops. Addresses and Markdown link targets go: one format
    shows them, another hides them behind the link's text.
    """
    return [w for part in _parts(_joined(text)) for w in _part_words(part)]


def _joined(text: str) -> str:
    """``text`` without link targets, and with words hyphenated at a line end joined."""
    return _LINE_END_HYPHEN.sub("", _LINK_TARGET.sub("] ", text))


def _parts(text: str) -> Iterator[str]:
    """``text`` in pieces of about :data:`_PART_CHARS`, each cut just before white space:
    every step after :func:`_joined` reads one whitespace-separated token at a time, so
    the pieces' words are the text's, and a long text's words are never all held at once."""
    start = 0
    while start < len(text):
        space = _SPACE.search(text, start + _PART_CHARS)
        cut = space.start() if space else len(text)
        yield text[start:cut]
        start = cut


def _part_words(part: str) -> list[str]:
    # An address (``https://...``, ``www...``) is shown in one format and a link's hidden
    # target in another: every whitespace-separated token holding one goes.
    shown = " ".join(t for t in part.split() if not _address(t))
    folded = same_text(shown.translate(_HYPHENS)).casefold()
    return _WORD.findall(folded)


def _address(token: str) -> bool:
    return "://" in token or token[:4].lower() == "www."


def signature(text: str) -> Signature | None:
    """The signature of ``text``; ``None`` when it has no word at all."""
    ids = _word_ids(text)
    if not len(ids):
        return None
    runs = np.unique(_runs(ids))
    minima = np.full(PERMUTATIONS, np.iinfo(np.uint64).max, dtype=np.uint64)
    for start in range(0, len(runs), _BLOCK):
        block = runs[start : start + _BLOCK]
        mixed = _mix(block[np.newaxis, :] ^ _SEEDS[:, np.newaxis])
        minima = np.minimum(minima, mixed.min(axis=1))
    return Signature(len(runs), (minima >> np.uint64(32)).astype("<u4").tobytes())


def similarities(minhash: bytes, others: Sequence[bytes]) -> np.ndarray:
    """The estimated Jaccard similarity of ``minhash``'s text to each of ``others``'."""
    if not others:
        return np.zeros(0)
    mine = np.frombuffer(minhash, dtype="<u4")
    theirs = np.frombuffer(b"".join(others), dtype="<u4").reshape(len(others), -1)
    return np.asarray((theirs == mine).mean(axis=1), dtype=float)


@dataclass(frozen=True)
class Stored:
    """Stored signatures, as arrays: each document's id, number of runs and minima.

    Read once for many documents (a folder ``kb ingest`` added): each is compared with
    the rows of its size range in one numpy step, with no further read of the store.
    """

    ids: np.ndarray
    shingles: np.ndarray
    minima: np.ndarray

    @classmethod
    def of(cls, rows: Sequence[tuple[int, int, bytes]]) -> Stored:
        """The signatures of ``(document id, runs, minhash)`` rows."""
        minima = np.frombuffer(b"".join(r[2] for r in rows), dtype="<u4")
        return cls(
            np.array([r[0] for r in rows], dtype=np.int64),
            np.array([r[1] for r in rows], dtype=np.int64),
            minima.reshape(len(rows), PERMUTATIONS),
        )

    def near(self, doc_id: int, mine: Signature) -> list[int]:
        """The ids of the documents other than ``doc_id`` whose text is nearly ``mine``'s
        (:data:`NEAR_COPY_THRESHOLD`), most alike first, then newest."""
        fewest, most = size_range(mine.shingles)
        rows = (self.shingles >= fewest) & (self.shingles <= most) & (self.ids != doc_id)
        scores = (self.minima[rows] == np.frombuffer(mine.minhash, dtype="<u4")).mean(axis=1)
        alike = sorted(
            ((float(s), int(i)) for i, s in zip(self.ids[rows], scores, strict=True)
             if s >= NEAR_COPY_THRESHOLD),
            reverse=True,
        )  # fmt: skip
        return [i for _, i in alike]


def size_range(shingles: int, threshold: float = NEAR_COPY_THRESHOLD) -> tuple[int, int]:
    """The numbers of runs a document of ``shingles`` runs can be a near-copy of."""
    return int(shingles * threshold), int(shingles / threshold) + 1


def _word_ids(text: str) -> np.ndarray:
    """A 64-bit hash of each of :func:`words`, in order, hashed piece by piece: 8 bytes a
    word where millions of short words held as strings would take 60 each."""
    hashed: dict[str, int] = {}
    pieces = []
    for part in _parts(_joined(text)):
        found = _part_words(part)
        for w in dict.fromkeys(found):
            if w not in hashed:
                digest = hashlib.blake2b(w.encode(), digest_size=8).digest()
                hashed[w] = int.from_bytes(digest, "little")
        pieces.append(np.array([hashed[w] for w in found], dtype=np.uint64))
        if len(hashed) > _MOST_HASHES_KEPT:
            hashed.clear()  # a text of ever new words: each piece hashes its own
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint64)


def _runs(ids: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each run of :data:`SHINGLE_WORDS` words' ``ids`` (the whole text when
    shorter)."""
    width = min(SHINGLE_WORDS, len(ids))
    combined = np.zeros(len(ids) - width + 1, dtype=np.uint64)
    for offset in range(width):
        # Each position mixed in with its own multiplier: ``a b`` and ``b a`` differ.
        combined = _mix(combined ^ ids[offset : offset + len(combined)]) + np.uint64(offset)
    return combined


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, element-wise: every input bit moves every output bit."""
    x = x ^ (x >> np.uint64(30))  # a new array: the rest works in it (one copy, not four)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x
