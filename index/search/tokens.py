"""The BM25 tokeniser: words, plus identifiers kept whole *and* split into their parts.

Company documents are full of names that a plain word splitter destroys:
``store_true``, ``ERR_42``, ``utf-8-sig``, ``--dry-run``, ``v2.3``, ``os.path``,
``.env``, ``C++``. For each such token the tokeniser emits the whole identifier
(lower-cased) followed by its parts, so a question that quotes the identifier
matches it exactly and ranks it first, while a question that uses the words
(``utf 8 sig``) still matches the parts::

    >>> tokenize("Open it with utf-8-sig, see ERR_42.")
    ['open', 'it', 'with', 'utf-8-sig', 'utf', '8', 'sig', 'see', 'err_42', 'err', '42']

Rules, in order:

* Text is NFKC-normalised (composed accents, full-width forms folded) and
  case-folded (``Straße`` -> ``strasse``), so queries and documents agree.
* Letters of every script are word characters; combining marks stay inside
  their word. Han, Hiragana and Katakana are written without spaces, so each
  such character is a token and each adjacent pair is one more (the
  characters give recall, the pairs rank the exact phrase first; Lucene's CJK
  bigram filter with unigrams kept does the same).
* An identifier is word characters (underscore included) joined by single
  ``.`` or ``-``: ``foo.bar``, ``2024-01-15``, ``10.0.0.1``. A joiner at either
  end is punctuation, so a sentence's full stop is not part of its last word.
* A leading ``-``/``--`` (command-line flag) or ``.`` (dotfile, ``.NET``) is kept
  when the token starts the text or follows a space, bracket, quote, ``=`` or
  ``/``: ``-bb``, ``--dry-run``, ``.env``, ``~/.bashrc``.
* A trailing ``++`` or ``#`` is kept (``C++``, ``g++``, ``C#``); it is not a
  separate part, so ``C++`` emits ``c++`` and ``c``.
* Parts are split at ``_``, ``.`` and ``-``. A part that is letters then digits,
  or digits then letters (``v2``, ``utf8``, ``python3``, ``2fa``) also emits
  those two pieces, so ``python 3`` finds ``python3``. Parts with more
  alternations (hashes like ``a3f9c2``) are left alone.
* Underscores at either end are dropped (markdown ``_emphasis_``), and so are
  tokens made only of underscores (``____`` blanks in forms).

``tokenize`` is the splitter alone. BM25 indexes the terms of an ``Analyzer``
(``ANALYZER`` for the product), which then drops stop words and stems plain
English words with Snowball's Porter2 stemmer, so ``installing`` finds
``installs``::

    >>> ANALYZER.query_terms("How do I stop pip from caching wheels?")
    ['stop', 'pip', 'cach', 'wheel']

Identifiers are never stemmed and never stop words: ``store_true`` stays
``store_true`` (its parts are words, and are stemmed like words).

**Other languages.** A passage is analysed in its own language (``Chunk.language``,
told at ingest by ``index.languages``): its words lose their diacritics and are
then stemmed with that language's Snowball stemmer where one exists (Czech,
Danish, French, Romanian, German, Spanish and 30 more), so a question typed
without háčky, čárky or virgule (``prikaz``, ``fisier``) gets exactly the terms
of the written form (``příkaz``, ``fișier``; ``ş`` and ``ș`` are one letter), and
``fișierele`` finds ``fișier``::

    >>> ANALYZER.document_terms("Fișierele se șterg cu rm.", "ro")
    ['fisier', 'se', 'sterg', 'cu', 'rm']

Letters that are not a letter plus a mark are spelled as they are typed
without them (``ø`` -> ``o``, ``æ`` -> ``ae``, ``œ`` -> ``oe``, ``ł`` -> ``l``), and
a Danish or Norwegian word also loses the second letter of the two-letter
forms ``aa``, ``ae`` and ``oe`` (``index.languages.fold_letters``), so
``hvornår får jeg løn``, ``hvornar far jeg lon`` and ``hvornaar faar jeg loen``
are one question::

    >>> ANALYZER.query_terms("hvornaar faar jeg loen for boernene", ["da"])
    ['hvornar', 'far', 'jeg', 'lon', 'for', 'born']

Folding comes before stemming on purpose: the stemmer then sees the same
letters whether the asker typed them or not. Identifiers (``store_true``,
``utf-8``) only lose their marks. English passages (and those whose language
nobody could tell) are analysed as before. A question is analysed in its
language when that is clear among the knowledge base's languages
(``query_languages``), else in each of them, every distinct term kept once per
word, so a short question still meets the passages of any of them; a question
clearly in a language the knowledge base lacks is analysed in that one too
(Danish typed without its letters can read as Norwegian).

A change to these rules bumps ``TOKENIZER_VERSION``: a saved BM25 index (the
local index's file, or the Qdrant collection's marker) records it, and one
saved under another version is rebuilt from the stored passages when the
knowledge base opens, with no ``kb reindex``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import Stemmer

from index.languages import ENGLISH, detect, fold_diacritics, fold_letters

# Bump on any change to the rules (here, in ``ANALYZER`` or in the folding of
# ``index.languages``): saved BM25 indexes record it and are rebuilt from the
# store when it differs, on load, since their vocabulary would no longer match
# queries (4: ``ø``, ``æ``, ``œ`` folded, and Danish/Norwegian ``aa``/``ae``/``oe``).
TOKENIZER_VERSION = 4

# Scripts written without spaces between words (Han, Hiragana, Katakana and
# their compatibility / extension blocks). Hangul is spaced, so it is not here.
_CJK = (
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK extensions B-G
)
# Combining marks are not matched by ``\w`` in Python; without them Devanagari,
# Thai or a decomposed accent would cut a word in pieces.
_MARKS = (
    "\u0300-\u036f\u0483-\u0489\u0591-\u05bd\u0610-\u061a\u064b-\u065f"
    "\u0900-\u0dff\u0e31-\u0e3a\u0e47-\u0e4e\u1ab0-\u1aff\u1dc0-\u1dff"
    "\u200c\u200d\u20d0-\u20ff\ufe00-\ufe0f\ufe20-\ufe2f"
)
_PREFIX = r"(?:(?<![^\s(\[{<\"'`=,|/])(?:--?|\.)(?=[^\W_]))?"  # -bb, --flag, .env
_SUFFIX = r"(?:(?:\+\+|\#)(?![\w+#]))?"  # C++, C#


def _token_pattern(word: str) -> re.Pattern[str]:
    return re.compile(rf"[{_CJK}]+|{_PREFIX}{word}+(?:[.\-]{word}+)*{_SUFFIX}")


# Two variants of one grammar: the mark-aware one is three times slower, and
# most text has no combining marks left after NFKC.
_TOKEN = _token_pattern(rf"[^\W{_CJK}]")
_TOKEN_MARKS = _token_pattern(rf"(?:[^\W{_CJK}]|[{_MARKS}])")
_HAS_MARK = re.compile(rf"[{_MARKS}]")
_IS_CJK = re.compile(rf"[{_CJK}]")
# A part: word characters without the underscore (it joins parts).
_PART = re.compile(rf"(?:[^\W_{_CJK}]|[{_MARKS}])+")
_ALNUM_SPLIT = re.compile(r"^([^\W\d_]+)(\d+)$|^(\d+)([^\W\d_]+)$")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into BM25 terms; queries and documents use the same function.

    Args:
        text: any text (a chunk, or a question).

    Returns:
        The terms in order of appearance, duplicates kept (they are term frequencies).
    """
    # casefold() turns Turkish "İ" into "i" + combining dot; drop the dot so
    # "İstanbul" and "Istanbul" are the same word.
    text = unicodedata.normalize("NFKC", text).casefold().replace("i\u0307", "i")
    pattern = _TOKEN_MARKS if _HAS_MARK.search(text) else _TOKEN
    out: list[str] = []
    for token in pattern.findall(text):
        if not token.isalpha():
            out.extend(_identifier_terms(token))
        elif _IS_CJK.match(token):  # a CJK run never mixes with other letters
            out.extend(_cjk_terms(token))
        else:
            out.append(token)  # a plain word: by far the most common case
    return out


