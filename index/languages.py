"""Which language a text is written in, told by a model that ships with its library.

The detector is py3langid's (97 languages, naive Bayes over byte n-grams, a
4 MB model inside the package, nothing downloaded). It is reliable on a
paragraph and guesses on a few words, so every answer here comes with a rule
for "cannot tell":

* a text with fewer than ``MIN_LETTERS`` letters is never told;
* the best language must have at least ``MIN_CONFIDENCE`` of the probability,
  renormalised over the languages the caller allows (a question is told only
  among the knowledge base's own languages and English, which is what makes a
  four-word question decidable at all).

``None`` means "cannot tell"; callers fall back to the document's language, or
the knowledge base's languages, and say so. Codes are ISO 639-1 (``cs``,
``da``, ``fr``, ``ro``, ``en``).
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

__all__ = [
    "ENGLISH",
    "MIN_AMONG_MASS",
    "MIN_CONFIDENCE",
    "MIN_LETTERS",
    "NORDIC",
    "Detected",
    "detect",
    "detect_language",
    "fold_diacritics",
    "fold_letters",
    "letters",
    "language_shares",
    "passage_languages",
    "prevailing_language",
]

ENGLISH = "en"
# Twelve letters is about two words: below it py3langid's best guess was
# wrong for a third of the short questions tried (``prikaz``, ``ssh -X``).
MIN_LETTERS = 12
MIN_CONFIDENCE = 0.5
# Below this share of the probability, the allowed languages are not in the
# running at all (a Chinese question among European languages).
MIN_AMONG_MASS = 0.01
# The detector's cost grows with the text; a passage's language is settled
# well within its first 2,000 characters.
_SAMPLE_CHARS = 2000
_LOCK = threading.Lock()
# A passage's own language overrides its document's only when it is at least
# this long and this clear (see ``passage_languages``).
PASSAGE_MIN_LETTERS = 200
PASSAGE_CONFIDENCE = 0.95


@dataclass(frozen=True)
class Detected:
    """A language the detector settled on, and its probability among those allowed."""

    code: str
    confidence: float


def letters(text: str) -> int:
    """How many letters ``text`` has (any script)."""
    return sum(1 for ch in text if ch.isalpha())


def detect(text: str, among: Collection[str] | None = None) -> Detected | None:
    """The language of ``text``: the detector's clear favourite, else the clear one of ``among``.

    A language the detector clearly prefers among all it knows wins even when it
    is not in ``among`` (a German or Arabic question is German or Arabic).
    Otherwise the probabilities are renormalised over ``among`` (codes), as long
    as those languages hold at least ``MIN_AMONG_MASS`` of them (a Chinese
    question is not "most likely Danish" among European languages). ``None``:
    the text is too short, or no language is clearly ahead (``MIN_CONFIDENCE``).
    """
    sample = text[:_SAMPLE_CHARS]
    if letters(sample) < MIN_LETTERS:
        return None
    codes, probabilities = _scores(sample)
    if not among:
        return _clear(codes, probabilities)
    if probabilities[0] >= MIN_CONFIDENCE and codes[0] not in among:
        return Detected(str(codes[0]), float(probabilities[0]))
    wanted = np.isin(codes, list(among))
    mass = float(probabilities[wanted].sum())
    if mass < MIN_AMONG_MASS:
        return None
    return _clear(codes[wanted], probabilities[wanted] / mass)


def _clear(codes: np.ndarray, probabilities: np.ndarray) -> Detected | None:
    best = int(np.argmax(probabilities))
    if probabilities[best] < MIN_CONFIDENCE:
        return None
    return Detected(str(codes[best]), float(probabilities[best]))


def detect_language(text: str, among: Collection[str] | None = None) -> str | None:
    """The code of ``detect``'s language, or ``None`` when it cannot tell."""
    found = detect(text, among)
    return found.code if found else None


def passage_languages(contents: Sequence[str]) -> tuple[list[str | None], str | None]:
    """The language of each passage of one document, and the document's.

    The document's is the language holding most of the passages' letters. A
    passage keeps a language of its own only when it is long enough
    (``PASSAGE_MIN_LETTERS``) and clearly in it (``PASSAGE_CONFIDENCE``): a
    block of code, a table of numbers or a quoted English term in a French
    manual reads as the manual's French, while a whole English section of it is
    English. ``None`` throughout when no language could be told.
    """
    found = [_passage_language(text) for text in contents]
    document = prevailing_language(
        [f.code if f else None for f in found], [letters(t[:_SAMPLE_CHARS]) for t in contents]
    )
    own = [
        f.code
        if f and f.confidence >= PASSAGE_CONFIDENCE and f.letters >= PASSAGE_MIN_LETTERS
        else None
        for f in found
    ]
    return [code or document for code in own], document


