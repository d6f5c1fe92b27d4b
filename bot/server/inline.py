"""Markdown inline markup (emphasis, code, line breaks) as HTML over the source offsets of its text.

markdown-it-py's inline tokens say what a block's text holds (``**``, a code
span, an escaped ``\\#``) but not where: their text is found back, in order, in
the block's content, whose lines ``ContentMap`` places in the canonical text.
Markup characters are skipped (not shown); the text is shown as spans of the
canonical text (``bot.server.render``). Links, images and anything this module
does not know make ``inline_parts`` answer ``None``: the caller then shows the
block's text as written, so no word is ever hidden.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from markdown_it.token import Token

__all__ = ["ContentMap", "Part", "inline_parts"]

# Markup this module writes, or a (start, end) range of the canonical text to show.
Part = str | tuple[int, int]

_TAGS = {
    "em_open": "<em>", "em_close": "</em>",
    "strong_open": "<strong>", "strong_close": "</strong>",
    "s_open": "<s>", "s_close": "</s>",
}  # fmt: skip
_WORD = re.compile(r"\w")


class _Unmapped(Exception):
    """A token's text was not where the content says it is."""


class ContentMap:
    """Where a block's content (lines joined by ``\\n``) is in the canonical text.

    Args:
        lines: for each content line, where it starts in the content, where in
            the canonical text, and its length.
        newlines: the canonical text's newline after each line but the last.
    """

    def __init__(
        self, lines: Sequence[tuple[int, int, int]], newlines: Sequence[tuple[int, int]]
    ) -> None:
        self.lines = lines
        self.newlines = newlines
        self._starts = [line[0] for line in lines]

    def spans(self, i: int, j: int) -> Iterator[tuple[int, int]]:
        """The canonical text's ranges holding content ``[i, j)``, newlines included."""
        n = max(0, bisect.bisect_right(self._starts, i) - 1)
        # Only the lines the range reaches: a block's text is asked for piece by piece,
        # so walking on to the block's last line each time would cost lines x pieces.
        while n < len(self.lines) and i < j:
            begin, source, length = self.lines[n]
            if begin >= j:
                return
            a, b = max(i, begin), min(j, begin + length)
            if a < b:
                yield source + a - begin, source + b - begin
            if j > begin + length and n < len(self.newlines):
                yield self.newlines[n]
            n += 1


def inline_parts(content: str, children: Sequence[Token], where: ContentMap) -> list[Part] | None:
    """The parts showing ``content`` with its inline markup as HTML, or ``None`` if it cannot be.

    ``children`` are markdown-it's inline tokens of ``content``, parsed with
    the ``text_join`` rule off (escapes and entities are tokens of their own).
    """
    parts: list[Part] = []
    cursor = 0
    try:
        for token in children:
            cursor = _token(token, content, cursor, where, parts)
    except _Unmapped:
        return None
    if _WORD.search(content, cursor):
        return None
    return parts


def _find(content: str, needle: str, cursor: int) -> int:
    """Where ``needle`` next is; what it skips must hold no words (those would go unshown)."""
    k = content.find(needle, cursor)
    if k < 0 or _WORD.search(content, cursor, k):
        raise _Unmapped(needle)
    return k


def _token(token: Token, content: str, cursor: int, where: ContentMap, parts: list[Part]) -> int:
    """Add the parts of one inline token; return the content position after it."""
    kind = token.type
    if kind == "text":
        k = _find(content, token.content, cursor)
        parts.extend(where.spans(k, k + len(token.content)))
        return k + len(token.content)
    if kind == "text_special":
        k = _find(content, token.markup, cursor)
        # An escape shows the character it escapes; an entity is shown as written.
        shown = k + 1 if token.info == "escape" else k
        parts.extend(where.spans(shown, k + len(token.markup)))
        return k + len(token.markup)
    if kind in ("softbreak", "hardbreak"):
        k = _find(content, "\n", cursor)
        if kind == "hardbreak":
            parts.append("<br>")
        parts.extend(where.spans(k, k + 1))
        return k + 1
    if kind == "code_inline":
        return _code(token.markup, content, cursor, where, parts)
    if kind in _TAGS:
        k = _find(content, token.markup, cursor)
        parts.append(_TAGS[kind])
        return k + len(token.markup)
    raise _Unmapped(kind)  # a link, an image: shown as written


def _code(fence: str, content: str, cursor: int, where: ContentMap, parts: list[Part]) -> int:
    k = _find(content, fence, cursor) + len(fence)
    # The closing run of backticks is as long as the opening one, no longer.
    close = re.compile(rf"(?<!`){re.escape(fence)}(?!`)").search(content, k)
    if close is None:
        raise _Unmapped(fence)
    parts.append("<code>")
    parts.extend(where.spans(k, close.start()))
    parts.append("</code>")
    return close.end()