def _identifier_terms(token: str) -> list[str]:
    # Edge underscores are markdown emphasis (``_word_``) far more often than
    # part of a name; the parts are the same either way.
    token = token.strip("_")
    parts = _PART.findall(token)
    if not parts:  # only underscores
        return []
    pieces: list[str] = []
    for part in parts:
        pieces.append(part)
        pieces.extend(_alnum_pieces(part))
    if len(parts) == 1 and parts[0] == token:
        return pieces
    return [token, *pieces]


def _alnum_pieces(part: str) -> tuple[str, ...]:
    m = _ALNUM_SPLIT.match(part)
    if m is None:
        return ()
    return tuple(g for g in m.groups() if g is not None)


def _cjk_terms(run: str) -> list[str]:
    # Each character, then the pair it starts: in reading order, so that terms
    # near each other in the text are near each other in the list
    # (``core.proximity``); BM25 only counts them.
    terms: list[str] = []
    for i, char in enumerate(run):
        terms.append(char)
        if i + 1 < len(run):
            terms.append(run[i : i + 2])
    return terms


# Lucene's English stop words (``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET``).
LUCENE_STOP_WORDS = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is",
    "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then", "there",
    "these", "they", "this", "to", "was", "will", "with",
))  # fmt: skip
# Plus the words a question is built from rather than about: "how do I ...",
# "what does my ... mean". They are in most chunks and in every ticket.
STOP_WORDS = LUCENE_STOP_WORDS | frozenset((
    "how", "what", "which", "who", "whom", "whose", "why", "when", "where", "do", "does",
    "did", "doing", "done", "i", "me", "my", "mine", "we", "us", "our", "you", "your", "he",
    "him", "his", "she", "her", "its", "am", "were", "been", "being", "have", "has", "had",
    "having", "can", "could", "would", "should", "shall", "may", "might", "must", "so",
    "from", "about", "any", "some", "here", "than", "too", "very", "just", "also",
    # what the tokeniser leaves of "it's", "i'm", "don't", "doesn't", "isn't"
    "s", "m", "t", "don", "doesn", "isn",
))  # fmt: skip

