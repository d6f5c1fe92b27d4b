"""Writing the viewer's HTML as spans of the canonical text: each holds exactly ``text[a:b]``.

``SpanWriter`` collects markup and ranges of the text (adjacent ranges become
one ``<span data-start=a data-end=b>``, its text escaped); ``Lines`` says where
each line is; ``locate`` finds a line's text as a parser stripped it back in
the line (``bot.server.render``, ``bot.server.blocks``).
"""

from __future__ import annotations

import html
import re

__all__ = ["Lines", "SpanWriter", "locate"]

_NEWLINE = re.compile(r"\r\n?|\n")


class SpanWriter:
    """HTML being written: trusted tags, and spans of the canonical text (merged when adjacent)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._parts: list[str] = []
        self._pending: tuple[int, int] | None = None

    def tag(self, markup: str) -> None:
        """Append markup this module wrote (never document text)."""
        self._flush()
        self._parts.append(markup)

    def span(self, start: int, end: int) -> None:
        """Show ``text[start:end]``; empty ranges show nothing."""
        if start >= end:
            return
        if self._pending is not None and self._pending[1] == start:
            self._pending = (self._pending[0], end)
            return
        self._flush()
        self._pending = (start, end)

    def html(self) -> str:
        """Everything written, as one string."""
        self._flush()
        return "".join(self._parts)

    def _flush(self) -> None:
        if self._pending is None:
            return
        start, end = self._pending
        self._pending = None
        # A raw CR would become LF in the HTML parser; the extractors never leave one, a .md may.
        body = html.escape(self.text[start:end], quote=True).replace("\r", "&#13;")
        self._parts.append(f'<span data-start="{start}" data-end="{end}">{body}</span>')


class Lines:
    """Where each line of the text starts and ends (without its newline).

    Lines end as markdown-it ends them (CR LF, CR or LF): its line numbers are these.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        breaks = list(_NEWLINE.finditer(text))
        self.starts = [0] + [m.end() for m in breaks]
        self.ends = [m.start() for m in breaks] + [len(text)]

    def __len__(self) -> int:
        return len(self.starts)

    def bounds(self, i: int) -> tuple[int, int]:
        """Start and end (before the newline) of line ``i``."""
        return self.starts[i], self.ends[i]

    def newline(self, i: int) -> tuple[int, int]:
        """Where the newline ending line ``i`` is (empty after the last line)."""
        end = self.ends[i]
        return end, self.starts[i + 1] if i + 1 < len(self.starts) else end

    def line(self, i: int) -> str:
        """Line ``i`` without its newline."""
        start, end = self.bounds(i)
        return self.text[start:end]


def locate(line: str, content: str) -> tuple[int, int]:
    """Where ``content`` (a line as a parser stripped it) sits in ``line``, as (start, end).

    Parsers strip from the left (indentation, container marks) and trim the
    right, so the content is the line's last occurrence of it; if it is not
    found as it is (a tab the parser expanded), the line's text without its
    indentation is shown instead, so nothing is ever lost.
    """
    for probe in (content, content.strip()):
        if probe:
            k = line.rfind(probe)
            if k >= 0:
                return k, k + len(probe)
    stripped = line.lstrip()
    return len(line) - len(stripped), len(line.rstrip())
