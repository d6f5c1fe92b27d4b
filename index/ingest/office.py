"""Word and PowerPoint files -> canonical text the chunker already understands.

The text is Markdown-like, as for HTML: headings are ATX lines (``## Heading``)
so that sections come from the document's own structure, blocks are separated
by one blank line, list items start with ``- `` or ``1. ``, and table rows are
blocks of their own with cells separated by `` | ``. A line of the document that
the chunker would take for a heading or a code fence is escaped with ``\\``.

Word (python-docx): body paragraphs and tables in document order (the text of
each table cell once, merged cells included once); Title and Heading 1-6 styles
become headings; text in hyperlinks, fields, content controls, tracked
insertions and text boxes is read (deleted text and field codes are not);
headers, footers, footnotes and comments are not read. The
title is the core properties' title, else the first heading.

PowerPoint (python-pptx): one level-1 section per slide, ``Slide 3: <title>``,
so that a citation's section names the slide; the other shapes' text in reading
order (top to bottom, then left to right, groups opened), tables as rows, and
the speaker notes last as a block starting ``Notes:``.

Limits: the text read is counted as it is read (``TextBudget``): every run,
cell and shape each time it is read, so a part read many times counts many
times; a document past ``KB_MAX_TEXT_CHARS`` stops there. A deck that lists one
slide part twice is refused before any slide is read (``office_zip.aliased_part``).
Paragraph styles and list formats are looked up in tables built once per
document: python-docx scans every style for every paragraph.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator

from docx import Document as open_docx
from docx import types as t
from docx.document import Document as DocxDocument
from docx.oxml.ns import nsmap, qn
from docx.oxml.simpletypes import ST_Merge
from docx.oxml.table import CT_Row, CT_Tc
from docx.oxml.xmlchemy import BaseOxmlElement
from docx.styles import BabelFish
from docx.table import Table as DocxTable
from docx.table import _Cell
from docx.text.paragraph import Paragraph
from lxml import etree
from pptx import Presentation as open_pptx
from pptx.shapes.base import BaseShape
from pptx.shapes.group import GroupShape
from pptx.shapes.placeholder import _InheritsDimensions
from pptx.slide import Slide

from index.config import DEFAULT_MAX_TEXT_CHARS
from index.errors import CorruptDocument, EmptyDocument, OverLimit
from index.ingest.office_zip import Package, aliased_part
from index.models import Extracted

CELL_SEPARATOR = " | "
_NS = {"w": nsmap["w"], "mc": "http://schemas.openxmlformats.org/markup-compatibility/2006"}
_P, _TBL, _SDT, _SDT_CONTENT, _T, _TAB = (
    qn(tag) for tag in ("w:p", "w:tbl", "w:sdt", "w:sdtContent", "w:t", "w:tab")
)
_STYLE, _STYLE_ID, _TYPE, _DEFAULT, _NAME, _VAL = (
    qn(tag) for tag in ("w:style", "w:styleId", "w:type", "w:default", "w:name", "w:val")
)
_NUM, _NUM_ID, _ABSTRACT_NUM, _ABSTRACT_NUM_ID, _LVL, _ILVL, _NUM_FMT = (
    qn(tag)
    for tag in (
        "w:num", "w:numId", "w:abstractNum", "w:abstractNumId", "w:lvl", "w:ilvl", "w:numFmt"
    )
)  # fmt: skip
_ON = frozenset({"1", "true", "on"})
# Text of runs, and the paragraphs of text boxes anchored in the paragraph (each a new line).
_TEXT_NODES = etree.XPath(
    ".//w:p[not(ancestor::mc:Fallback)]"
    " | .//w:r[not(ancestor::mc:Fallback)]/*[self::w:t or self::w:tab or self::w:br or self::w:cr]",
    namespaces=_NS,
)
# A line the chunker would read as a heading or a code fence.
_MARKDOWN_LOOKALIKE = re.compile(r" {0,3}(?:#{1,6}(?:[ \t]|$)|`{3}|~{3})")
_HEADING_STYLE = re.compile(r"heading ([1-9])", re.IGNORECASE)
_BLANK_LINES = re.compile(r"\n\s*\n")
_SPACES = re.compile(r"[^\S\n]+")


def safe_line(text: str) -> str:
    """One line of document text, whitespace collapsed, never mistaken for Markdown."""
    line = " ".join(text.split())
    return "\\" + line if _MARKDOWN_LOOKALIKE.match(line) else line


def safe_block(text: str) -> str:
    """A paragraph of document text: its lines kept, blank lines and runs of spaces gone."""
    lines = (safe_line(line) for line in _BLANK_LINES.sub("\n", text).split("\n"))
    return "\n".join(line for line in lines if line)


def heading(level: int, title: str) -> str:
    """A heading line at ``level`` (1-6)."""
    return "#" * min(6, max(1, level)) + " " + " ".join(title.split())


def join_blocks(blocks: Iterable[str]) -> str:
    """The canonical text of a document's blocks: one blank line between them."""
    return "\n\n".join(b for b in blocks if b.strip())


