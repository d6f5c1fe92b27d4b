"""Text in the form it is analysed and compared in: compatibility forms folded, invisible characters gone.

A question typed in full-width letters (``ｈｏｗ ｄｏ Ｉ …``), in mathematical
bold, or with zero-width characters between its letters means what its plain
form means, but to the embedding model and BM25 it is other words: it would be
refused. :func:`plain` is the form a question is searched in (and a document's
text is *compared* in, never stored in: a passage's offsets are positions in
its canonical text, which stays as it was read):

* invisible format characters are removed: zero-width space (U+200B), word
  joiner (U+2060), byte order mark (U+FEFF), soft hyphen, bidi embeddings,
  overrides, isolates and marks, tag characters; the zero-width joiner and
  non-joiner (U+200D, U+200C) only where they join nothing (see below);
* control characters other than tab and line breaks become spaces;
* then NFKC folds compatibility forms: full-width and half-width forms,
  mathematical letters and digits, ligatures (``ﬁ``), circled and
  superscript forms, the ideographic space.

The joiner and the non-joiner spell words in Arabic, Persian, the Indic
scripts and emoji sequences: between two letters or symbols of such a script
they stay. Between Latin, Greek or Cyrillic letters (full-width and
mathematical ones included), digits, spaces or punctuation they only hide a
difference, and go.

NFKC does not make a Cyrillic ``о`` a Latin ``o``: those are letters of
another language, and a question in that language means them.

:func:`well_formed` is the text a question is taken in at all: a client that
cuts a message in the middle of an emoji leaves half of its UTF-16 pair (a lone
surrogate, which JSON carries as ``\\ud83d``), and no UTF-8 encoder (the
tokenizer's, SQLite's, the model client's) accepts it.

:func:`unshouted` is a question typed in capitals in sentence case: the
embedding models are cased, and ``KOLIK DNÍ DOVOLENÉ MÁM?`` is other tokens
than ``Kolik dní dovolené mám?`` (multilingual-e5-small put the Czech passage
that answers it at a cosine distance of 0.168 instead of 0.116: refused instead
of answered). BM25 reads both alike (it lower-cases).

:func:`same_text` is the form two passages are compared in to tell copies of one
text apart from different texts (``core.selection``): :func:`plain`, every run of
white space one space, trimmed. A re-saved or re-exported copy of a document
breaks its lines elsewhere, a PDF extracts ligatures (``ﬁ``) and soft hyphens a
``.docx`` does not have: those are the same words. Case is kept: ``-l`` and
``-L``, ``US`` and ``us`` are other words, and an export does not change case.
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["invisible", "plain", "same_text", "unshouted", "visible", "well_formed"]

_JOINERS = frozenset("\u200c\u200d")
# Letters of these scripts never need a joiner; their look-alike forms neither.
_NO_JOINING = ("LATIN", "GREEK", "CYRILLIC", "FULLWIDTH", "HALFWIDTH", "MATHEMATICAL", "DIGIT")
# Control characters that are line breaks or a tab: kept, the text's own layout.
_LAYOUT = frozenset("\t\n\v\f\r\x1c\x1d\x1e\x85")
_SURROGATE = re.compile("[\ud800-\udfff]")
_REPLACEMENT = "\ufffd"


def well_formed(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, the replacement character.

    Python joins an escaped pair (``\\ud83d\\ude42``) into its one character as it
    reads JSON: a surrogate left in a ``str`` is always half of a pair.
    """
    if text.isascii():
        return text
    return _SURROGATE.sub(_REPLACEMENT, text)


def invisible(ch: str) -> bool:
    """Whether ``ch`` is a format character (Unicode category Cf): drawn as nothing at all.

    Zero-width characters, the byte order mark, the soft hyphen, bidi controls
    and tag characters (which spell invisible ASCII) are all Cf.
    """
    return unicodedata.category(ch) == "Cf"


def visible(text: str) -> str:
    """``text`` without its invisible characters (joiners kept where they join letters).

    Nothing visible changes: no character is folded, and line breaks stay.
    """
    if text.isascii():
        return text
    return "".join(ch for i, ch in enumerate(text) if not invisible(ch) or _joining(text, i))


def plain(text: str) -> str:
    """``text`` as it is analysed: invisible characters removed, controls as spaces, NFKC;
    well formed (:func:`well_formed`)."""
    if text.isascii() and text.isprintable():
        return text
    shown = "".join(
        " " if unicodedata.category(ch) == "Cc" and ch not in _LAYOUT else ch
        for ch in visible(well_formed(text))
    )
    return unicodedata.normalize("NFKC", shown)


def same_text(text: str) -> str:
    """``text`` as copies of it are compared: :func:`plain`, its white space folded to single
    spaces and trimmed; case kept.

    Unlike :func:`plain`, every joiner goes, whatever it joins: two copies of one
    text hold the same ones, and a word spelt with one and without it is the same
    word to a reader. The characters that go are looked up in one set, in C: a
    passage is compared in tens of microseconds, where :func:`plain` takes a
    millisecond or two.
    """
    text = well_formed(text)
    table, unseen = _unseen()
    if not unseen.isdisjoint(text):
        text = text.translate(table)
    return " ".join(unicodedata.normalize("NFKC", text).split())


# Where format characters (Cf) are: the first two planes and the tags of plane 14.
_FORMAT_PLANES = ((0, 0x20000), (0xE0000, 0xE1000))


@functools.cache
def _unseen() -> tuple[dict[int, str | None], frozenset[str]]:
    """``str.translate``'s table for :func:`same_text` (each format character removed, each
    control character but the layout ones a space) and those characters; built once, in
    about a tenth of a second."""
    table: dict[int, str | None] = {}
    for start, end in _FORMAT_PLANES:
        for code in range(start, end):
            category = unicodedata.category(chr(code))
            if category == "Cf":
                table[code] = None
            elif category == "Cc" and chr(code) not in _LAYOUT:
                table[code] = " "
    return table, frozenset(chr(c) for c in table)


# A text is shouted when it has at least this many words and not one lower-case letter: a
# word or two in capitals is an acronym or an identifier (``VPN``, ``ERR_TIMEOUT``).
_SHOUTED_WORDS = 3
# A word: two letters or more between spaces and punctuation (``ERR_TIMEOUT`` is none).
_WORD = re.compile(r"(?<![\w-])[^\W\d_]{2,}(?![\w-])")
# Where a sentence starts in a text put in lower case: its start, or after . ! ? and spaces.
_SENTENCE_START = re.compile(r"(^|[.!?]\s+)(\w)")


def unshouted(text: str) -> str:
    """``text`` in sentence case when it is all in capitals (``HOW DO I …?`` -> ``How do i …?``);
    else ``text`` as it is."""
    if any(ch.islower() for ch in text) or len(_WORD.findall(text)) < _SHOUTED_WORDS:
        return text
    return _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2).upper(), text.lower())


def _joining(text: str, i: int) -> bool:
    """Whether ``text[i]`` is a joiner that shapes its neighbours (Arabic, Indic, emoji)."""
    if text[i] not in _JOINERS or not 0 < i < len(text) - 1:
        return False
    return _needs_joiner(text[i - 1]) and _needs_joiner(text[i + 1])


def _needs_joiner(ch: str) -> bool:
    if ch.isascii() or unicodedata.category(ch)[0] not in "LMS":
        return False
    return not unicodedata.name(ch, "").startswith(_NO_JOINING)
