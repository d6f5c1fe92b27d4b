"""Canonical text -> chunks, following strategy E of the seed study.

Rules, in order of precedence:

* A chunk never crosses a heading: each section (the text between two heading
  lines) is chunked on its own. Text before the first heading is a section too.
* Whole paragraphs (runs of non-blank lines; a fenced code block counts as one)
  are packed greedily up to ``budget`` characters. A paragraph is cut only when
  it alone is over the budget: then at sentence ends, then at line ends, then
  between words, and a single run without spaces that is still too long is cut
  hard every ``budget`` characters.
* No overlap. Every chunk's ``content`` is ``canonical[start:end]``, with offsets
  taken from regular-expression match positions in the canonical text.
* ``text`` = contextual header (``Title > Section > Subsection``) + ``\\n`` +
  ``content``; the header is embedded and BM25-indexed but never quoted.
* With a token counter, a chunk whose ``text`` would not fit the encoder's
  window is split further at the same boundaries until it does.

In a sheet (``xlsx``, ``csv``: one row per paragraph, the header row first), a
chunk that starts below the header row has that row appended to its header.

Headings are Markdown ATX lines (``#`` to ``######`` then a space or tab, at
most three spaces of indentation), recognised for the ``md``, ``html`` and Office kinds
(their extractors write headings that way). Lines inside fenced code
blocks (``````` or ``~~~``) are never headings.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from index.models import Chunk, Chunking, Extracted

# Stamped on documents: bump whenever the same document would chunk differently.
CHUNKER_VERSION = "E-2"

HEADER_SEPARATOR = " > "
# A heading line can be arbitrarily long (a whole file on one "# " line); its
# title is repeated in every chunk's header, so it is shortened.
MAX_HEADING_CHARS = 200
HEADING_KINDS = frozenset({"md", "html", "docx", "pptx", "xlsx"})
# Headings read per passage a document may make (``max_chunks``): every heading is
# a section to walk, text or none under it, so a file of bare "# h" lines (2.5
# million in 10 MB) would cost the server seconds per hundred thousand while
# making no passage at all. An honest document has about one heading a passage.
HEADINGS_PER_PASSAGE = 2
# Tables whose sections start with their header row (``index.ingest.sheets``).
SHEET_KINDS = frozenset({"xlsx", "csv"})

Span = tuple[int, int]

# A line that may open or close a fence or be a heading; checked in detail after.
_CANDIDATE_LINE = re.compile(r"^ {0,3}(?:#{1,6}[ \t]|`{3,}|~{3,})", re.MULTILINE)
_HEADING = re.compile(r" {0,3}(#{1,6})[ \t]+(.*)")
_FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_FENCE_CLOSE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*")
_CLOSING_HASHES = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")

# Unit finders, one per level. Every unit starts and ends with a non-space
# character, so a run of whole units is already stripped.
# A paragraph: lines that each hold a non-space character, up to a blank line.
# Each piece ends on a non-space character, so backtracking is bounded by one
# line's trailing spaces and the scan stays linear on a 5 MB single line.
_PARAGRAPH = re.compile(r"\S(?:[^\n]*\S)?(?:[^\S\n]*\n[^\S\n]*\S(?:[^\n]*\S)?)*")
# A sentence ends at a run of . ! ? … (and closing quotes or brackets) followed by
# whitespace, or at a run of 。！？ (and their closers). Matched without the
# whitespace check, which ``sentence_ends`` makes after: with it inside, a run of
# 100,000 dots not followed by a space was tried again from each of its dots,
# each try reading to the run's end (quadratic: 264 s for 80,000 characters).
_SENTENCE_MARKS = re.compile(r"(?:[.!?…]+[\"'”’»)\]]*)|(?:[。！？]+[」』”’）)]*)")
_FULL_STOPS = frozenset("。！？")
_SPACE = re.compile(r"\s")
_LINE = re.compile(r"\S(?:[^\n]*\S)?")
_WORD = re.compile(r"\S+")
_NON_SPACE = re.compile(r"\S")

_BLOCKS, _PARAGRAPHS, _SENTENCES, _LINES, _WORDS, _HARD = range(6)


@dataclass(frozen=True)
class Heading:
    """One ATX heading line of a canonical text.

    Attributes:
        level: 1 to 6 (the number of ``#``).
        title: the heading text, without the ``#`` marks, whitespace collapsed.
        start: offset of the first character of the heading line.
        end: offset just past the heading line (its ``\\n`` or the end of the text).
    """

    level: int
    title: str
    start: int
    end: int


def markdown_structure(
    text: str, max_headings: int | None = None
) -> tuple[list[Heading], list[Span]]:
    """Return the ATX headings and the fenced code blocks of a Markdown text.

    Args:
        text: canonical text (``\\n`` newlines).
        max_headings: when given, stop reading at heading ``max_headings + 1``
            (enough for the caller to refuse the text).

    Returns:
        ``(headings, fences)`` in document order; a fence is ``(start, end)``
        from its opening line to the end of its closing line (or of the text,
        when it is never closed).
    """
    headings: list[Heading] = []
    fences: list[Span] = []
    fence: tuple[str, int, int] | None = None  # (marker char, marker length, start)
    for m in _CANDIDATE_LINE.finditer(text):
        if max_headings is not None and len(headings) > max_headings:
            return headings, fences
        start = m.start()
        line_end = text.find("\n", start)
        if line_end < 0:
            line_end = len(text)
        line = text[start:line_end]
        if fence is not None:
            close = _FENCE_CLOSE.fullmatch(line)
            if close and close[1][0] == fence[0] and len(close[1]) >= fence[1]:
                # End on the marker itself, so the paragraph it closes ends there too.
                fences.append((fence[2], start + len(line.rstrip())))
                fence = None
            continue
        opening = _FENCE_OPEN.fullmatch(line)
        # CommonMark: a backtick fence's info string cannot contain a backtick.
        if opening and not (opening[1][0] == "`" and "`" in opening[2]):
            fence = (opening[1][0], len(opening[1]), start)
            continue
        heading = _HEADING.fullmatch(line)
        if heading:
            headings.append(Heading(len(heading[1]), heading_title(heading[2]), start, line_end))
    if fence is not None:
        fences.append((fence[2], len(text)))
    return headings, fences


def heading_title(raw: str) -> str:
    """Return the display title of a heading's raw text (after the ``#`` marks)."""
    # Only the start matters on a runaway line, and it keeps the regex cheap.
    raw = raw[: 4 * MAX_HEADING_CHARS]
    title = " ".join(_CLOSING_HASHES.sub("", raw).split())
    if len(title) > MAX_HEADING_CHARS:
        title = title[: MAX_HEADING_CHARS - 1].rstrip() + "…"
    return title


def chunk_document(
    doc: Extracted,
    *,
    budget: int = 512,
    count_tokens: Callable[[str], int] | None = None,
    max_tokens: int = 256,
    max_chunks: int | None = None,
) -> Chunking:
    """Cut a document into chunks (strategy E: paragraphs, header, no overlap).

    Args:
        doc: the extracted document; offsets refer to ``doc.text``.
        budget: largest ``content`` in characters.
        count_tokens: the encoder's word-piece counter (special tokens
            included). When given, chunks whose ``text`` would exceed
            ``max_tokens`` are split further.
        max_tokens: the encoder window in word-pieces.
        max_chunks: when given, stop after ``max_chunks + 1`` chunks: enough
            for the caller to refuse the document without paying for the rest;
            and read at most ``HEADINGS_PER_PASSAGE`` times as many headings:
            past that, no chunk is made and ``too_many_headings`` says so.

    Returns:
        The chunks in document order; ``notes`` explains zero chunks, window
        splits and hard cuts.

    Raises:
        ValueError: ``budget`` or ``max_tokens`` is not positive.
    """
    if budget < 1 or max_tokens < 1:
        raise ValueError("budget and max_tokens must be positive")
    text = doc.text
    most = None if max_chunks is None else HEADINGS_PER_PASSAGE * max_chunks
    headings, fences = markdown_structure(text, most) if doc.kind in HEADING_KINDS else ([], [])
    if most is not None and len(headings) > most:
        note = f"More than {most:,} headings: the document is not chunked."
        return Chunking(chunks=[], notes=[note], too_many_headings=most)
    splitter = _Splitter(text, fences)
    window = _Window(count_tokens, max_tokens) if count_tokens else None
    chunks: list[Chunk] = []
    window_splits = 0
    pieces = _pieces(doc, headings, splitter, window, budget)
    for (s, e), header, path, split in pieces:
        window_splits += int(split)
        content = text[s:e]
        chunks.append(
            Chunk(
                ordinal=len(chunks),
                start=s,
                end=e,
                content=content,
                text=f"{header}\n{content}",
                section=HEADER_SEPARATOR.join(path),
                page=_page_of(doc.page_starts, s),
            )
        )
        if max_chunks is not None and len(chunks) > max_chunks:
            break
    notes = _notes(chunks, window_splits, splitter.hard_cuts, window, budget)
    return Chunking(chunks=chunks, window_splits=window_splits, notes=notes)


def _pieces(
    doc: Extracted,
    headings: list[Heading],
    splitter: _Splitter,
    window: _Window | None,
    budget: int,
) -> Iterator[tuple[Span, str, list[str], bool]]:
    """Yield each chunk's span, header and heading path, lazily, in document order.

    The last element is whether the span is the first piece of a window split.
    """
    for start, end, path in _split_at_pages(
        _sections(doc.text, doc.title, headings), doc.page_starts
    ):
        if not _NON_SPACE.search(doc.text, start, end):
            continue  # a heading with nothing under it: no header to fit
        header = HEADER_SEPARATOR.join([doc.title, *path])
        columns = _header_row(doc, start, end)
        with_columns = HEADER_SEPARATOR.join([header, doc.text[columns[0] : columns[1]]])
        if window:
            header = window.fit_header(header)
            with_columns = window.fit_header(with_columns)
        longest = with_columns if columns[1] > columns[0] else header
        for span in splitter.spans(start, end, budget):
            # Fitted under the longer header, every piece fits under either.
            pieces = window.fit(splitter, span, longest) if window else [span]
            for i, piece in enumerate(pieces):
                # A chunk further down a sheet repeats its header row, so it reads alone.
                own = longest if piece[0] >= columns[1] else header
                yield piece, own, path, i == 0 and len(pieces) > 1


def _header_row(doc: Extracted, start: int, end: int) -> Span:
    """The span of a sheet section's first row (its header), or an empty span."""
    if doc.kind not in SHEET_KINDS:
        return (start, start)
    m = _LINE.search(doc.text, start, end)
    return m.span() if m else (start, start)


def sheet_columns(kind: str, title: str, section: str, text: str, content: str) -> str:
    """The header row a sheet chunk repeats in its embedded header, or "" (``_pieces``).

    ``content`` never holds that row (a passage is quoted exactly), so whoever
    shows the passage alone (the prompt) gives it these column names beside it.

    Args:
        kind, title, section: the chunk's document kind and title, its section.
        text, content: the chunk's embedded text and its own words.

    Returns:
        What follows ``title > section >`` in the chunk's contextual header
        (shortened with that header when the encoder window required it); ""
        for other kinds and for a chunk that starts with its sheet's header row.
    """
    if kind not in SHEET_KINDS or not text.endswith("\n" + content):
        return ""
    context = text[: len(text) - len(content) - 1]
    prefix = HEADER_SEPARATOR.join([title, section] if section else [title]) + HEADER_SEPARATOR
    if context.startswith(prefix):
        return context[len(prefix) :]
    # A title stored otherwise than the chunker saw it: the section still says where.
    marker = HEADER_SEPARATOR + section + HEADER_SEPARATOR
    at = context.find(marker) if section else -1
    return context[at + len(marker) :] if at >= 0 else ""


def _sections(
    text: str, title: str, headings: list[Heading]
) -> Iterator[tuple[int, int, list[str]]]:
    """Yield ``(start, end, heading path)`` for the text before and after each heading."""
    yield 0, (headings[0].start if headings else len(text)), []
    bounds = [h.start for h in headings[1:]] + [len(text)]
    stack: list[Heading] = []
    same_as_title = _normal(title)
    for heading, end in zip(headings, bounds, strict=False):
        while stack and stack[-1].level >= heading.level:
            stack.pop()
        stack.append(heading)
        # The document title is already the header's first element.
        path = [
            h.title
            for h in stack
            if h.title and not (h.level == 1 and _normal(h.title) == same_as_title)
        ]
        yield heading.end, end, path


def _split_at_pages(
    sections: Iterator[tuple[int, int, list[str]]], page_starts: tuple[int, ...] | None
) -> Iterator[tuple[int, int, list[str]]]:
    """Cut sections at page starts, so that every chunk lies on one page.

    A citation links to ``#page=N``; a chunk straddling two pages would send
    the reader to a page holding only part of the quote.
    """
    starts = page_starts or ()
    for start, end, path in sections:
        # The page starts inside the section, found by bisection rather than read each time.
        cuts = list(starts[bisect_right(starts, start) : bisect_left(starts, end)])
        for a, b in zip([start, *cuts], [*cuts, end], strict=True):
            yield a, b, path


def _normal(s: str) -> str:
    return " ".join(s.split()).casefold()


def _page_of(page_starts: tuple[int, ...] | None, offset: int) -> int | None:
    """1-based page holding ``offset``, or ``None`` without a page map."""
    if not page_starts:
        return None
    return max(1, bisect_right(page_starts, offset))


def _notes(
    chunks: list[Chunk], window_splits: int, hard_cuts: int, window: _Window | None, budget: int
) -> list[str]:
    notes = []
    if not chunks:
        notes.append("No text outside headings: the document yields no chunks.")
    if window_splits:
        notes.append(
            f"{window_splits} chunk(s) were split further to fit the encoder window "
            f"of {window.max_tokens if window else 0} word-pieces."
        )
    if window and window.overflows:
        notes.append(f"{window.overflows} chunk(s) still exceed the encoder window.")
    if hard_cuts:
        notes.append(
            f"{hard_cuts} run(s) of more than {budget} characters without a space "
            "were cut mid-word."
        )
    return notes


class _Splitter:
    """Finds chunk spans in one canonical text, from paragraphs down to hard cuts."""

    def __init__(self, text: str, fences: list[Span]) -> None:
        self.text = text
        self.fences = fences
        self._fence_ends = [e for _, e in fences]
        self.hard_cuts = 0

    def spans(self, start: int, end: int, budget: int, level: int = _BLOCKS) -> Iterator[Span]:
        """Yield chunk spans covering ``text[start:end]``, whole units packed greedily.

        A unit longer than ``budget`` is never packed with others: it is split
        at the next finer level and its pieces stand alone.
        """
        cur: Span | None = None
        for us, ue in self._units(start, end, level, budget):
            if ue - us > budget:
                if cur:
                    yield cur
                    cur = None
                yield from self.spans(us, ue, budget, level + 1)
            elif cur and ue - cur[0] <= budget:
                cur = (cur[0], ue)
            else:
                if cur:
                    yield cur
                cur = (us, ue)
        if cur:
            yield cur

    def _units(self, start: int, end: int, level: int, budget: int) -> Iterator[Span]:
        if level == _BLOCKS:
            return self._blocks(start, end)
        if level == _PARAGRAPHS:
            return _matches(_PARAGRAPH, self.text, start, end)
        if level == _SENTENCES:
            return self._sentences(start, end)
        if level == _LINES:
            return _matches(_LINE, self.text, start, end)
        if level == _WORDS:
            return _matches(_WORD, self.text, start, end)
        self.hard_cuts += 1
        return ((i, min(i + budget, end)) for i in range(start, end, budget))

    def _blocks(self, start: int, end: int) -> Iterator[Span]:
        """Paragraphs, except that a fenced code block with blank lines stays one unit."""
        fi = bisect_left(self._fence_ends, start + 1)
        cur: Span | None = None
        for m in _PARAGRAPH.finditer(self.text, start, end):
            cur = (cur[0] if cur else m.start(), m.end())
            while fi < len(self.fences) and self._fence_ends[fi] <= cur[1]:
                fi += 1
            if fi < len(self.fences) and self.fences[fi][0] < cur[1]:
                continue  # inside a fence that goes on past this paragraph
            yield cur
            cur = None
        if cur:
            yield cur

    def _sentences(self, start: int, end: int) -> Iterator[Span]:
        pos = start
        for a, b in sentence_ends(self.text, start, end):
            first = _NON_SPACE.search(self.text, pos, a + 1)
            if first:
                yield first.start(), b
            pos = b
        first = _NON_SPACE.search(self.text, pos, end)
        if first:
            yield first.start(), end


def sentence_ends(text: str, start: int = 0, end: int | None = None) -> Iterator[Span]:
    """Where sentences end in ``text[start:end]``: each run of end marks, in linear time.

    A run of ``.!?…`` counts only when whitespace follows it before ``end``;
    a run of ``。！？`` always does.
    """
    stop = len(text) if end is None else end
    for m in _SENTENCE_MARKS.finditer(text, start, stop):
        if text[m.start()] in _FULL_STOPS or _SPACE.match(text, m.end(), stop):
            yield m.span()


def _matches(pattern: re.Pattern[str], text: str, start: int, end: int) -> Iterator[Span]:
    return (m.span() for m in pattern.finditer(text, start, end))


class _Window:
    """Keeps each chunk's ``text`` within the encoder's word-piece window."""

    def __init__(self, count_tokens: Callable[[str], int], max_tokens: int) -> None:
        self.count = count_tokens
        self.max_tokens = max_tokens
        # Tokens added to any text (e.g. [CLS] and [SEP]); measured, not assumed.
        self.overhead = count_tokens("")
        self.overflows = 0
        self._headers: dict[str, str] = {}
        self._header_counts: dict[str, int] = {}

    def fit_header(self, header: str) -> str:
        """Shorten a header to at most half the window, leaving room for content."""
        if header not in self._headers:
            limit = max(1, self.max_tokens // 2)
            short = header
            n = self.count(short)
            while n > limit and len(short) > 1:
                short = short[: max(1, len(short) * limit // n - 1)].rstrip() or short[:1]
                n = self.count(short)
            self._headers[header] = short
        return self._headers[header]

    def fit(self, splitter: _Splitter, span: Span, header: str) -> list[Span]:
        """Split ``span`` at the usual boundaries until every piece's text fits."""
        out: list[Span] = []
        todo = [span]
        header_tokens = self._header_tokens(header)
        while todo:
            s, e = todo.pop()
            n = self._bounded_count(f"{header}\n{splitter.text[s:e]}")
            if n <= self.max_tokens:
                out.append((s, e))
                continue
            if e - s <= 1:
                self.overflows += 1
                out.append((s, e))
                continue
            room = max(1, self.max_tokens - header_tokens)
            content_tokens = max(1, n - header_tokens)
            # Aim a little under the proportional size: tokens are not spread evenly.
            smaller = max(1, min(e - s - 1, (e - s) * room * 9 // (content_tokens * 10)))
            todo.extend(reversed(list(splitter.spans(s, e, smaller))))
        return out

    def _header_tokens(self, header: str) -> int:
        if header not in self._header_counts:
            self._header_counts[header] = self.count(header + "\n")
        return self._header_counts[header]

    def _bounded_count(self, text: str) -> int:
        """Word-pieces of ``text``, or an upper bound when that bound already fits."""
        # In ASCII text every word-piece covers at least one character (no
        # character expands under normalisation), so a short text cannot
        # overflow and the tokenizer need not run. Non-ASCII text can expand
        # (Hangul syllables decompose into jamo), so it is always counted.
        if text.isascii() and len(text) + self.overhead <= self.max_tokens:
            return len(text) + self.overhead
        return self.count(text)


__all__ = [
    "CHUNKER_VERSION",
    "HEADINGS_PER_PASSAGE",
    "HEADER_SEPARATOR",
    "Heading",
    "chunk_document",
    "heading_title",
    "markdown_structure",
    "sentence_ends",
    "sheet_columns",
]