def read_failed(name: str, filename: str, what: str, exc: Exception) -> CorruptDocument:
    """The error for a package its reader could not read."""
    detail = " ".join(str(exc).split())[:200]
    return CorruptDocument(
        f"{name} is a damaged {what} file that could not be read ({type(exc).__name__}: "
        f"{detail}). Save it again from {what} and upload the new copy.",
        filename=filename,
    )


class TextBudget:
    """The characters of text one document may yield, counted while it is read.

    ``spend`` is called with each piece of text as it is read (a run's
    paragraph, a cell, a shape's line), so a part read many times is counted
    each time and reading stops at the first piece past the limit, before the
    rest of the cost is paid. ``check`` holds the finished canonical text
    (separators and headings added) to the same number.
    """

    def __init__(self, limit: int, name: str, filename: str) -> None:
        self.limit = limit
        self.used = 0
        self.name = name
        self.filename = filename

    def spend(self, chars: int) -> None:
        """Count ``chars`` more characters; raise once the document is over the limit."""
        self.used += chars
        if self.used > self.limit:
            raise self.over()

    def check(self, text: str) -> str:
        """``text``, if the finished document is within the limit."""
        if len(text) > self.limit:
            raise self.over(len(text))
        return text

    def over(self, chars: int | None = None) -> OverLimit:
        """The error for a document past the limit (``chars``: its length, when known)."""
        has = f"it has {chars:,}" if chars is not None else "reading stopped there"
        return OverLimit(
            f"{self.name} is over the limit of {self.limit:,} characters of text per document "
            f"({has}). Split it into smaller files, or ask an admin to raise KB_MAX_TEXT_CHARS.",
            filename=self.filename,
            kind="text",
            limit=self.limit,
        )


# --- Word


class _Word:
    """What reading one Word document needs: its text budget, its style and list tables.

    python-docx resolves ``Paragraph.style`` by scanning every style of the
    document (twice for a paragraph in the default style), and the list format
    of a numbered paragraph by XPath over the whole numbering part: work that
    grows as paragraphs times styles. Both are read once here instead.
    """

    def __init__(self, doc: DocxDocument, budget: TextBudget) -> None:
        self.doc = doc
        self.budget = budget
        self.style_names, self.default_style = _paragraph_styles(doc)
        self._formats: dict[tuple[str, str], str] | None = None
        self._abstracts: dict[str, str] = {}

    def style(self, p: Paragraph) -> str:
        """The name of ``p``'s paragraph style, as ``Paragraph.style.name`` would say ("" none)."""
        style_id = p._p.style
        if not style_id:
            return self.default_style
        return self.style_names.get(style_id, self.default_style)

    def list_format(self, num_id: str, level: int) -> str:
        """The number format of a list's level (``decimal``, ``bullet``), or "" if none."""
        if self._formats is None:
            self._abstracts, self._formats = _numbering_formats(self.doc)
        abstract = self._abstracts.get(num_id, "")
        if not abstract.isdigit():
            return ""
        return self._formats.get((abstract, str(level)), "")


