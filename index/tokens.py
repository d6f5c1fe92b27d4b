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
"""

from __future__ import annotations

import re
import unicodedata

# Bump on any change to the rules: saved BM25 indexes record it and are
# rebuilt when it differs, since their vocabulary would no longer match queries.
TOKENIZER_VERSION = 1

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
    terms = list(run)
    terms.extend(run[i : i + 2] for i in range(len(run) - 1))
    return terms