@dataclass(frozen=True)
class _Found:
    code: str
    confidence: float
    letters: int


def _passage_language(text: str) -> _Found | None:
    found = detect(text)
    return _Found(found.code, found.confidence, letters(text[:_SAMPLE_CHARS])) if found else None


def language_shares(languages: Iterable[str | None], weights: Iterable[int]) -> dict[str, float]:
    """Each known language's share of the total weight (characters, passages), largest first."""
    totals: Counter[str] = Counter()
    for code, weight in zip(languages, weights, strict=True):
        if code:
            totals[code] += weight
    whole = sum(totals.values())
    return {code: n / whole for code, n in totals.most_common()} if whole else {}


def prevailing_language(languages: Iterable[str | None], weights: Iterable[int]) -> str | None:
    """The language holding the most weight, or ``None`` when none was told."""
    shares = language_shares(languages, weights)
    return next(iter(shares), None)


# Latin letters that are not a base letter plus marks, so NFD leaves them whole,
# spelled as writers without them type them (Lucene's ASCIIFoldingFilter agrees).
_LETTERS = str.maketrans({
    "ø": "o", "æ": "ae", "œ": "oe", "ð": "d", "đ": "d", "ħ": "h", "ı": "i", "ł": "l",
    "ŧ": "t", "þ": "th",
})  # fmt: skip
# Languages whose å, æ and ø are written ``aa``, ``ae`` and ``oe`` without them
# (``aa`` was Danish spelling until 1948, Norwegian until 1917).
NORDIC = frozenset({"da", "no", "nb", "nn"})
# After ``_LETTERS``: the second letter of a Nordic two-letter form, dropped.
_NORDIC_PAIRS = re.compile(r"(?<=a)[ae]+|(?<=o)e+")


def fold_diacritics(word: str) -> str:
    """``word`` without its combining marks: ``příkaz`` -> ``prikaz``, ``fișier`` and ``fişier`` -> ``fisier``.

    Letters that are not a base letter plus marks are spelled as they are typed
    without them: ``ø`` -> ``o``, ``æ`` -> ``ae``, ``œ`` -> ``oe`` (``cœur`` is
    ``coeur``), ``ł`` -> ``l``, ``þ`` -> ``th``.
    """
    decomposed = unicodedata.normalize("NFD", word)
    if decomposed.isascii():
        return decomposed
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return unicodedata.normalize("NFC", stripped).translate(_LETTERS)


def fold_letters(word: str, language: str | None) -> str:
    """``fold_diacritics``, and in Danish and Norwegian (``NORDIC``) the two-letter forms too.

    A Danish or Norwegian word is the same whether its writer typed ``æ``, ``ø``
    and ``å``, the plain letters or the two-letter forms: ``børn``, ``born`` and
    ``boern`` are ``born``; ``får``, ``far`` and ``faar`` are ``far``; ``være``,
    ``vare`` and ``vaere`` are ``vare``::

        >>> [fold_letters(w, "da") for w in ("hvornår", "hvornar", "hvornaar", "løn", "loen")]
        ['hvornar', 'hvornar', 'hvornar', 'lon', 'lon']

    The words this merges are the ones a writer without the letters merges too
    (``før`` and ``for``); and a vowel ending before an ``e`` ending is read as
    one letter (``kommandoen`` is ``kommandon``), the price of reading ``koen``
    as ``køn``. Other languages: ``fold_diacritics`` alone (in German ``oe`` is
    ``ö``, but ``ue`` is also ``neue``).
    """
    folded = fold_diacritics(word)
    if language in NORDIC:
        return _NORDIC_PAIRS.sub("", folded)
    return folded


def _scores(text: str) -> tuple[np.ndarray, np.ndarray]:
    """Every language code the detector knows and the probability it gives ``text``."""
    with _LOCK:  # one shared detector; its calls keep no state, the lock is cheap insurance
        ranked = _identifier().rank(text)
    codes = np.array([code for code, _ in ranked])
    return codes, np.array([p for _, p in ranked], dtype=np.float64)


@cache
def _identifier() -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
