"""Small hostile Office and CSV files whose text or work is many times their size.

Each builder makes a real file with the library that reads it (openpyxl,
python-pptx, python-docx) and then changes its XML the way an attacker would;
the sizes are those of the measured attacks (see ``tests/test_hostile_files.py``).

    shared_string_xlsx    one long shared string, referenced by many cells
    aliased_sheets_xlsx   one sheet part listed many times in workbook.xml
    aliased_slides_pptx   many sldIds pointing at one slide of long text
    placeholders_pptx     a slide of placeholders whose positions come from a large layout
    styled_docx           thousands of styles and of paragraphs that use them
    merged_table_docx     a table whose first column is one cell merged down every row
    one_word_paragraphs_docx  thousands of one-letter paragraphs
    quoted_spaces_csv     a quote, tens of thousands of spaces, a quote
"""

from __future__ import annotations

import io
import random
import re
import zipfile
from collections.abc import Callable

import docx
import openpyxl
import pptx
from docx.table import _Cell
from pptx.oxml import parse_xml
from pptx.util import Inches

KB = 1024
_R = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_WORDS = ("policy", "travel", "expense", "receipt", "manager", "booking", "hotel", "flight")


def words(chars: int, *, seed: int = 7) -> str:
    """``chars`` characters of words (not one repeated run, so the file stays honest-looking)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(_WORDS)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


def rewrite(
    data: bytes, changes: dict[str, Callable[[bytes], bytes]], extra: dict[str, bytes] | None = None
) -> bytes:
    """``data`` (a ZIP package) with some parts changed and others added."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            body = src.read(info)
            if info.filename in changes:
                body = changes[info.filename](body)
            dst.writestr(info.filename, body)
        for name, body in (extra or {}).items():
            dst.writestr(name, body)
    return out.getvalue()


def _saved(document: object) -> bytes:
    out = io.BytesIO()
    document.save(out)  # type: ignore[attr-defined]
    return out.getvalue()


# --- Excel


