"""Names and titles as they may be shown to people: one line, no tricks, bounded length.

A file name or a title comes from whoever uploaded the document (or from the
document itself: an HTML ``<title>``, PDF metadata). Control characters could
forge lines in a log or in Slack; bidirectional overrides (U+202E...) make
``invoice_gpj.exe`` read as ``invoice_exe.jpg``; zero-width characters make two
different names look the same. All of these are removed, whitespace is
collapsed, and the result is cut to a length every Slack surface accepts,
keeping a file's extension.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import PurePosixPath

__all__ = ["MAX_NAME_CHARS", "display_name"]

MAX_NAME_CHARS = 150
_MAX_SUFFIX_CHARS = 10
# Bidi embeddings, overrides and isolates, marks, and zero-width characters.
_INVISIBLE = frozenset(
    "\u061c\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    "\u2060\u2066\u2067\u2068\u2069\ufeff"
)
_SPACES = re.compile(r"\s+")


def display_name(text: str, limit: int = MAX_NAME_CHARS) -> str:
    """``text`` without control, format or bidi characters, on one line, at most ``limit`` long."""
    kept = "".join(" " if ch.isspace() else ch for ch in text if _visible(ch))
    flat = _SPACES.sub(" ", kept).strip()
    return flat if len(flat) <= limit else _shorten(flat, limit)


def _visible(ch: str) -> bool:
    if ch in _INVISIBLE:
        return False
    # Cc: control characters (NUL, ESC, CR...); Cf: format characters (bidi and the like).
    return ch.isspace() or unicodedata.category(ch) not in {"Cc", "Cf", "Cs", "Co", "Cn"}


def _shorten(name: str, limit: int) -> str:
    suffix = PurePosixPath(name).suffix
    if len(suffix) > _MAX_SUFFIX_CHARS or " " in suffix:
        suffix = ""
    room = max(1, limit - len(suffix) - 1)
    return name[:room].rstrip() + "…" + suffix
