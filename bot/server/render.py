"""A document's canonical text -> the viewer's HTML, formatted, with every character's offset kept.

The viewer shows headings, lists, code blocks and tables as such, yet a citation
``#char=a,b`` names positions in the canonical text itself. So every piece of
text shown is a ``<span data-start=a data-end=b>`` holding exactly
``canonical[a:b]`` (escaped), and the spans appear in document order without
overlapping. What no span holds is syntax (``## ``, a list's ``- ``, fence
lines, table pipes, the blank lines between blocks): not shown, but its offsets
still exist, so a range that starts in a mark highlights the text it covers
(``static/viewer.js`` does that in the browser).

By kind:

- ``md``: parsed with markdown-it-py (CommonMark plus tables, raw HTML off so a
  document's markup is text), whose blocks know their source lines; a block's
  text is found back in its lines, its emphasis and code spans by
  ``bot.server.inline`` (a block with a link or an image is shown as written).
  Lines no block claims (link reference definitions) are shown as they are.
- ``html``, ``docx``, ``pptx``, ``xlsx``, ``csv``: the Markdown-like text the
  extractors write, read by their own rules (``bot.server.blocks``), not as
  Markdown, which would also take the document's own ``*`` for markup.
- anything else (plain text, PDF, OCR'd pages), and any document over
  ``MAX_FORMATTED_CHARS`` or ``MAX_FORMATTING_WORK``: the whole text in one
  span in a ``<pre>``, as written (the highlight works the same).

Cost: formatting is linear in the text, but markdown-it-py and the writers pay
tens of microseconds for each line and each markup character, so a document
made of little else (one paragraph of 200,000 one-letter lines, a line of
``[``) would take seconds for a few hundred kilobytes. ``formatting_work``
counts them first, in C, and past the bound the text is shown plain.
``Formatter`` formats on a thread of its own (never the default executor that
health checks, searches and answers use), each version of a text once
(a small LRU cache bounded in characters), and a text asked for again while it
is being formatted waits for that one formatting.

A code fence's info string (its language) is shown above the code. Nothing of
the document becomes markup: its ``<script>`` is text in a span.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, TypeVar

from cachetools import LRUCache

from bot.server.blocks import write_blocks
from bot.server.inline import ContentMap, Part, inline_parts
from bot.server.spans import Lines, SpanWriter, locate

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

__all__ = [
    "FORMATTED_KINDS",
    "MAX_FORMATTED_CHARS",
    "MAX_FORMATTING_WORK",
    "Formatter",
    "Rendered",
    "formatting_work",
    "render_document",
]

MARKDOWN_KINDS = frozenset({"md"})
# The kinds whose text the extractors write as Markdown-like blocks.
BLOCK_KINDS = frozenset({"html", "docx", "pptx", "xlsx", "csv"})
FORMATTED_KINDS = MARKDOWN_KINDS | BLOCK_KINDS
# Past this many characters a document is shown as plain text: a browser lays
# out such a page slowly, formatted.
MAX_FORMATTED_CHARS = 400_000
# Past this much work (``formatting_work``) too: about 20 to 55 us each on a
# loaded 2-core machine for the costliest shapes (lists of one-letter items, a
# line of "![", one-letter lines), so at most about a second; the costliest
# Markdown file bundled here (docs/benchmarks.md, 65,000 characters) is 5,800.
MAX_FORMATTING_WORK = 20_000
# What markdown-it-py stops at: its inline rules' terminator characters, and
# line ends (counted twice: a line costs a block rule pass besides).
_MARKUP = "\n!#$%&*+-:<=>@[\\]^_`{}~|"
# The documents formatted last (a reader opens several links into one
# document), in characters of text and HTML together.
CACHED_CHARS = 24_000_000
# Threads formatting for the viewer: one, so that a burst of opens queues here
# and no more than one core is ever spent on formatting.
FORMATTING_THREADS = 1

T = TypeVar("T")

_ALIGN = re.compile(r"text-align:(left|center|right)")
_WORD = re.compile(r"\w")


@dataclass(frozen=True)
class Rendered:
    """The document element's HTML and how it is to be shown.

    Attributes:
        html: the children of the viewer's ``#doc`` element; all document text escaped.
        length: the canonical text's length in code points (``#char`` positions run to it).
        layout: ``markdown`` or ``blocks`` (formatted, by the rules for Markdown or
            for the extractors' text), or ``plain`` (the text in one ``<pre>``).
    """

    html: str
    length: int
    layout: str

    @property
    def formatted(self) -> bool:
        """Whether headings, lists, code and tables are shown as such."""
        return self.layout != "plain"


def formatting_work(text: str) -> int:
    """What formatting ``text`` costs, in lines and markup characters (``MAX_FORMATTING_WORK``).

    Counted in C (``str.count``), so a text too costly to format costs little to refuse.
    """
    return sum(text.count(mark) for mark in _MARKUP) + text.count("\n")


def formattable(text: str, kind: str) -> bool:
    """Whether a document of ``kind`` whose text is ``text`` is shown formatted."""
    return (
        kind in FORMATTED_KINDS
        and len(text) <= MAX_FORMATTED_CHARS
        and formatting_work(text) <= MAX_FORMATTING_WORK
    )


def render_document(text: str, kind: str) -> Rendered:
    """The viewer's HTML for a document of ``kind`` whose canonical text is ``text``."""
    if not formattable(text, kind):
        return _plain(text)
    if kind in MARKDOWN_KINDS:
        return Rendered(_MarkdownWriter(text).write(), len(text), "markdown")
    return Rendered(write_blocks(text), len(text), "blocks")


def _plain(text: str) -> Rendered:
    out = SpanWriter(text)
    out.tag("<pre>")
    out.span(0, len(text))
    out.tag("</pre>")
    return Rendered(out.html(), len(text), "plain")


class Formatter:
    """Formats documents for the viewer on its own thread, each version of a text once.

    Only the event loop touches the cache and the formattings under way, so
    neither needs a lock.
    """

    def __init__(self, threads: int = FORMATTING_THREADS, cached_chars: int = CACHED_CHARS) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="kb-viewer-format")
        self._cache: LRUCache[tuple[str, str], Rendered] = LRUCache(
            cached_chars, getsizeof=_cached_size
        )
        self._under_way: dict[tuple[str, str], asyncio.Future[Rendered]] = {}
        self._pending = 0

    @property
    def pending(self) -> int:
        """Pieces of work queued or running on the formatter's thread."""
        return self._pending

    async def render(self, text: str, kind: str) -> Rendered:
        """``render_document(text, kind)``, formatted on this formatter's thread or cached."""
        if kind not in FORMATTED_KINDS or len(text) > MAX_FORMATTED_CHARS:
            return await self.run(_plain, text)  # not hashed: it may be millions of characters
        key = (kind, text)  # the text itself: a new version is a new key, never a stale page
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        future = self._under_way.get(key)
        if future is None:
            future = self._submit(render_document, text, kind)
            self._under_way[key] = future
            future.add_done_callback(lambda done: self._finished(key, done))
        # Shielded: one reader closing the page must not cancel the others' formatting.
        return await asyncio.shield(future)

    async def run(self, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` on this formatter's thread (the page around a formatted text)."""
        return await self._submit(work, *args)

    def _submit(self, work: Callable[..., T], *args: object) -> asyncio.Future[T]:
        future = asyncio.get_running_loop().run_in_executor(self._executor, work, *args)
        self._pending += 1
        future.add_done_callback(self._one_less)
        return future

    def _one_less(self, _: object) -> None:
        self._pending -= 1

    def close(self) -> None:
        """Stop formatting: queued work is dropped, the thread ends after the current one."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _finished(self, key: tuple[str, str], done: asyncio.Future[Rendered]) -> None:
        self._under_way.pop(key, None)
        if done.cancelled() or done.exception() is not None:
            return
        rendered = done.result()
        if _cached_size(rendered) <= self._cache.maxsize:
            self._cache[key] = rendered


def _cached_size(rendered: Rendered) -> int:
    # The key holds the text (``length`` characters), the value its HTML.
    return rendered.length + len(rendered.html)


# ---------------------------------------------------------------- Markdown


@cache
def _markdown() -> MarkdownIt:
    """The parser, made with the first Markdown document shown: not with every server."""
    from markdown_it import MarkdownIt

    # text_join off: an escape (\\#) stays a token of its own, so its backslash can be found.
    return (
        MarkdownIt("commonmark", {"html": False})
        .enable(["table", "strikethrough"])
        .disable("text_join")
    )


# Containers written as their tag; markdown-it's own attributes are not copied.
_CONTAINERS = frozenset({"blockquote", "ul", "li"})


class _MarkdownWriter:
    """Writes markdown-it's block tokens as HTML, their text as spans of the source lines."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = Lines(text)
        self.out = SpanWriter(text)
        self._next_line = 0  # lines before this one are shown or known to hold no text

    def write(self) -> str:
        """The document's HTML."""
        tokens = _markdown().parse(self.text)
        i = 0
        while i < len(tokens):
            i = self._token(tokens, i)
        self._unclaimed(len(self.lines))
        return self.out.html()

    def _token(self, tokens: list[Token], i: int) -> int:
        """Write ``tokens[i]`` (a whole table from its opening); return the next index."""
        token = tokens[i]
        if token.map is not None and token.type in (
            "paragraph_open", "heading_open", "fence", "code_block", "hr", "table_open",
        ):  # fmt: skip
            self._unclaimed(token.map[0])
            self._next_line = max(self._next_line, token.map[1])
        if token.type == "table_open":
            return self._table(tokens, i)
        if token.type == "inline" and token.map is not None:
            self._inline(token)
        elif token.type in ("fence", "code_block") and token.map is not None:
            self._code(token)
        elif token.type == "hr":
            self.out.tag("<hr>")
        elif token.type == "ordered_list_open":
            start = token.attrGet("start")
            self.out.tag(f'<ol start="{int(start)}">' if start is not None else "<ol>")
        elif token.type.endswith(("_open", "_close")) and not token.hidden:
            self._container(token)
        return i + 1

    def _container(self, token: Token) -> None:
        tag = token.tag
        if tag in _CONTAINERS or tag in ("p", "ol") or re.fullmatch(r"h[1-6]", tag):
            self.out.tag(f"<{tag}>" if token.nesting == 1 else f"</{tag}>")

    def _inline(self, token: Token) -> None:
        """A block's text: with its inline markup when every piece is found, else as written."""
        where, exact = self._content_map(token)
        shown = inline_parts(token.content, token.children or [], where) if exact else None
        pieces: Iterable[Part] = shown if shown is not None else where.spans(0, len(token.content))
        for piece in pieces:
            if isinstance(piece, str):
                self.out.tag(piece)
            else:
                self.out.span(*piece)

    def _content_map(self, token: Token) -> tuple[ContentMap, bool]:
        """Where each line of an inline token's content is; whether each was found exactly."""
        assert token.map is not None
        lines: list[tuple[int, int, int]] = []
        newlines: list[tuple[int, int]] = []
        exact = True
        begin = 0
        parts = token.content.split("\n")
        for n, part in enumerate(parts):
            start, end = self.lines.bounds(token.map[0] + n)
            a, b = locate(self.text[start:end], part)
            exact = exact and self.text[start + a : start + b] == part
            lines.append((begin, start + a, b - a))
            begin += len(part) + 1
            if n + 1 < len(parts):
                newlines.append(self.lines.newline(token.map[0] + n))
        return ContentMap(lines, newlines), exact

    def _code(self, token: Token) -> None:
        assert token.map is not None
        first = token.map[0] + (1 if token.type == "fence" else 0)
        if token.type == "fence" and token.info.strip():
            # The fence's info string (a language) is the document's words: shown above the code.
            start, end = self.lines.bounds(token.map[0])
            a, b = locate(self.text[start:end], token.info.strip())
            self.out.tag('<p class="code-info">')
            self.out.span(start + a, start + b)
            self.out.tag("</p>")
        self.out.tag("<pre><code>")
        # Each line ends in "\n", but the document's last line may have none.
        parts = token.content.split("\n")
        for n, part in enumerate(parts[:-1] if parts[-1] == "" else parts):
            start, end = self.lines.bounds(first + n)
            line = self.text[start:end]
            if part:
                a = len(line) - len(part) if line.endswith(part) else locate(line, part)[0]
                self.out.span(start + a, end)
            self.out.span(*self.lines.newline(first + n))
        self.out.tag("</code></pre>")

    def _table(self, tokens: list[Token], i: int) -> int:
        """Write the table opening at ``tokens[i]`` from its source rows; return the index after it."""
        aligns: list[str] = []
        rows: list[tuple[int, bool]] = []  # (line, in the head)
        head = False
        while tokens[i].type != "table_close":
            token = tokens[i]
            if token.type in ("thead_open", "thead_close"):
                head = token.nesting == 1
            elif token.type == "tr_open" and token.map is not None:
                rows.append((token.map[0], head))
            elif token.type == "th_open":
                m = _ALIGN.search(str(token.attrGet("style") or ""))
                aligns.append(m[1] if m else "")
            i += 1
        self.out.tag("<table>")
        for line, in_head in rows:
            self._row(line, "th" if in_head else "td", aligns)
        self.out.tag("</table>")
        return i + 1

    def _row(self, line: int, cell: str, aligns: list[str]) -> None:
        start, _ = self.lines.bounds(line)
        self.out.tag("<tr>")
        for n, (a, b) in enumerate(_table_cells(self.lines.line(line))):
            align = aligns[n] if n < len(aligns) else ""
            self.out.tag(f'<{cell} class="align-{align}">' if align else f"<{cell}>")
            self.out.span(start + a, start + b)
            self.out.tag(f"</{cell}>")
        self.out.tag("</tr>")

    def _unclaimed(self, upto: int) -> None:
        """Show the lines before ``upto`` that no block claimed but hold words."""
        for n in range(self._next_line, upto):
            line = self.lines.line(n)
            if _WORD.search(line):
                start, _ = self.lines.bounds(n)
                a, b = locate(line, line.strip())
                self.out.tag('<p class="unparsed">')
                self.out.span(start + a, start + b)
                self.out.tag("</p>")
        self._next_line = max(self._next_line, upto)


def _table_cells(line: str) -> list[tuple[int, int]]:
    """The (start, end) of each cell's text in a GFM table row; pipes and padding are syntax."""
    bounds: list[int] = []  # positions of the unescaped pipes
    k = 0
    while k < len(line):
        if line[k] == "\\":
            k += 2
            continue
        if line[k] == "|":
            bounds.append(k)
        k += 1
    stripped = line.strip()
    lead = line.index(stripped[0]) if stripped else 0
    edges = [lead - 1 if not stripped.startswith("|") else bounds.pop(0)]
    edges += bounds
    if not stripped.endswith("|") or (stripped.endswith("\\|")):
        edges.append(len(line.rstrip()))
    cells = []
    for left, right in zip(edges, edges[1:], strict=False):
        a, b = left + 1, right
        inner = line[a:b]
        a += len(inner) - len(inner.lstrip())
        b -= len(inner) - len(inner.rstrip())
        cells.append((a, max(a, b)))
    return cells