def _paragraph_styles(doc: DocxDocument) -> tuple[dict[str, str], str]:
    """Each paragraph style's name by style id, and the default paragraph style's name.

    As python-docx resolves them: the first style of an id counts, one of
    another type (or none) means the default, and the default is the last
    paragraph style marked so.
    """
    names: dict[str, str] = {}
    seen: set[str] = set()
    default = ""
    for style in doc.styles.element.iterchildren(_STYLE):
        is_paragraph = style.get(_TYPE) == "paragraph"
        name_element = style.find(_NAME)
        raw = name_element.get(_VAL) if name_element is not None else None
        name = BabelFish.internal2ui(raw) if raw else ""
        if is_paragraph and (style.get(_DEFAULT) or "").lower() in _ON:
            default = name
        style_id = style.get(_STYLE_ID)
        if style_id is not None and style_id not in seen:
            seen.add(style_id)
            if is_paragraph:
                names[style_id] = name
    return names, default


def _numbering_formats(
    doc: DocxDocument,
) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """The numbering part as tables: list (numId) -> abstractNumId, (abstractNumId, level) -> format.

    The first value in document order counts, as in the XPath it replaces.
    """
    try:
        numbering = doc.part.numbering_part.element
    except (KeyError, NotImplementedError):  # no numbering part
        return {}, {}
    abstracts: dict[str, str] = {}
    formats: dict[tuple[str, str], str] = {}
    for num in numbering.iterchildren(_NUM):
        num_id = num.get(_NUM_ID)
        for ref in num.iterchildren(_ABSTRACT_NUM_ID):
            value = ref.get(_VAL)
            if num_id is not None and value is not None:
                abstracts.setdefault(num_id, value)
    for abstract in numbering.iterchildren(_ABSTRACT_NUM):
        abstract_id = abstract.get(_ABSTRACT_NUM_ID)
        for lvl in abstract.iterchildren(_LVL):
            ilvl = lvl.get(_ILVL)
            for fmt in lvl.iterchildren(_NUM_FMT):
                value = fmt.get(_VAL)
                if abstract_id is not None and ilvl is not None and value is not None:
                    formats.setdefault((abstract_id, ilvl), value)
    return abstracts, formats


