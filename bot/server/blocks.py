"""The Markdown-like text the extractors write for HTML and Office documents, as the viewer's HTML.

``index.ingest.extract``, ``office`` and ``sheets`` write blocks between blank
lines: ATX headings (``## Title``), ``- `` and ``1. `` items (two spaces per
level), code fences (an HTML ``<pre>``), rows of cells separated by `` | ``
(one block each), and a ``\\`` before a line that would look like a heading
or a fence. They are read by those rules, not as Markdown, which would also
take the document's own ``*`` and ``[x](y)`` for markup. Consecutive one-line
blocks of cells become one table. Text is shown as spans (``bot.server.spans``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from bot.server.spans import Lines, SpanWriter

__all__ = ["write_blocks"]

# As index.ingest.office writes table rows.
_CELL_SEPARATOR = " | "
_HEADING = re.compile(r"(#{1,6}) +(?=\S)")
_FENCE = re.compile(r"`{3,}|~{3,}")
_ITEM = re.compile(r"( *)(?:(-)|(\d{1,9})\.) ")
# The backslash the extractors put before a line that would read as a heading or fence.
_ESCAPED = re.compile(r"\\(?=#{1,6}(?:[ \t]|$)|`{3}|~{3})")


def write_blocks(text: str) -> str:
    """The viewer's HTML for the extractors' text of an HTML or Office document."""
    return _BlockWriter(text).write()


@dataclass(frozen=True)
class _Block:
    """Lines ``first`` to ``last`` (inclusive) of the text, one block between blank lines."""

    first: int
    last: int


class _BlockWriter:
    """Writes the Markdown-like text of HTML and Office documents by the extractors' rules."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = Lines(text)
        self.out = SpanWriter(text)
        self._lists: list[tuple[int, str]] = []  # open lists: (indent, "ul"/"ol")

    def write(self) -> str:
        """The document's HTML."""
        blocks = list(self._blocks())
        i = 0
        while i < len(blocks):
            i = self._block(blocks, i)
        self._close_lists(-1)
        return self.out.html()

    def _blocks(self) -> Iterator[_Block]:
        n, total = 0, len(self.lines)
        while n < total:
            if not self.lines.line(n).strip():
                n += 1
                continue
            first = n
            fence = _FENCE.fullmatch(self.lines.line(n))
            if fence:  # a code block runs to its closing fence, blank lines included
                n += 1
                while n < total and self.lines.line(n) != fence[0]:
                    n += 1
                yield _Block(first, min(n, total - 1))
                n += 1
                continue
            while n < total and self.lines.line(n).strip():
                n += 1
            yield _Block(first, n - 1)

    def _block(self, blocks: list[_Block], i: int) -> int:
        """Write ``blocks[i]`` (a run of table rows from there); return the next index."""
        block = blocks[i]
        line = self.lines.line(block.first)
        item = _ITEM.match(line)
        if not item:
            self._close_lists(-1)
        if _FENCE.fullmatch(line):
            self._code(block)
        elif item:
            self._item(block, item)
        elif block.first == block.last and _HEADING.match(line):
            self._heading(block.first)
        else:
            rows = self._table_rows(blocks, i)
            if len(rows) >= 2:
                self._table(rows)
                return i + len(rows)
            self._paragraph(block, 0, "p")
        return i + 1

    def _heading(self, n: int) -> None:
        m = _HEADING.match(self.lines.line(n))
        assert m is not None
        level = len(m[1])
        start, end = self.lines.bounds(n)
        self.out.tag(f"<h{level}>")
        self.out.span(start + m.end(), end)
        self.out.tag(f"</h{level}>")

    def _code(self, block: _Block) -> None:
        self.out.tag("<pre><code>")
        if block.last > block.first:
            start = self.lines.bounds(block.first + 1)[0]
            closed = self.lines.line(block.last) == self.lines.line(block.first)
            end = self.lines.bounds(block.last - 1 if closed else block.last)[1]
            self.out.span(start, end)
        self.out.tag("</code></pre>")

    def _paragraph(self, block: _Block, skip: int, tag: str) -> None:
        """The block's lines in ``tag``, the first ``skip`` characters of its first line hidden."""
        self.out.tag(f"<{tag}>")
        self._lines_of(block, skip)
        self.out.tag(f"</{tag}>")

    def _lines_of(self, block: _Block, skip: int) -> None:
        for n in range(block.first, block.last + 1):
            start, end = self.lines.bounds(n)
            line = self.text[start:end]
            a = skip if n == block.first else len(line) - len(line.lstrip(" "))
            escaped = _ESCAPED.match(line, a)
            self.out.span(start + (escaped.end() if escaped else a), end)
            if n < block.last:
                self.out.span(*self.lines.newline(n))

    def _item(self, block: _Block, item: re.Match[str]) -> None:
        indent, tag = len(item[1]), "ul" if item[2] else "ol"
        self._close_lists(indent)
        if self._lists and self._lists[-1] == (indent, tag):
            self.out.tag("</li>")
        else:
            if self._lists and self._lists[-1][0] == indent:  # the other kind of list
                self._close_lists(indent - 1)
            start = f' start="{int(item[3])}"' if tag == "ol" and item[3] != "1" else ""
            self.out.tag(f"<{tag}{start}>")
            self._lists.append((indent, tag))
        self.out.tag("<li>")
        self._lines_of(block, item.end())

    def _close_lists(self, indent: int) -> None:
        """Close the open lists deeper than ``indent`` (all of them for -1)."""
        while self._lists and self._lists[-1][0] > indent:
            _, tag = self._lists.pop()
            self.out.tag(f"</li></{tag}>")

    def _table_rows(self, blocks: list[_Block], i: int) -> list[int]:
        """The lines of the one-line blocks of cells from ``blocks[i]`` on."""
        rows = []
        # Indexed, not islice: islice walks from the list's start on every call.
        for k in range(i, len(blocks)):
            block = blocks[k]
            line = self.lines.line(block.first)
            if block.first != block.last or _CELL_SEPARATOR not in line or _ITEM.match(line):
                break
            if _FENCE.fullmatch(line) or _HEADING.match(line):
                break
            rows.append(block.first)
        return rows

    def _table(self, rows: list[int]) -> None:
        self.out.tag("<table>")
        for n in rows:
            start, end = self.lines.bounds(n)
            line = self.text[start:end]
            escaped = _ESCAPED.match(line)
            position = escaped.end() if escaped else 0
            self.out.tag("<tr>")
            for cell in line[position:].split(_CELL_SEPARATOR):
                self.out.tag("<td>")
                self.out.span(start + position, start + position + len(cell))
                self.out.tag("</td>")
                position += len(cell) + len(_CELL_SEPARATOR)
            self.out.tag("</tr>")
        self.out.tag("</table>")