def shared_string_xlsx(cells: int = 1600, chars: int = 64 * KB, *, columns: int = 40) -> bytes:
    """One sheet of ``cells`` cells that all refer to one ``chars``-character shared string.

    Excel writes a repeated string once, in the shared strings part, and every
    cell holding it as a reference to it; openpyxl writes inline strings, so its
    file is changed to Excel's form.
    """
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Notes"
    for i in range(cells):
        ws.cell(row=i // columns + 1, column=i % columns + 1, value="x")
    table = (
        '<sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
        f'count="{cells}" uniqueCount="1"><si><t>{words(chars)}</t></si></sst>'
    )

    def shared(xml: bytes) -> bytes:
        return re.sub(
            rb'<c r="([A-Z]+[0-9]+)" t="inlineStr"><is><t>x</t></is></c>',
            rb'<c r="\1" t="s"><v>0</v></c>',
            xml,
        )

    def content_types(xml: bytes) -> bytes:
        return xml.replace(
            b"</Types>",
            b'<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats'
            b'-officedocument.spreadsheetml.sharedStrings+xml"/></Types>',
        )

    def relationships(xml: bytes) -> bytes:
        return xml.replace(
            b"</Relationships>",
            b'<Relationship Id="rIdSST" Target="sharedStrings.xml" Type="http://schemas.openxmlformats'
            b'.org/officeDocument/2006/relationships/sharedStrings"/></Relationships>',
        )

    return rewrite(
        _saved(wb),
        {
            "xl/worksheets/sheet1.xml": shared,
            "[Content_Types].xml": content_types,
            "xl/_rels/workbook.xml.rels": relationships,
        },
        {"xl/sharedStrings.xml": table.encode()},
    )


def aliased_sheets_xlsx(
    aliases: int = 300, cells: int = 32, chars: int = 64 * KB, *, one_rel: bool = False
) -> bytes:
    """A workbook whose workbook.xml lists its one sheet part ``aliases`` times.

    With ``one_rel`` every entry names the same relationship; otherwise each has
    its own relationship, all targeting ``xl/worksheets/sheet1.xml``.
    """
    data = shared_string_xlsx(cells, chars)
    entries = "".join(
        f'<sheet xmlns:r="{_R}" name="Sheet {i}" sheetId="{i + 1}" r:id="{"rId1" if one_rel else f"rIdA{i}"}"/>'
        for i in range(aliases)
    )
    rels = "".join(
        f'<Relationship Id="rIdA{i}" Target="worksheets/sheet1.xml" Type="http://schemas'
        '.openxmlformats.org/officeDocument/2006/relationships/worksheet"/>'
        for i in range(aliases)
    )

    def sheets(xml: bytes) -> bytes:
        return re.sub(rb"<sheets>.*</sheets>", f"<sheets>{entries}</sheets>".encode(), xml)

    def relationships(xml: bytes) -> bytes:
        return (
            xml
            if one_rel
            else xml.replace(b"</Relationships>", rels.encode() + b"</Relationships>")
        )

    return rewrite(data, {"xl/workbook.xml": sheets, "xl/_rels/workbook.xml.rels": relationships})


def copied_sheets_xlsx(copies: int = 300, cells: int = 32, chars: int = 64 * KB) -> bytes:
    """A workbook of ``copies`` sheets, each its own part, all using one shared string.

    No part is listed twice, so only counting the shared string's text each time
    a cell uses it stops it.
    """
    data = shared_string_xlsx(cells, chars)
    sheet = zipfile.ZipFile(io.BytesIO(data)).read("xl/worksheets/sheet1.xml")
    entries = "".join(
        f'<sheet xmlns:r="{_R}" name="Sheet {i}" sheetId="{i + 1}" r:id="rIdC{i}"/>'
        for i in range(copies)
    )
    rels = "".join(
        f'<Relationship Id="rIdC{i}" Target="worksheets/copy{i}.xml" Type="http://schemas'
        '.openxmlformats.org/officeDocument/2006/relationships/worksheet"/>'
        for i in range(copies)
    )

    def sheets(xml: bytes) -> bytes:
        return re.sub(rb"<sheets>.*</sheets>", f"<sheets>{entries}</sheets>".encode(), xml)

    def relationships(xml: bytes) -> bytes:
        return xml.replace(b"</Relationships>", rels.encode() + b"</Relationships>")

    return rewrite(
        data,
        {"xl/workbook.xml": sheets, "xl/_rels/workbook.xml.rels": relationships},
        {f"xl/worksheets/copy{i}.xml": sheet for i in range(copies)},
    )


# --- PowerPoint


def long_slide_pptx(chars: int = 256 * KB, *, lines: int = 64) -> bytes:
    """One slide with a title and a text box of ``chars`` characters in ``lines`` paragraphs."""
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[5])
    slide.shapes.title.text = "Expense policy"
    box = slide.shapes.add_textbox(Inches(1), Inches(2), Inches(8), Inches(4))
    per_line = max(1, chars // lines)
    frame = box.text_frame
    frame.text = words(per_line, seed=0)
    for n in range(1, lines):
        frame.add_paragraph().text = words(per_line, seed=n)
    return _saved(prs)


def aliased_slides_pptx(
    aliases: int = 400, chars: int = 256 * KB, *, one_rel: bool = False
) -> bytes:
    """A deck whose presentation.xml lists its one slide ``aliases`` times."""
    data = long_slide_pptx(chars)
    ids = "".join(
        f'<p:sldId id="{256 + i}" r:id="{"rIdS0" if one_rel else f"rIdS{i}"}"/>'
        for i in range(aliases)
    )
    rels = "".join(
        f'<Relationship Id="rIdS{i}" Target="slides/slide1.xml" Type="http://schemas'
        '.openxmlformats.org/officeDocument/2006/relationships/slide"/>'
        for i in range(1 if one_rel else aliases)
    )

    def presentation(xml: bytes) -> bytes:
        return re.sub(
            rb"<p:sldIdLst>.*</p:sldIdLst>", f"<p:sldIdLst>{ids}</p:sldIdLst>".encode(), xml
        )

    def relationships(xml: bytes) -> bytes:
        xml = re.sub(rb'<Relationship [^>]*Target="slides/slide1.xml"[^>]*/>', b"", xml)
        return xml.replace(b"</Relationships>", rels.encode() + b"</Relationships>")

    return rewrite(
        data,
        {"ppt/presentation.xml": presentation, "ppt/_rels/presentation.xml.rels": relationships},
    )


def placeholders_pptx(placeholders: int = 250) -> bytes:
    """One slide of ``placeholders`` placeholders without a position, of a layout of as many.

    Each takes its position from the layout placeholder of its index, which
    python-pptx looks for by scanning every layout shape.
    """
    prs = pptx.Presentation()
    layout = prs.slide_layouts[6]
    p = 'xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"'
    a = 'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"'
    for i in range(placeholders):
        # Every third layout placeholder has no position either: the master's is used.
        where = (
            ""
            if i % 3 == 0
            else f'<a:xfrm><a:off x="{i * 7}" y="{i * 5 % 97}"/><a:ext cx="9" cy="9"/></a:xfrm>'
        )
        layout.shapes._spTree.append(
            parse_xml(
                f'<p:sp {p} {a}><p:nvSpPr><p:cNvPr id="{1000 + i}" name="L{i}"/><p:cNvSpPr/>'
                f'<p:nvPr><p:ph type="body" idx="{100 + i}"/></p:nvPr></p:nvSpPr>'
                f"<p:spPr>{where}</p:spPr></p:sp>"
            )
        )
    slide = prs.slides.add_slide(layout)
    for i in range(placeholders):
        slide.shapes._spTree.append(
            parse_xml(
                f'<p:sp {p} {a}><p:nvSpPr><p:cNvPr id="{5000 + i}" name="S{i}"/><p:cNvSpPr/>'
                f'<p:nvPr><p:ph type="body" idx="{100 + placeholders - 1 - i}"/></p:nvPr>'
                f"</p:nvSpPr><p:spPr/><p:txBody><a:bodyPr/><a:p><a:r><a:t>Item {i}</a:t>"
                "</a:r></a:p></p:txBody></p:sp>"
            )
        )
    return _saved(prs)


# --- Word


def styled_docx(styles: int = 4000, paragraphs: int = 4000) -> bytes:
    """A Word file with ``styles`` custom paragraph styles and ``paragraphs`` paragraphs.

    Every other paragraph names one of the custom styles, the rest name none (the
    default style applies): python-docx resolves each by a scan of every style.
    """
    d = docx.Document()
    for i in range(paragraphs):
        d.add_paragraph(f"Paragraph {i} of the handbook.")
    definitions = "".join(
        f'<w:style w:type="paragraph" w:customStyle="1" w:styleId="Custom{i}">'
        f'<w:name w:val="Custom {i}"/><w:basedOn w:val="Normal"/></w:style>'
        for i in range(styles)
    )

    def add_styles(xml: bytes) -> bytes:
        return xml.replace(b"</w:styles>", definitions.encode() + b"</w:styles>")

    counter = iter(range(paragraphs))

    def use_styles(xml: bytes) -> bytes:
        def styled(m: re.Match[bytes]) -> bytes:
            n = next(counter)
            if n % 2:
                return m.group()
            return b'<w:p><w:pPr><w:pStyle w:val="Custom%d"/></w:pPr>' % (n % max(1, styles))

        return re.sub(rb"<w:p>", styled, xml)

    return rewrite(_saved(d), {"word/styles.xml": add_styles, "word/document.xml": use_styles})


def merged_table_docx(rows: int = 400, columns: int = 3) -> bytes:
    """A Word table of ``rows`` rows whose first column is one cell merged down all of them."""
    d = docx.Document()
    table = d.add_table(rows=rows, cols=columns)
    for r, row in enumerate(table.rows):
        tcs = row._tr.tc_lst
        for c, tc in enumerate(tcs[1:], 1):
            _Cell(tc, table).text = f"r{r}c{c}"
        tcs[0].vMerge = "restart" if r == 0 else "continue"
    _Cell(table.rows[0]._tr.tc_lst[0], table).text = "Merged down every row"
    return _saved(d)


def one_word_paragraphs_docx(paragraphs: int = 4000) -> bytes:
    """A Word file of ``paragraphs`` paragraphs of one letter each (71 KB for 4,000)."""
    d = docx.Document()
    for _ in range(paragraphs):
        d.add_paragraph("w")
    return _saved(d)


def plain_docx(paragraphs: int = 20_000) -> bytes:
    """A Word file of ``paragraphs`` short paragraphs in the default style."""
    d = docx.Document()
    for i in range(paragraphs):
        d.add_paragraph(f"Paragraph {i} of the handbook.")
    return _saved(d)


# --- CSV


def quoted_spaces_csv(spaces: int = 60_000) -> bytes:
    """A quote, ``spaces`` spaces and a quote: csv.Sniffer's regexes backtrack over it."""
    return b'"' + b" " * spaces + b'"'


__all__ = [
    "aliased_sheets_xlsx",
    "aliased_slides_pptx",
    "copied_sheets_xlsx",
    "long_slide_pptx",
    "merged_table_docx",
    "one_word_paragraphs_docx",
    "placeholders_pptx",
    "plain_docx",
    "quoted_spaces_csv",
    "rewrite",
    "shared_string_xlsx",
    "styled_docx",
    "words",
]