def docx_document(
    package: Package,
    name: str,
    filename: str,
    fallback_title: str,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> Extracted:
    """The canonical text of a Word package (checked by ``open_package``)."""
    budget = TextBudget(max_text_chars, name, filename)
    try:
        doc = open_docx(io.BytesIO(package.data))
        blocks = list(_docx_blocks(_Word(doc, budget)))
        title = " ".join((doc.core_properties.title or "").split())
    except OverLimit:
        raise
    except Exception as exc:  # python-docx and lxml raise assorted errors on bad parts
        raise read_failed(name, filename, "Word", exc) from exc
    text = budget.check(join_blocks(blocks))
    if not text.strip():
        raise EmptyDocument(f"{name} is a Word file with no text.", filename=filename)
    title = title or _first_heading(blocks) or fallback_title
    return Extracted(text=text, title=title[:200], kind="docx")


def _docx_blocks(word: _Word) -> Iterator[str]:
    numbers: dict[tuple[str, int], int] = {}
    for item in _inner_content(word.doc.element.body, word.doc._body):
        if isinstance(item, DocxTable):
            numbers.clear()
            yield from _table_rows(item, word)
            continue
        block = _paragraph_block(item, numbers, word)
        if block:
            yield block


def _inner_content(
    element: BaseOxmlElement, parent: t.ProvidesStoryPart
) -> Iterator[Paragraph | DocxTable]:
    """Paragraphs and tables in document order, including those inside content controls."""
    for child in element.iterchildren():
        if child.tag == _P:
            yield Paragraph(child, parent)
        elif child.tag == _TBL:
            yield DocxTable(child, parent)
        elif child.tag == _SDT:  # a content control (cover page, template field): its content
            for content in child.iterchildren(_SDT_CONTENT):
                yield from _inner_content(content, parent)


def _paragraph_text(p: Paragraph, budget: TextBudget) -> str:
    """The visible text of a paragraph: runs in hyperlinks, fields, insertions and text boxes too.

    python-docx's ``Paragraph.text`` reads only direct runs and hyperlinks.
    Deleted text (``w:delText``) and field codes (``w:instrText``) are not
    ``w:t``; a text box is written twice (DrawingML, then a VML fallback), so
    the fallback is skipped. Its characters are spent from ``budget``.
    """
    parts = []
    for node in _TEXT_NODES(p._p):
        if node.tag == _T:
            parts.append(node.text or "")
        elif node.tag == _TAB:
            parts.append("\t")
        else:  # a line break, or a text box's paragraph
            parts.append("\n")
    text = "".join(parts)
    budget.spend(len(text))
    return text


def _paragraph_block(p: Paragraph, numbers: dict[tuple[str, int], int], word: _Word) -> str:
    style = word.style(p)
    level = _heading_level(style)
    text = _paragraph_text(p, word.budget)
    if level:
        title = " ".join(text.split())
        return heading(level, title) if title else ""
    body = safe_block(text)
    if not body:
        return ""
    list_level = _list_level(p, style)
    if list_level is None:
        numbers.clear()
        return body
    indent = "  " * list_level
    if "number" in style.lower() or _counts(p, list_level, word):
        key = (_num_id(p) or style, list_level)
        numbers[key] = numbers.get(key, 0) + 1
        return f"{indent}{numbers[key]}. {body}"
    return f"{indent}- {body}"


def _num_id(p: Paragraph) -> str:
    found = p._p.xpath("./w:pPr/w:numPr/w:numId/@w:val")
    return str(found[0]) if found else ""


def _counts(p: Paragraph, level: int, word: _Word) -> bool:
    """Whether a directly numbered paragraph's list counts (1. 2.) rather than bullets."""
    num_id = _num_id(p)
    if not num_id.isdigit():
        return False
    number_format = word.list_format(num_id, level)
    return bool(number_format) and number_format not in {"bullet", "none"}


def _heading_level(style: str) -> int:
    if style.lower() == "title":
        return 1
    m = _HEADING_STYLE.fullmatch(style)
    return min(6, int(m[1])) if m else 0


def _list_level(p: Paragraph, style: str) -> int | None:
    """The nesting level of a list item (0 outermost), or None for a plain paragraph."""
    num_id = p._p.xpath("./w:pPr/w:numPr/w:numId/@w:val")
    if num_id and num_id[0] != "0":  # numId 0 switches numbering off
        ilvl = p._p.xpath("./w:pPr/w:numPr/w:ilvl/@w:val")
        return int(ilvl[0]) if ilvl and str(ilvl[0]).isdigit() else 0
    if style.lower().startswith(("list bullet", "list number")):
        digits = style[-1]
        return int(digits) - 1 if digits.isdigit() else 0
    return None


def _table_rows(table: DocxTable, word: _Word) -> Iterator[str]:
    for tcs in _row_cells(table):
        seen: set[int] = set()
        cells: list[str] = []
        for tc in tcs:
            if id(tc) in seen:  # a merged cell is listed once per grid column
                continue
            seen.add(id(tc))
            cells.append(_cell_text(_Cell(tc, table), word))
        line = CELL_SEPARATOR.join(c for c in cells if c)
        if line:
            yield safe_line(line)


def _row_cells(table: DocxTable) -> Iterator[list[CT_Tc]]:
    """Each row's cells as python-docx's ``_Row.cells`` lists them, in one pass over the table.

    A cell continuing a vertical merge stands for the cell that starts the
    merge, once per grid column that one spans. python-docx finds that cell by
    walking up the rows one XPath at a time (each scanning the rows before),
    for every row of the merge: cubic in the rows of a merged column (400 rows
    took 97 s). Here each row remembers the cell each of its cells shows.
    """
    above: _GridRow | None = None
    for tr in table._tbl.tr_lst:
        row = _GridRow(tr)
        cells: list[CT_Tc] = []
        for offset, tc in zip(row.offsets, row.tcs, strict=True):
            shown = tc
            if tc.vMerge == ST_Merge.CONTINUE:
                if above is None:
                    raise ValueError("no tr above topmost tr in w:tbl")
                shown = above.shown[above.index_at(offset)]
            row.shown.append(shown)
            cells.extend([shown] * shown.grid_span)
        yield cells
        above = row


class _GridRow:
    """One table row: its cells, the grid column each starts at, and the cell each shows."""

    def __init__(self, tr: CT_Row) -> None:
        self.tr = tr
        self.tcs: list[CT_Tc] = list(tr.tc_lst)
        self.offsets: list[int] = []
        offset = tr.grid_before
        for tc in self.tcs:
            self.offsets.append(offset)
            offset += tc.grid_span
        self.shown: list[CT_Tc] = []  # filled in as the row is read
        # The first cell starting at each offset, as ``CT_Row.tc_at_grid_offset`` finds it
        # while offsets only grow; with a negative span (a damaged file) that method decides.
        self._first: dict[int, int] | None = {}
        for i, tc in enumerate(self.tcs):
            if tc.grid_span < 0:
                self._first = None
                break
            self._first.setdefault(self.offsets[i], i)

    def index_at(self, offset: int) -> int:
        """The index of this row's cell at grid ``offset`` (ValueError if none starts there)."""
        if self._first is None:
            found = self.tr.tc_at_grid_offset(offset)
            return next(i for i, tc in enumerate(self.tcs) if tc is found)
        if offset not in self._first:
            raise ValueError(f"no `tc` element at grid_offset={offset}")
        return self._first[offset]


def _cell_text(cell: _Cell, word: _Word) -> str:
    parts: list[str] = []
    for item in _inner_content(cell._tc, cell):
        if isinstance(item, DocxTable):
            parts.append(" ; ".join(_table_rows(item, word)))
        else:
            parts.append(_paragraph_text(item, word.budget))
    return " ".join(" ".join(parts).split())


def _first_heading(blocks: list[str]) -> str:
    for block in blocks:
        if block.startswith("#"):
            return block.lstrip("#").strip()
    return ""


# --- PowerPoint


def pptx_document(
    package: Package,
    name: str,
    filename: str,
    fallback_title: str,
    max_slides: int,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> Extracted:
    """The canonical text of a PowerPoint package: one section per slide.

    A deck listing one slide part more than once is refused before any slide
    is read: PowerPoint saves every slide as a part of its own, and each
    listing would be read (and indexed) again.
    """
    budget = TextBudget(max_text_chars, name, filename)
    try:
        prs = open_pptx(io.BytesIO(package.data))
        slides = list(prs.slides)
        if len(slides) > max_slides:
            raise OverLimit(
                f"{name} is over the limit of {max_slides:,} slides per document (it has "
                f"{len(slides):,}). Split it into smaller files, or ask an admin to raise "
                "KB_MAX_PAGES.",
                filename=filename,
                kind="pages",
                limit=max_slides,
            )
        _refuse_aliased_slides(slides, name, filename)
        sections = [_slide_section(n, slide, budget) for n, slide in enumerate(slides, 1)]
        title = " ".join((prs.core_properties.title or "").split())
    except (OverLimit, CorruptDocument):
        raise
    except Exception as exc:  # python-pptx and lxml raise assorted errors on bad parts
        raise read_failed(name, filename, "PowerPoint", exc) from exc
    text = budget.check(join_blocks(s for s, _ in sections))
    if not any(body for _, body in sections):
        raise EmptyDocument(f"{name} is a PowerPoint file with no text.", filename=filename)
    title = title or _slide_title_of(sections) or fallback_title
    return Extracted(text=text, title=title[:200], kind="pptx")


def _slide_title_of(sections: list[tuple[str, str]]) -> str:
    for section, _ in sections:
        line = section.split("\n", 1)[0]
        _, _, title = line.partition(": ")
        if title:
            return title
    return ""


def _refuse_aliased_slides(slides: list[Slide], name: str, filename: str) -> None:
    seen: dict[str, int] = {}
    for slide in slides:
        part = str(slide.part.partname)
        seen[part] = seen.get(part, 0) + 1
    for times in seen.values():
        if times > 1:
            # python-pptx has renamed the part by then: its name would mislead.
            raise aliased_part(name, filename, "PowerPoint", "slide", "", times)


def _slide_section(number: int, slide: Slide, budget: TextBudget) -> tuple[str, str]:
    """The slide's heading and blocks as one text, and its body alone."""
    title_shape = slide.shapes.title
    title = ""
    if title_shape is not None:
        title = " ".join(_spent(title_shape.text_frame.text, budget).split())
    skip = title_shape.shape_id if title_shape is not None else None
    positions = _Positions(slide)
    blocks = [b for b in _shape_blocks(slide.shapes, skip, budget, positions) if b]
    if (
        slide.has_notes_slide
    ):  # one notes part may serve several slides: read, and counted, each time
        notes_frame = slide.notes_slide.notes_text_frame
        notes = safe_block(_spent(notes_frame.text, budget)) if notes_frame is not None else ""
        if notes:
            blocks.append("Notes: " + notes)
    head = heading(1, f"Slide {number}: {title}" if title else f"Slide {number}")
    body = join_blocks(blocks)
    return (f"{head}\n\n{body}" if body else head), body


def _spent(text: str, budget: TextBudget) -> str:
    budget.spend(len(text))
    return text


def _shape_blocks(
    shapes: Iterable[BaseShape], skip: int | None, budget: TextBudget, positions: _Positions
) -> Iterator[str]:
    for shape in sorted(shapes, key=positions.of):
        if skip is not None and shape.shape_id == skip:
            continue
        if isinstance(shape, GroupShape):
            yield from _shape_blocks(shape.shapes, None, budget, positions)
        elif getattr(shape, "has_table", False):
            for row in shape.table.rows:  # type: ignore[attr-defined]
                line = CELL_SEPARATOR.join(
                    t for t in (" ".join(_spent(c.text, budget).split()) for c in row.cells) if t
                )
                if line:
                    yield safe_line(line)
        elif getattr(shape, "has_text_frame", False):
            yield _text_frame_block(shape, budget)


def _text_frame_block(shape: BaseShape, budget: TextBudget) -> str:
    lines: list[str] = []
    for paragraph in shape.text_frame.paragraphs:  # type: ignore[attr-defined]
        line = safe_line(_spent(paragraph.text, budget))
        if line:
            lines.append("  " * paragraph.level + line if lines else line)
    return "\n".join(lines)


class _Positions:
    """Where each shape of one slide starts, ``(top, left)``, as python-pptx says.

    Placeholders without their own position inherit the layout's (and a layout's
    the master's); shapes with none at all (rare) read first. python-pptx finds
    a placeholder's layout placeholder by an XPath over every layout shape, for
    each of ``top`` and ``left`` of each shape: 250 placeholders on a slide of
    a layout of 250 took a minute. Here the layout is read once per slide and
    each inherited position looked up once.
    """

    def __init__(self, slide: Slide) -> None:
        self.slide = slide
        self._layout: dict[int, BaseShape] | None = None
        self._by_idx: dict[int, tuple[int | None, int | None]] = {}
        self._by_type: dict[object, tuple[int | None, int | None]] = {}

    def of(self, shape: BaseShape) -> tuple[int, int]:
        """The shape's reading position: its top, then its left (0 when it has none)."""
        element = shape._element
        top, left = element.y, element.x
        if isinstance(shape, _InheritsDimensions) and (top is None or left is None):
            inherited_top, inherited_left = self._inherited(element.ph_idx)
            top = inherited_top if top is None else top
            left = inherited_left if left is None else left
        return (top or 0, left or 0)

    def _inherited(self, idx: int) -> tuple[int | None, int | None]:
        if idx not in self._by_idx:
            if self._layout is None:
                self._layout = {}
                layout = self.slide.slide_layout.placeholders
                for placeholder in iter(layout):
                    self._layout.setdefault(placeholder.element.ph_idx, placeholder)
            base = self._layout.get(idx)
            self._by_idx[idx] = (None, None) if base is None else self._layout_position(base)
        return self._by_idx[idx]

    def _layout_position(self, base: BaseShape) -> tuple[int | None, int | None]:
        top, left = base._element.y, base._element.x
        if top is None or left is None:
            # A layout placeholder inherits from the master's of its type: once per type.
            kind = base._element.ph_type
            if kind not in self._by_type:
                inherit = base._inherited_value
                self._by_type[kind] = (inherit("top"), inherit("left"))
            master_top, master_left = self._by_type[kind]
            top = master_top if top is None else top
            left = master_left if left is None else left
        return top, left


__all__ = [
    "CELL_SEPARATOR",
    "TextBudget",
    "docx_document",
    "heading",
    "join_blocks",
    "pptx_document",
    "read_failed",
    "safe_block",
    "safe_line",
]
