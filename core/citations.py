"""Deterministic resolution of the ``[n]`` citations in a model's answer.

The model is given numbered sources and asked to cite them as ``[n]``. What it
writes back is untrusted text, so this module decides, with fixed rules, which
brackets are citations, keeps only numbers that name a real source, and
renumbers the cited sources ``1..m`` in order of first appearance.

Shapes read as citations (each bracket is a *group*, adjacent groups form a
*run*)::

    [1]   [1, 3]   [1,3]   [1][3]   [1] [3]   [1-3]   [1–3]

Rules, chosen so that a number that points at nothing never becomes a link and
a valid number is never dropped without trace:

* A number is valid when ``1 <= n <= n_sources``. A range ``[a-b]`` (hyphen or
  en dash) stands for ``a..b`` and is valid when both ends are valid and
  ``a <= b``; otherwise the whole range is invalid.
* A run (not glued to a word, see below) with at least one valid number is a
  citation: its valid numbers are kept (renumbered, de-duplicated, sorted
  inside each group) and its invalid numbers are *dropped* from the text.
  Every group that held an invalid number is recorded in ``Resolved.invalid``
  so the drop is logged, not silent. Keeping the invalid number as literal
  text next to a link would show the reader a source number with no source
  behind it.
* A run with no valid number at all (``[0]``, ``[-1]``, ``[2020]`` with three
  sources) stays literal text and is recorded in ``invalid``.
* Never citations, left untouched and not recorded: anything inside an inline
  code span or a fenced code block; markdown links ``[1](url)``; footnotes
  ``[^1]``; escaped brackets ``\\[1]``; a run right after ``]`` or ``)``
  (``x[i][1]``, ``f(x)[1]``, reference links ``[text][1]``).
* A run glued to a preceding word (no space) is ambiguous: models write
  ``restart the service[1].`` but code writes ``arr[1]``. It reads as prose,
  and so as a possible citation, when the word is letters only (two or more;
  ``_emphasis_`` allowed) or digits only (``in 2023[1]``), is not an attribute
  (``obj.items[1]``), and the run is followed by whitespace or the end of the
  text (after optional closing punctuation such as ``.`` ``,`` ``)``) but not
  by ``=``. Such a run is a citation only if *every* number in it is valid;
  otherwise it stays literal (and is recorded in ``invalid``). Any other glued
  run (``a[1]``, ``x2[1]``, ``my_list[1]``, ``arr[1].x``, ``a[1] = 2``) is
  indexing: left alone, not recorded. A run after a non-ASCII letter
  (``café[1]``, ``文書[1]です``) never looks like code, so it
  follows the ordinary rules; this keeps citations in scripts written
  without spaces. ``read arr[2] first`` in bare prose is indistinguishable
  from ``see the runbook[2] first`` and is read as a citation; the prompt asks
  the model to put code in backticks, where brackets are never citations.
* Indented (four-space) code blocks are not recognised; models fence code.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from enum import Enum

from index.ingest import markdown_structure

__all__ = ["Resolved", "citation_spans", "resolve_citations"]

# Nine digits keep int() cheap and far below Python's int-parsing limit; a
# longer "number" is not a citation shape at all and stays literal.
_ITEM = r"(?:[0-9]{1,9}(?:[ \t]*[-\u2013][ \t]*[0-9]{1,9})?|-[0-9]{1,9})"
# A group followed by "(" is the text of a markdown link, never a citation.
_GROUP = rf"\[[ \t]*{_ITEM}(?:[ \t]*,[ \t]*{_ITEM})*[ \t]*\](?!\()"
_GROUP_RE = re.compile(_GROUP)
_RUN_RE = re.compile(rf"{_GROUP}(?:[ \t]*{_GROUP})*")
_ITEM_RE = re.compile(r"(-?[0-9]+)(?:[ \t]*[-\u2013][ \t]*([0-9]+))?")
_BACKTICKS_RE = re.compile(r"`+")
_BLANK_LINE_RE = re.compile(r"\n[ \t]*\n")
_ASCII_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# Punctuation that may close a sentence or a wrapper right after a glued citation.
_CLOSING = frozenset(
    ".,;:!?)]}'\"*_~\u2019\u201d\u00bb\u3002\u3001\uff0c\uff01\uff1f\uff1b\uff1a\uff09"
)


@dataclass(frozen=True)
class Resolved:
    """A model answer with its citations resolved against the sources.

    Attributes:
        text: the answer with cited sources renumbered ``1..m`` in order of
            first appearance; invalid numbers dropped from citation runs.
        cited: original source numbers; new number ``i + 1`` is ``cited[i]``.
        invalid: bracket groups, as the model wrote them, that held a number
            outside ``1..n_sources`` (for the log).
        unsupported: the answer cites no valid source at all.
    """

    text: str
    cited: list[int]
    invalid: list[str]
    unsupported: bool

    @property
    def spans(self) -> list[tuple[int, int, list[int]]]:
        """The citation groups of ``text``; see :func:`citation_spans`."""
        return citation_spans(self.text, len(self.cited))


class _Context(Enum):
    """How a bracket run sits in the text around it."""

    FREE = "free"  # after a space, punctuation or at the start: an ordinary citation
    GLUED = "glued"  # attached to a prose word ("service[1]."): all or nothing
    CODE = "code"  # indexing, escaped, chained or in code: never a citation


@dataclass(frozen=True)
class _Group:
    start: int
    end: int
    raw: str
    # One entry per item: the numbers it stands for, or None when out of range.
    items: list[list[int] | None]

    @property
    def valid(self) -> list[int]:
        return [n for item in self.items if item is not None for n in item]

    @property
    def has_invalid(self) -> bool:
        return any(item is None for item in self.items)


@dataclass(frozen=True)
class _Run:
    start: int
    end: int
    groups: list[_Group]
    context: _Context

    @property
    def is_citation(self) -> bool:
        if not any(g.valid for g in self.groups):
            return False
        if self.context is _Context.GLUED:
            # A glued run is a citation only when all of it is: "arr[0][1]" is indexing.
            return not any(g.has_invalid for g in self.groups)
        return True


def resolve_citations(answer: str, n_sources: int) -> Resolved:
    """Resolve the citations of ``answer`` against ``n_sources`` numbered sources.

    Args:
        answer: the model's text.
        n_sources: how many sources the prompt listed (numbered from 1).

    Returns:
        The rewritten text, the cited original numbers in order of first
        appearance, the invalid groups and whether nothing valid was cited.
        The rules are in the module docstring.
    """
    renumber: dict[int, int] = {}
    invalid: list[str] = []
    out: list[str] = []
    pos = 0
    for run in _runs(answer, n_sources):
        invalid.extend(g.raw for g in run.groups if g.has_invalid)
        if run.is_citation:
            out.append(answer[pos : run.start])
            out.append(_rewrite_run(answer, run, renumber))
            pos = run.end
    out.append(answer[pos:])
    cited = sorted(renumber, key=renumber.__getitem__)
    return Resolved(text="".join(out), cited=cited, invalid=invalid, unsupported=not cited)


def citation_spans(text: str, n_cited: int) -> list[tuple[int, int, list[int]]]:
    """Find the citation groups of an already resolved text.

    ``n_cited`` is required because a resolved text may still hold literal
    brackets such as ``[2020]``: only numbers in ``1..n_cited`` are citations.

    Args:
        text: ``Resolved.text``.
        n_cited: ``len(Resolved.cited)``.

    Returns:
        ``(start, end, numbers)`` for each citation group in text order, where
        ``text[start:end]`` is the whole group (``[1, 2]``) and ``numbers`` are
        the source numbers it cites.
    """
    return [
        (g.start, g.end, _unique(g.valid))
        for run in _runs(text, n_cited)
        if run.is_citation
        for g in run.groups
        if g.valid
    ]


def _runs(text: str, n: int) -> list[_Run]:
    """Every bracket run that could be a citation (code contexts already left out)."""
    code = _code_ranges(text)
    runs: list[_Run] = []
    for match in _RUN_RE.finditer(text):
        start, end = match.span()
        if _inside(code, start):
            continue
        context = _context(text, start, end)
        if context is _Context.CODE:
            continue
        groups = [_group(m, n) for m in _GROUP_RE.finditer(text, start, end)]
        runs.append(_Run(start, end, groups, context))
    return runs


def _group(match: re.Match[str], n: int) -> _Group:
    raw = match.group()
    items = [_item(m, n) for m in _ITEM_RE.finditer(raw)]
    return _Group(match.start(), match.end(), raw, items)


def _item(match: re.Match[str], n: int) -> list[int] | None:
    """The numbers an item stands for, or None when any of them is out of range."""
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if not 1 <= first <= last <= n:
        return None
    return list(range(first, last + 1))


def _rewrite_run(text: str, run: _Run, renumber: dict[int, int]) -> str:
    """Render the run with new numbers; groups left with nothing new disappear."""
    parts: list[str] = []
    seen: set[int] = set()
    prev_end = run.start
    for group in run.groups:
        fresh = [n for n in _unique(group.valid) if n not in seen]
        separator = text[prev_end : group.start]
        prev_end = group.end
        if not fresh:
            continue
        seen.update(fresh)
        new = sorted(renumber.setdefault(n, len(renumber) + 1) for n in fresh)
        parts.append((separator if parts else "") + "[" + ", ".join(map(str, new)) + "]")
    return "".join(parts)


def _context(text: str, start: int, end: int) -> _Context:
    """Classify a run by what touches it; the rules are in the module docstring."""
    if start == 0:
        return _Context.FREE
    before = text[start - 1]
    if before in "\\])":
        # Escaped bracket, "x[i][1]", "f(x)[1]" or a reference link "[text][1]".
        return _Context.CODE
    if before not in _ASCII_WORD_CHARS:
        return _Context.FREE
    if _prose_word_before(text, start) and _prose_after(text, end):
        return _Context.GLUED
    return _Context.CODE


def _prose_word_before(text: str, start: int) -> bool:
    """Whether the word the run is glued to reads as prose ("service", "2023")."""
    word_start = start
    while word_start > 0 and (text[word_start - 1].isalnum() or text[word_start - 1] == "_"):
        word_start -= 1
    # Underscores around a word are markdown emphasis ("_see the runbook_[1]").
    core = text[word_start:start].strip("_")
    if core.isdecimal() and core.isascii():
        return True
    if not (core.isalpha() and len(core) >= 2):
        return False
    # "obj.items[1]" is attribute access; "e.g.[1]" never gets here (glued to ".").
    attribute = word_start >= 2 and text[word_start - 1] == "." and text[word_start - 2].isalnum()
    return not attribute


def _prose_after(text: str, end: int) -> bool:
    """Whether the run ends a word in prose, not an expression (``arr[1].x``, ``a[1] = 2``)."""
    i = end
    while i < len(text) and text[i] in _CLOSING:
        i += 1
    if i < len(text) and not text[i].isspace():
        return False
    rest = text[i : i + 16].lstrip(" \t")
    return not rest.startswith("=")


def _unique(numbers: list[int]) -> list[int]:
    return list(dict.fromkeys(numbers))


def _inside(ranges: list[tuple[int, int]], pos: int) -> bool:
    """Whether ``pos`` falls in one of the sorted, non-overlapping ``ranges``."""
    i = bisect.bisect_right(ranges, (pos, math.inf)) - 1
    return i >= 0 and pos < ranges[i][1]


def _code_ranges(text: str) -> list[tuple[int, int]]:
    """Spans of fenced code blocks and inline code spans (CommonMark, simplified)."""
    # The same fence rules the chunker uses: a fence is code wherever it appears.
    fenced = markdown_structure(text)[1]
    ranges = list(fenced)
    pos = 0
    for a, b in [*fenced, (len(text), len(text))]:
        for para_start, para_end in _paragraphs(text, pos, a):
            ranges.extend(_inline_code(text, para_start, para_end))
        pos = b
    return sorted(ranges)


def _paragraphs(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Split ``text[start:end]`` at blank lines: a code span never crosses a paragraph."""
    out: list[tuple[int, int]] = []
    pos = start
    for m in _BLANK_LINE_RE.finditer(text, start, end):
        out.append((pos, m.start()))
        pos = m.end()
    out.append((pos, end))
    return out


def _inline_code(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Code spans: a backtick string closed by the next backtick string of equal length."""
    ticks = [(m.start(), m.end()) for m in _BACKTICKS_RE.finditer(text, start, end)]
    # Indices of the backtick strings of each width, so finding a closer is a bisect.
    by_width: dict[int, list[int]] = {}
    for i, (a, b) in enumerate(ticks):
        by_width.setdefault(b - a, []).append(i)
    ranges: list[tuple[int, int]] = []
    i = 0
    while i < len(ticks):
        same = by_width[ticks[i][1] - ticks[i][0]]
        k = bisect.bisect_right(same, i)
        if k == len(same):
            i += 1  # an unmatched backtick string is literal text
            continue
        close = same[k]
        ranges.append((ticks[i][0], ticks[close][1]))
        i = close + 1
    return ranges