_STEMMER = Stemmer.Stemmer("english")
# ISO 639-1 code -> Snowball algorithm (PyStemmer's names). English has its own
# rules above; a language not here is folded but not stemmed.
SNOWBALL = {
    "ar": "arabic", "ca": "catalan", "cs": "czech", "da": "danish", "de": "german",
    "el": "greek", "eo": "esperanto", "es": "spanish", "et": "estonian", "eu": "basque",
    "fa": "persian", "fi": "finnish", "fr": "french", "ga": "irish", "hi": "hindi",
    "hu": "hungarian", "hy": "armenian", "id": "indonesian", "it": "italian",
    "lt": "lithuanian", "ne": "nepali", "nl": "dutch", "no": "norwegian", "pl": "polish",
    "pt": "portuguese", "ro": "romanian", "ru": "russian", "sr": "serbian", "sv": "swedish",
    "ta": "tamil", "tr": "turkish", "yi": "yiddish",
}  # fmt: skip
# A question's language counts as clear at this probability among the
# knowledge base's languages; below it the question is analysed in each.
QUERY_CONFIDENCE = 0.9
_STEMMERS: dict[str, Stemmer.Stemmer] = {}


def _stemmable(term: str) -> bool:
    # Plain ASCII words only: identifiers, numbers and other scripts are
    # matched as written, and Porter2 is an English stemmer.
    return term.isascii() and term.isalpha()


