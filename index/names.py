"""Names and titles as they may be shown to people: one line, no tricks, bounded length.

A file name or a title comes from whoever uploaded the document (or from the
document itself: an HTML ``<title>``, PDF metadata). Control characters could
forge lines in a log or in Slack; bidirectional overrides (U+202E...) make
``invoice_gpj.exe`` read as ``invoice_exe.jpg``; zero-width characters make two
different names look the same. All of these are removed, whitespace is
collapsed, the result is composed (Unicode NFC: a name typed on macOS, whose
file names are decomposed, is the name typed elsewhere) and cut to a length
every Slack surface accepts, keeping a file's extension.

A document's name is also what tells its versions apart (the same name in the
same scope is the next version): ``document_name`` cuts a long one keeping a
short digest of the whole, so that two long names differing past the cut stay
two documents.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from pathlib import PurePosixPath

__all__ = ["MAX_NAME_CHARS", "display_name", "document_name"]

MAX_NAME_CHARS = 150
_MAX_SUFFIX_CHARS = 10
# Hex digits of the whole name's sha256 kept in a cut document name: 32 bits, against
# two long names of one scope that differ past the cut, not against an attacker (who can
# pick any name anyway).
_DIGEST_CHARS = 8
# Bidi embeddings, overrides and isolates, marks, and zero-width characters.
_INVISIBLE = frozenset(
    "\u061c\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    "\u2060\u2066\u2067\u2068\u2069\ufeff"
)
_SPACES = re.compile(r"\s+")


def display_name(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """``text`` without control, format or bidi characters, composed (NFC), on one line, at
    most ``limit`` long."""
    flat = _flat(text)
    return flat if len(flat) <= limit else _shorten(flat, limit, "…")


def document_name(text: str) -> str:
    """A document's name (``display_name``); one cut to ``MAX_NAME_CHARS`` keeps a short digest
    of the whole name before its extension, so that it names the versions of that name only."""
    flat = _flat(text)
    if len(flat) <= MAX_NAME_CHARS:
        return flat
    digest = hashlib.sha256(flat.encode()).hexdigest()[:_DIGEST_CHARS]
    return _shorten(flat, MAX_NAME_CHARS, f"… ({digest})")


def _flat(text: str) -> str:
    kept = "".join(" " if ch.isspace() else ch for ch in text if _visible(ch))
    return unicodedata.normalize("NFC", _SPACES.sub(" ", kept).strip())


def _visible(ch: str) -> bool:
    if ch in _INVISIBLE:
        return False
    # Cc: control characters (NUL, ESC, CR...); Cf: format characters (bidi and the like).
    return ch.isspace() or unicodedata.category(ch) not in {"Cc", "Cf", "Cs", "Co", "Cn"}


def _shorten(name: str, limit: int, mark: str) -> str:
    suffix = PurePosixPath(name).suffix
    if len(suffix) > _MAX_SUFFIX_CHARS or " " in suffix:
        suffix = ""
    room = max(1, limit - len(suffix) - len(mark))
    return name[:room].rstrip() + mark + suffix