@dataclass(frozen=True)
class Analyzer:
    """How text becomes BM25 terms: ``tokenize``, then stop words and stemming.

    Attributes:
        stem: stem plain English words (Snowball Porter2); identifiers never.
        stop_words: plain words dropped from queries (before stemming).
        stop_documents: drop them from documents too (changes chunk lengths).
        header_weight: how many times a chunk's first line (its contextual
            header, ``Title > Section``) is counted; 1 is the text as it is.
    """

    stem: bool = True
    stop_words: frozenset[str] = field(default=STOP_WORDS)
    stop_documents: bool = False
    header_weight: int = 1

    @property
    def signature(self) -> str:
        """What a saved index records, so a different analysis is never mixed in."""
        words = ",".join(sorted(self.stop_words))
        return (
            f"{TOKENIZER_VERSION}:stem={int(self.stem)}:stopdocs={int(self.stop_documents)}"
            f":header={self.header_weight}:stop={words}"
        )

    def query_terms(self, text: str, languages: Sequence[str | None] = (None,)) -> list[str]:
        """The terms of a question analysed in each of ``languages`` (``None``: English rules).

        With several languages each word gives each distinct term it has in
        them, once (``query_languages`` says which to use).
        """
        tokens = tokenize(text)
        if len(languages) == 1:
            return self._terms(tokens, drop=self.stop_words, language=languages[0])
        out: list[str] = []
        for token in tokens:
            variants = (self._terms([token], drop=self.stop_words, language=c) for c in languages)
            out.extend(dict.fromkeys(t for v in variants for t in v))
        return out

    def document_terms(self, text: str, language: str | None = None) -> list[str]:
        """The terms of a chunk's text (header line first, then content), in its ``language``."""
        drop = self.stop_words if self.stop_documents else frozenset()
        terms = self._terms(tokenize(text), drop=drop, language=language)
        if self.header_weight > 1:
            header = self._terms(tokenize(text.split("\n", 1)[0]), drop=drop, language=language)
            terms.extend(header * (self.header_weight - 1))
        return terms

    def _terms(self, tokens: list[str], *, drop: frozenset[str], language: str | None) -> list[str]:
        if language not in (None, ENGLISH):
            return self._foreign_terms(tokens, language)
        kept = [t for t in tokens if t not in drop] if drop else tokens
        if not self.stem:
            return kept
        return [_STEMMER.stemWord(t) if _stemmable(t) else t for t in kept]

    def _foreign_terms(self, tokens: list[str], language: str) -> list[str]:
        # English stop words are English: no list is applied here (BM25's IDF
        # weighs the common words of these languages down).
        # Words fold to what every way of typing them shares; identifiers
        # (``utf-8``, ``store_true``) only lose their marks, names stay as written.
        folded = [fold_letters(t, language) if t.isalpha() else fold_diacritics(t) for t in tokens]
        stemmer = _stemmer(language) if self.stem else None
        if stemmer is None:
            return folded
        return [stemmer.stemWord(t) if t.isalpha() else t for t in folded]


def _stemmer(language: str) -> Stemmer.Stemmer | None:
    algorithm = SNOWBALL.get(language)
    if algorithm is None:
        return None
    stemmer = _STEMMERS.get(algorithm)
    if stemmer is None:  # made on first use, like ``_STEMMER`` shared by every caller
        stemmer = _STEMMERS.setdefault(algorithm, Stemmer.Stemmer(algorithm))
    return stemmer


def question_language(text: str, corpus: Collection[str]) -> str | None:
    """A question's language when it is clear, among ``corpus`` (a knowledge base's
    languages) and English, or clearly another; ``None`` otherwise, and always for a
    knowledge base with no language but English (nothing to tell apart)."""
    known = [c for c in corpus if c and c != ENGLISH]
    if not known:
        return None
    found = detect(text, among=[*known, ENGLISH])
    if found is not None and (found.confidence >= QUERY_CONFIDENCE or found.code not in known):
        return found.code
    return None


def query_languages(text: str, corpus: Collection[str]) -> list[str | None]:
    """The languages a question is analysed in, given the languages its knowledge base holds.

    Its own language when it is clear (``question_language``) and one of
    ``corpus``'s; otherwise every language of ``corpus``, after the clear one
    that is not among them (its words may be those of a language the detector
    mistook for it: Danish typed without ``æ``, ``ø`` and ``å`` can read as
    Norwegian). ``None`` stands for English rules (an English-only knowledge
    base's questions are analysed as they always were).
    """
    known = sorted(c for c in corpus if c and c != ENGLISH)
    if not known:
        return [None]
    code = question_language(text, corpus)
    if code == ENGLISH:
        return [None]
    if code in known:
        return [code]
    return [*([code] if code else []), None, *known]


# The product's analysis; ``PLAIN`` is the tokeniser alone (version 1's terms).
ANALYZER = Analyzer()
PLAIN = Analyzer(stem=False, stop_words=frozenset())
