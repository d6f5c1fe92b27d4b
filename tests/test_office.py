"""Word, PowerPoint, Excel and CSV documents: structure, exact offsets, nothing lost, hostile files.

Every file is generated here by the library that reads it (python-docx,
python-pptx, openpyxl, the csv module); the hostile ones are real files changed
the way an attacker would change them.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import re
import struct
import zipfile
from pathlib import Path

import docx
import openpyxl
import pptx
import pytest
from click.testing import CliRunner
from docx.oxml import parse_xml
from pptx.util import Inches

from bot.cli import main
from bot.mcp import Person
from bot.mcp.tools import MAX_LIMIT, Tools, search_text
from core.answer import SourceRef, build_engine
from core.quoting import quoted
from index.config import IndexConfig
from index.embed import Embedder
from index.errors import CorruptDocument, EmptyDocument, OverLimit, UnsupportedType
from index.ingest.chunk import HEADER_SEPARATOR, chunk_document
from index.ingest.extract import SUPPORTED_SUFFIXES, extract
from index.ingest.office_zip import DEFAULT_MAX_UNZIPPED_BYTES, MAX_RATIO, RATIO_FLOOR
from index.ingest.sheets import MAX_CELLS
from index.knowledge_base import KnowledgeBase
from index.models import Chunk, DocState, Extracted
from tests import hostile
from tests.docs_factory import LOGIN_PAGE

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import Bot, make_settings  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DEFAULT_OPENAI_API_KEY,
    USER_ID,
    OpenAICompatServer,
    file_input_state,
    slash_command_body,
    view_submission_body,
)

# --- builders


def _saved(
    document: docx.document.Document | pptx.presentation.Presentation | openpyxl.Workbook,
) -> bytes:
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def policy_docx(*, title: str = "Travel policy") -> bytes:
    """A Word file with every structure the extractor reads, and a header and footer it must not."""
    d = docx.Document()
    d.core_properties.title = title
    section = d.sections[0]
    section.header.paragraphs[0].text = "CONFIDENTIAL RUNNING HEADER"
    section.footer.paragraphs[0].text = "Page footer text"
    d.add_paragraph("This policy applies to every employee who travels for work.")
    d.add_heading("Booking", 1)
    d.add_paragraph("Book flights through the travel desk at least two weeks ahead.")
    d.add_heading("Economy or business", 2)
    d.add_paragraph("Flights over eight hours may be booked in premium economy.")
    d.add_paragraph("Ask your manager first", style="List Bullet")
    d.add_paragraph("Keep the confirmation e-mail", style="List Bullet")
    d.add_paragraph("Open the booking tool", style="List Number")
    d.add_paragraph("Choose the cheapest refundable fare", style="List Number")
    d.add_paragraph("# this line only looks like a heading")
    d.add_heading("Allowances", 1)
    table = d.add_table(rows=3, cols=3)
    for r, row in enumerate(
        [
            ["City", "Daily allowance", ""],
            ["Oslo", "95 EUR", "lunch included"],
            ["Lima", "60 EUR", ""],
        ]
    ):
        for c, value in enumerate(row):
            if value:
                table.cell(r, c).text = value
    table.cell(0, 1).merge(table.cell(0, 2))  # one cell spanning two columns, read once
    inner = table.cell(2, 2).add_table(rows=1, cols=2)
    inner.cell(0, 0).text = "nested note"
    inner.cell(0, 1).text = "taxi receipts to Jonas Berg"
    d.add_paragraph("Receipts are submitted within 30 days of return.")
    return _saved(d)


def onboarding_pptx() -> bytes:
    """Three slides: title and body, a group, a table and notes, shapes added out of reading order."""
    prs = pptx.Presentation()
    first = prs.slides.add_slide(prs.slide_layouts[1])
    first.shapes.title.text = "Welcome aboard"
    first.placeholders[1].text = "Your first week at Northwind"
    second = prs.slides.add_slide(prs.slide_layouts[5])
    second.shapes.title.text = "Who to ask"
    # Added bottom first: reading order comes from position, not insertion.
    low = second.shapes.add_textbox(Inches(1), Inches(5), Inches(6), Inches(1))
    low.text_frame.text = "Bottom box: the wifi password is on the fridge"
    group = second.shapes.add_group_shape()
    right = group.shapes.add_textbox(Inches(5), Inches(2), Inches(3), Inches(1))
    right.text_frame.text = "Grouped right"
    left = group.shapes.add_textbox(Inches(1), Inches(2), Inches(3), Inches(1))
    left.text_frame.text = "Grouped left"
    table = second.shapes.add_table(2, 2, Inches(1), Inches(3.5), Inches(6), Inches(1)).table
    for (r, c), value in {
        (0, 0): "Topic",
        (0, 1): "Contact",
        (1, 0): "Laptops",
        (1, 1): "IT desk, room 4",
    }.items():
        table.cell(r, c).text = value
    second.notes_slide.notes_text_frame.text = "Mention the badge photo session on Tuesday."
    third = prs.slides.add_slide(prs.slide_layouts[6])  # blank layout: no title
    box = third.shapes.add_textbox(Inches(1), Inches(1), Inches(6), Inches(1))
    box.text_frame.text = "The parking garage closes at 22:00 sharp."
    return _saved(prs)


def rota_xlsx(rows: int = 60) -> bytes:
    """An on-call rota, a hidden sheet, an empty row, a formula with its cached value."""
    wb = openpyxl.Workbook()
    rota = wb.active
    rota.title = "On-call"
    rota.append(["Week", "Engineer", "Backup", "Hours"])
    for week in range(1, rows + 1):
        rota.append([week, f"Engineer {week:02d}", f"Backup {week:02d}", 40.0])
        if week == 3:
            rota.append([None, None, None, None])  # an empty row, skipped
    totals = wb.create_sheet("Totals")
    totals.append(["Item", "Amount"])
    totals.append(["Overtime budget", "=SUM(B3:B4)"])
    secret = wb.create_sheet("Salaries")
    secret.append(["Name", "Salary"])
    secret.append(["Engineer 01", 123456])
    secret.sheet_state = "hidden"
    return _with_cached_value(_saved(wb), "Overtime budget", "4321.5")


def _with_cached_value(data: bytes, _label: str, value: str) -> bytes:
    """Give the workbook's formula the value Excel would have cached (openpyxl writes none)."""
    return _rewrite(
        data,
        "xl/worksheets/sheet2.xml",
        lambda xml: xml.replace(b"<v></v>", f"<v>{value}</v>".encode()),
    )


def _rewrite(
    data: bytes, part: str, change: object, *, extra: dict[str, bytes] | None = None
) -> bytes:
    return hostile.rewrite(data, {part: change}, extra)  # type: ignore[dict-item]


# --- what every format must keep


def _check_chunks(doc: Extracted, chunks: list[Chunk]) -> None:
    """Exact offsets, and every non-blank character outside headings in some chunk."""
    assert chunks
    covered = [False] * len(doc.text)
    for chunk in chunks:
        assert doc.text[chunk.start : chunk.end] == chunk.content
        assert chunk.text.endswith("\n" + chunk.content)
        for i in range(chunk.start, chunk.end):
            covered[i] = True
    for m in re.finditer(r"[^\n]+", doc.text):
        if (
            m.group().startswith("# ")
            or m.group().startswith("## ")
            or m.group().startswith("### ")
        ):
            continue
        for i in range(m.start(), m.end()):
            assert covered[i] or doc.text[i].isspace(), (i, m.group())


def _in_some_chunk(chunks: list[Chunk], text: str) -> bool:
    return any(text in c.content or text in c.section for c in chunks)


# --- Word


def test_docx_structure_becomes_sections_lists_and_table_rows() -> None:
    doc = extract(policy_docx(), "travel.docx")
    assert doc.kind == "docx" and doc.title == "Travel policy"
    assert "# Booking\n" in doc.text and "## Economy or business\n" in doc.text
    assert "- Ask your manager first" in doc.text
    assert "1. Open the booking tool\n\n2. Choose the cheapest refundable fare" in doc.text
    # a line that looks like Markdown is escaped, not a heading
    assert "\\# this line only looks like a heading" in doc.text
    assert (
        "City | Daily allowance" in doc.text and "Daily allowance | Daily allowance" not in doc.text
    )
    assert "Oslo | 95 EUR | lunch included" in doc.text
    assert doc.text.count("taxi receipts to Jonas Berg") == 1  # a nested table's cell, once
    assert "CONFIDENTIAL RUNNING HEADER" not in doc.text and "Page footer" not in doc.text
    # body order: the table comes before the paragraph after it
    assert doc.text.index("Lima") < doc.text.index("Receipts are submitted")

    chunks = chunk_document(doc, budget=120).chunks
    _check_chunks(doc, chunks)
    by_text = {c.content: c.section for c in chunks}
    assert any(s == "Booking > Economy or business" for s in by_text.values())
    assert next(c for c in chunks if "Oslo" in c.content).section == "Allowances"
    assert chunks[0].section == "" and "applies to every employee" in chunks[0].content
    for paragraph in docx.Document(io.BytesIO(policy_docx())).paragraphs:
        text = paragraph.text.strip()
        if text:
            assert _in_some_chunk(chunks, text.lstrip("# ")), text


def _word_markup_docx() -> bytes:
    """Text where Word puts it besides plain runs: a content control, a text box, revisions."""
    w = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    mc = 'xmlns:mc="http://schemas.openxmlformats.org/markup-compatibility/2006"'
    d = docx.Document()
    d.add_paragraph("Plain opening paragraph.")
    body = d.element.body
    sect = body[-1]  # the section properties stay last
    numbered = d.add_paragraph("Counted step")
    numbered._p.get_or_add_pPr().append(
        parse_xml(f"<w:numPr {w}><w:ilvl w:val='0'/><w:numId w:val='9'/></w:numPr>")
    )
    bullet = d.add_paragraph("Bulleted point")
    bullet._p.get_or_add_pPr().append(
        parse_xml(f"<w:numPr {w}><w:ilvl w:val='0'/><w:numId w:val='1'/></w:numPr>")
    )
    for xml in (
        f"<w:sdt {w}><w:sdtPr/><w:sdtContent><w:p><w:r><w:t>Inside a content control.</w:t>"
        "</w:r></w:p></w:sdtContent></w:sdt>",
        f"<w:p {w}><w:r><w:t>Kept words </w:t></w:r><w:ins w:id='1' w:author='a'><w:r>"
        "<w:t>inserted words</w:t></w:r></w:ins><w:del w:id='2' w:author='a'><w:r>"
        "<w:delText>deleted words</w:delText></w:r></w:del></w:p>",
        f"<w:p {w} {mc}><w:r><w:t>Anchor.</w:t></w:r><w:r><mc:AlternateContent><mc:Choice "
        "Requires='wps'><w:drawing><w:txbxContent><w:p><w:r><w:t>Text box line</w:t></w:r>"
        "</w:p></w:txbxContent></w:drawing></mc:Choice><mc:Fallback><w:pict><w:txbxContent>"
        "<w:p><w:r><w:t>Text box line</w:t></w:r></w:p></w:txbxContent></w:pict></mc:Fallback>"
        "</mc:AlternateContent></w:r></w:p>",
    ):
        sect.addprevious(parse_xml(xml))
    return _saved(d)


def test_docx_numbering_content_controls_text_boxes_and_revisions() -> None:
    doc = extract(_word_markup_docx(), "markup.docx")
    # the template's numbering: numId 9 counts (decimal), numId 1 is bullets
    assert "1. Counted step\n\n- Bulleted point" in doc.text
    assert "Inside a content control." in doc.text
    assert "Kept words inserted words" in doc.text and "deleted words" not in doc.text
    assert doc.text.count("Text box line") == 1 and "Anchor.\nText box line" in doc.text
    _check_chunks(doc, chunk_document(doc).chunks)


def test_docx_title_falls_back_to_the_first_heading_then_the_file_name() -> None:
    assert extract(policy_docx(title=""), "travel.docx").title == "Booking"
    d = docx.Document()
    d.core_properties.title = ""
    d.add_paragraph("Only a paragraph.")
    assert extract(_saved(d), "notes from March.docx").title == "notes from March"


def test_an_empty_docx_fails_with_its_reason() -> None:
    d = docx.Document()
    d.sections[0].header.paragraphs[0].text = "only a header"
    with pytest.raises(EmptyDocument, match="Word file with no text"):
        extract(_saved(d), "blank.docx")


# --- PowerPoint


def test_pptx_has_one_section_per_slide_in_reading_order_with_notes() -> None:
    doc = extract(onboarding_pptx(), "onboarding.pptx")
    assert doc.kind == "pptx" and doc.title == "Welcome aboard"
    assert re.findall(r"^# .*$", doc.text, re.M) == [
        "# Slide 1: Welcome aboard",
        "# Slide 2: Who to ask",
        "# Slide 3",
    ]
    slide2 = doc.text[doc.text.index("# Slide 2") : doc.text.index("# Slide 3")]
    order = [
        "Grouped left",
        "Grouped right",
        "Topic | Contact",
        "Laptops | IT desk, room 4",
        "Bottom box",
    ]
    assert [slide2.index(s) for s in order] == sorted(slide2.index(s) for s in order)
    assert "Notes: Mention the badge photo session on Tuesday." in slide2
    assert slide2.rstrip().endswith("on Tuesday.")  # notes after the slide's own text

    chunks = chunk_document(doc, budget=80).chunks
    _check_chunks(doc, chunks)
    assert next(c for c in chunks if "wifi password" in c.content).section == "Slide 2: Who to ask"
    assert next(c for c in chunks if "parking garage" in c.content).section == "Slide 3"
    for text in ("Your first week at Northwind", "Grouped right", "IT desk, room 4", "badge photo"):
        assert _in_some_chunk(chunks, text)


def test_a_deck_over_the_page_limit_is_refused_before_reading_slides() -> None:
    prs = pptx.Presentation()
    for _ in range(4):
        prs.slides.add_slide(prs.slide_layouts[6])
    with pytest.raises(OverLimit, match="limit of 3 slides.*KB_MAX_PAGES"):
        extract(_saved(prs), "deck.pptx", max_pages=3)


# --- Excel and CSV


def test_xlsx_sheets_become_sections_rows_lines_and_hidden_sheets_are_named() -> None:
    doc = extract(rota_xlsx(), "rota.xlsx")
    assert doc.kind == "xlsx" and doc.title == "rota"
    assert doc.text.startswith("Hidden sheets, not indexed: Salaries.\n\n# Sheet: On-call\n\n")
    assert "Week | Engineer | Backup | Hours\n\n1 | Engineer 01 | Backup 01 | 40\n\n" in doc.text
    assert "3 | Engineer 03 | Backup 03 | 40\n\n4 | Engineer 04" in doc.text  # empty row skipped
    assert "# Sheet: Totals\n\nItem | Amount\n\nOvertime budget | 4321.5" in doc.text
    assert "SUM(" not in doc.text and "123456" not in doc.text


def test_a_chunk_starting_mid_sheet_repeats_the_header_row_in_its_embedded_text() -> None:
    doc = extract(rota_xlsx(), "rota.xlsx")
    chunks = chunk_document(doc, budget=200).chunks
    _check_chunks(doc, chunks)
    rota = [c for c in chunks if c.section == "Sheet: On-call"]
    assert len(rota) > 3
    header = "Week | Engineer | Backup | Hours"
    assert rota[0].content.startswith(header) and rota[0].text.count(header) == 1
    for chunk in rota[1:]:
        assert header not in chunk.content
        assert chunk.text.startswith(
            HEADER_SEPARATOR.join(["rota", "Sheet: On-call", header]) + "\n"
        )
    for week in range(1, 61):
        assert _in_some_chunk(chunks, f"{week} | Engineer {week:02d} | Backup {week:02d} | 40")


def test_csv_delimiter_is_sniffed_and_quoted_cells_stay_whole() -> None:
    data = (
        'Name;Room;Note\r\nAnna;B12;"likes; semicolons"\r\n;;\r\nBo;C3;"two\nlines"\r\nCé;D4;x\r\n'
    ).encode("cp1252")
    doc = extract(data, "rooms.csv")
    assert doc.kind == "csv" and doc.title == "rooms"
    assert doc.text == (
        "Name | Room | Note\n\nAnna | B12 | likes; semicolons\n\nBo | C3 | two lines\n\nCé | D4 | x"
    )
    _check_chunks(doc, chunk_document(doc).chunks)


def test_a_sheet_over_the_cell_limit_is_refused_with_its_reason() -> None:
    wb = openpyxl.Workbook()
    ws = wb.active
    columns = 16_384  # the widest sheet Excel allows: every row reads that wide
    for row in range(1, MAX_CELLS // columns + 3):
        ws.cell(row=row, column=1, value=row)
        ws.cell(row=row, column=columns, value="far right")
    with pytest.raises(OverLimit, match=f"limit of {MAX_CELLS:,} cells"):
        extract(_saved(wb), "wide.xlsx")


def test_a_sheet_claiming_a_huge_dimension_is_read_by_its_cells() -> None:
    data = _rewrite(
        rota_xlsx(rows=70),  # x 16,384 columns: over MAX_CELLS if rows were padded to it
        "xl/worksheets/sheet1.xml",
        lambda xml: re.sub(rb'<dimension ref="[^"]*"', b'<dimension ref="A1:XFD1048576"', xml),
    )
    assert b"XFD1048576" in zipfile.ZipFile(io.BytesIO(data)).read("xl/worksheets/sheet1.xml")
    doc = extract(data, "rota.xlsx")
    assert "70 | Engineer 70 | Backup 70 | 40" in doc.text and " |  | " not in doc.text


def test_a_workbook_whose_only_sheet_is_hidden_is_empty() -> None:
    wb = openpyxl.Workbook()
    wb.active.append(["secret"])
    wb.create_sheet("Visible but empty")
    wb.active.sheet_state = "hidden"
    with pytest.raises(EmptyDocument, match="no text: all its sheets are hidden"):
        extract(_saved(wb), "hidden.xlsx")


def test_an_unreadable_csv_fails_with_its_reason() -> None:
    huge_field = b'a,b\n"' + b"x" * 200_000 + b'",1\n'
    with pytest.raises(CorruptDocument, match="not a readable CSV file"):
        extract(huge_field, "big.csv")


# --- hostile files


def _ole(streams: dict[str, bytes]) -> bytes:
    """A compound file (MS-CFB v3, 512-byte sectors) holding ``streams`` of 4,096+ bytes each."""
    end, free, fat_sector, nostream = 0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFD, 0xFFFFFFFF
    fat = [fat_sector, end]
    data = b""
    entries = [("Root Entry", 5, end, 0)]
    for name, body in streams.items():
        body = body.ljust(max(4096, -(-len(body) // 512) * 512), b"\0")
        start = len(fat)
        sectors = len(body) // 512
        fat += [start + i + 1 for i in range(sectors - 1)] + [end]
        entries.append((name, 2, start, len(body)))
        data += body
    directory = b""
    for i, (name, kind, start, size) in enumerate(entries):
        encoded = name.encode("utf-16-le") + b"\0\0"
        child = 1 if i == 0 else nostream
        right = i + 1 if 0 < i < len(entries) - 1 else nostream
        directory += (
            encoded.ljust(64, b"\0")
            + struct.pack("<HBBIII", len(encoded), kind, 1, nostream, right, child)
            + b"\0" * 36
            + struct.pack("<IQ", start, size)
        )
    directory = directory.ljust(512, b"\0")
    header = (
        bytes.fromhex("d0cf11e0a1b11ae1")
        + b"\0" * 16
        + struct.pack("<HHHHH", 0x3E, 3, 0xFFFE, 9, 6)
        + b"\0" * 6
        + struct.pack("<IIIIIIIII", 0, 1, 1, 0, 4096, end, 0, end, 0)
        + struct.pack("<I", 0)
        + struct.pack("<I", free) * 108
    )
    fat_bytes = b"".join(struct.pack("<I", x) for x in fat).ljust(512, b"\xff")
    return header + fat_bytes + directory + data


def _bomb_docx() -> bytes:
    padding = b"<!--" + b" " * (8 * 1024 * 1024) + b"-->"
    return _rewrite(
        policy_docx(),
        "word/document.xml",
        lambda xml: xml.replace(b"<w:body>", padding + b"<w:body>", 1),
    )


def _bomb(data: bytes, part: str) -> bytes:
    """``data`` with 8 MB of blanks (a few KB compressed) in a comment before ``part``'s root."""
    padding = b"<!--" + b" " * (8 * 1024 * 1024) + b"-->"

    def pad(xml: bytes) -> bytes:
        at = xml.index(b"?>") + 2 if xml.startswith(b"<?xml") else 0
        return xml[:at] + padding + xml[at:]

    return _rewrite(data, part, pad)


def _damaged(data: bytes, part: str) -> bytes:
    """``data`` in a valid ZIP whose ``part`` is XML cut off in the middle."""
    return _rewrite(data, part, lambda xml: xml[: len(xml) // 2])


def _encrypted(fill: bytes) -> bytes:
    """A password-protected Office file as Office writes one (each ``fill`` its own bytes)."""
    return _ole({"EncryptionInfo": b"\x04\x00\x04\x00", "EncryptedPackage": fill * 5000})


def _lying_docx() -> bytes:
    """A DOCX whose central directory declares its document part far smaller than it inflates."""
    data = bytearray(_bomb_docx())
    name = b"word/document.xml"
    at = data.find(b"PK\x01\x02" + b"", 0)
    while at >= 0:
        name_len = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46 : at + 46 + name_len] == name:
            struct.pack_into("<I", data, at + 24, 1000)  # uncompressed size
        at = data.find(b"PK\x01\x02", at + 4)
    return bytes(data)


def _entity_bomb_docx() -> bytes:
    """A DOCX whose XML defines nested entities that expand a billion times ("billion laughs")."""
    entities = b"".join(
        b'<!ENTITY e%d "%s">' % (i, (b"&e%d;" % (i - 1) if i else b"laugh") * 10) for i in range(10)
    )
    prologue = b'<?xml version="1.0" encoding="UTF-8"?><!DOCTYPE w:document [' + entities + b"]>"

    def inject(xml: bytes) -> bytes:
        body = xml.split(b"?>", 1)[1].lstrip()
        return prologue + body.replace(b"<w:t>", b"<w:t>&e9;", 1)

    return _rewrite(policy_docx(), "word/document.xml", inject)


def _macro_docm() -> bytes:
    main = b"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"
    macro = b"application/vnd.ms-word.document.macroEnabled.main+xml"
    return _rewrite(
        policy_docx(),
        "[Content_Types].xml",
        lambda xml: xml.replace(main, macro),
        extra={"word/vbaProject.bin": _ole({"VBA": b'Sub AutoOpen() Shell "calc" End Sub'})},
    )


HOSTILE: dict[str, tuple[str, bytes, type[Exception], str]] = {
    "truncated": ("travel.docx", policy_docx()[:3000], CorruptDocument, "damaged ZIP archive"),
    "encrypted": (
        "payroll.xlsx",
        _encrypted(b"\x99"),
        CorruptDocument,
        "password-protected .*Remove the password",
    ),
    "encrypted_docx": (
        "salaries.docx",
        _encrypted(b"\x98"),
        CorruptDocument,
        "password-protected .*Remove the password",
    ),
    "encrypted_pptx": (
        "board.pptx",
        _encrypted(b"\x97"),
        CorruptDocument,
        "password-protected .*Remove the password",
    ),
    "damaged_pptx": (
        "onboarding.pptx",
        _damaged(onboarding_pptx(), "ppt/slides/slide2.xml"),
        CorruptDocument,
        "damaged PowerPoint file that could not be read",
    ),
    "damaged_xlsx": (
        "rota.xlsx",
        _damaged(rota_xlsx(), "xl/worksheets/sheet1.xml"),
        CorruptDocument,
        "damaged Excel file that could not be read",
    ),
    "bomb_pptx": (
        "bomb.pptx",
        _bomb(onboarding_pptx(), "ppt/slides/slide1.xml"),
        CorruptDocument,
        "zip bomb: its part 'ppt/slides/slide1.xml' expands [0-9,]+ times",
    ),
    "bomb_xlsx": (
        "bomb.xlsx",
        _bomb(rota_xlsx(), "xl/worksheets/sheet1.xml"),
        CorruptDocument,
        "zip bomb: its part 'xl/worksheets/sheet1.xml' expands [0-9,]+ times",
    ),
    "legacy_renamed": (
        "old.docx",
        _ole({"WordDocument": b"\xec\xa5\xc1\x00" * 1500}),
        UnsupportedType,
        r"old\.docx is a legacy Word 97-2003 document \(\.doc\) renamed to \.docx \(renaming "
        r"does not convert it\).*save it as \.docx",
    ),
    "legacy_ppt": (
        "old.ppt",
        _ole({"PowerPoint Document": b"\x0f\x00" * 3000}),
        UnsupportedType,
        "save it as .pptx",
    ),
    "legacy_doc": (
        "old.doc",
        _ole({"WordDocument": b"\xec\xa5" * 3000}),
        UnsupportedType,
        "save it as .docx",
    ),
    "legacy_xls": (
        "old.xls",
        _ole({"Workbook": b"\x09\x08" * 3000}),
        UnsupportedType,
        "save it as .xlsx",
    ),
    "bomb_ratio": (
        "bomb.docx",
        _bomb_docx(),
        CorruptDocument,
        "zip bomb: .*expands [0-9,]+ times",
    ),
    "bomb_lying": (
        "liar.docx",
        _lying_docx(),
        CorruptDocument,
        "damaged: its part 'word/document.xml'",
    ),
    "entity_bomb": (
        "laughs.docx",
        _entity_bomb_docx(),
        CorruptDocument,
        "damaged Word file .*amplification",
    ),
    "login_page": ("report.docx", LOGIN_PAGE, CorruptDocument, "HTML page, not an Office file"),
    "not_office_zip": ("archive.docx", b"", UnsupportedType, "ZIP archive but not a Word"),
}


def _plain_zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("readme.txt", "hello")
    return out.getvalue()


HOSTILE["not_office_zip"] = (
    "archive.docx",
    _plain_zip(),
    UnsupportedType,
    "ZIP archive but not a Word",
)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_office_files_fail_with_a_clear_reason(case: str) -> None:
    filename, data, error, reason = HOSTILE[case]
    with pytest.raises(error, match=reason):
        extract(data, filename)


def test_the_bomb_is_over_the_ratio_that_real_documents_stay_under() -> None:
    sizes = {i.filename: i for i in zipfile.ZipFile(io.BytesIO(_bomb_docx())).infolist()}
    bomb = sizes["word/document.xml"]
    assert bomb.file_size > MAX_RATIO * bomb.compress_size
    for data in (policy_docx(), onboarding_pptx(), rota_xlsx(rows=2000)):
        for info in zipfile.ZipFile(io.BytesIO(data)).infolist():
            assert info.file_size <= MAX_RATIO * max(1, info.compress_size), info.filename


def test_a_macro_enabled_document_is_read_and_its_macros_never_are() -> None:
    doc = extract(_macro_docm(), "travel.docm")
    assert doc.kind == "docx" and "Flights over eight hours" in doc.text
    assert "AutoOpen" not in doc.text


def test_hostile_files_fail_and_good_ones_beside_them_are_indexed(
    index_dir: Path, embedder: Embedder
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    good = [
        kb.ingest_bytes(build(), filename).document
        for filename, build in (
            ("travel.docx", policy_docx),
            ("welcome.pptx", onboarding_pptx),
            ("oncall.xlsx", rota_xlsx),
        )
    ]
    for filename, data, _, reason in HOSTILE.values():
        failed = kb.ingest_bytes(data, filename).document
        assert failed.name == filename and failed.state == DocState.FAILED
        assert re.search(reason, failed.failure_reason or ""), (filename, failed.failure_reason)
    for doc in good:
        assert kb.store.document(doc.id).state == DocState.INDEXED, doc.name
        assert doc.chunk_count and len(kb.store.chunk_rows(doc.id)) == doc.chunk_count


def test_legacy_files_in_a_folder_fail_with_the_advice_and_the_rest_is_indexed(
    index_dir: Path, tmp_path: Path, embedder: Embedder
) -> None:
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "travel.docx").write_bytes(policy_docx())
    (folder / "old.doc").write_bytes(_ole({"WordDocument": b"\xec\xa5" * 3000}))
    (folder / "old.xls").write_bytes(_ole({"Workbook": b"\x09\x08" * 3000}))
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 100)
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    result = kb.ingest_paths([folder])
    assert [d.name for d in result.indexed] == ["travel.docx"]
    reasons = {d.name: d.failure_reason or "" for d in result.failed}
    assert set(reasons) == {"old.doc", "old.xls"}
    assert "save it as .docx" in reasons["old.doc"] and "save it as .xlsx" in reasons["old.xls"]
    assert [s.split(": ")[0] for s in result.skipped] == [str(folder / "logo.png")]

    result = CliRunner().invoke(main, ["--data-dir", str(index_dir), "sync", str(folder), "--json"])
    report = json.loads(result.stdout)["sources"][0]
    assert report["added"] == ["travel.docx"]
    failed = {f["item"]: f["reason"] for f in report["failed"]}
    assert set(failed) == {"old.doc", "old.xls"} and "save it as .docx" in failed["old.doc"]
    assert report["skipped"] == ["logo.png: not a supported type"]


def _variant(data: bytes, main_type: str) -> bytes:
    """``data`` as Office saves a template or slide show: only its main part's content type differs."""
    plain = re.compile(rb"application/vnd\.openxmlformats-officedocument\.\w+\.\w+\.main\+xml")
    return _rewrite(data, "[Content_Types].xml", lambda xml: plain.sub(main_type.encode(), xml, 1))


_MS, _OOXML = "application/vnd.ms-", "application/vnd.openxmlformats-officedocument."
VARIANTS = {
    ".dotx": (policy_docx, _OOXML + "wordprocessingml.template.main+xml", "docx"),
    ".dotm": (policy_docx, _MS + "word.template.macroEnabledTemplate.main+xml", "docx"),
    ".potx": (onboarding_pptx, _OOXML + "presentationml.template.main+xml", "pptx"),
    ".potm": (onboarding_pptx, _MS + "powerpoint.template.macroEnabled.main+xml", "pptx"),
    ".ppsx": (onboarding_pptx, _OOXML + "presentationml.slideshow.main+xml", "pptx"),
    ".ppsm": (onboarding_pptx, _MS + "powerpoint.slideshow.macroEnabled.main+xml", "pptx"),
    ".xltx": (rota_xlsx, _OOXML + "spreadsheetml.template.main+xml", "xlsx"),
    ".xltm": (rota_xlsx, _MS + "excel.template.macroEnabled.main+xml", "xlsx"),
}


@pytest.mark.parametrize("suffix", sorted(VARIANTS))
def test_templates_and_slide_shows_are_read_as_their_format(suffix: str) -> None:
    build, main_type, kind = VARIANTS[suffix]
    variant = _variant(build(), main_type)
    assert main_type.encode() in zipfile.ZipFile(io.BytesIO(variant)).read("[Content_Types].xml")
    doc = extract(variant, f"file{suffix}")
    assert suffix in SUPPORTED_SUFFIXES
    assert (doc.kind, doc.text) == (kind, extract(build(), f"file.{kind}").text)


def test_an_xhtml_page_is_read_as_html() -> None:
    page = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE html>\n'
        '<html xmlns="http://www.w3.org/1999/xhtml"><head><title>Desks</title></head>'
        "<body><h1>Desks</h1><p>Hot desks are booked a day ahead.</p></body></html>"
    )
    doc = extract(page.encode(), "desks.xhtml")
    assert ".xhtml" in SUPPORTED_SUFFIXES
    assert (doc.kind, doc.title, doc.text) == (
        "html",
        "Desks",
        "# Desks\n\nHot desks are booked a day ahead.",
    )


# --- answering, end to end


NEEDLES = {
    "travel.docx": (policy_docx, "Who gets the taxi receipts?", "taxi receipts to Jonas Berg"),
    "onboarding.pptx": (
        onboarding_pptx,
        "Where is the wifi password?",
        "the wifi password is on the fridge",
    ),
    "rota.xlsx": (
        functools.partial(rota_xlsx, rows=44),
        "Who is the on-call engineer in week 42?",
        "42 | Engineer 42 | Backup 42",
    ),
    "rooms.csv": (
        lambda: _rooms_csv(),
        "What is Marek Novak's phone number?",
        "Marek Novak | Server room | 7781",
    ),
}
# The column names of the sheets above, which a passage below the header row lacks.
COLUMNS = {"rota.xlsx": "Week | Engineer | Backup | Hours", "rooms.csv": "Person | Room | Phone"}
# An MCP caller who reads what is for everyone (the office documents are).
EVERYONE = Person("U0OFFICE01", None, "plain", None)


def _rooms_csv() -> bytes:
    """A phone list long enough that the needle's row is far below the header row."""
    rows = [f"Person {i:02d},Room {i:02d},55{i:02d}" for i in range(1, 41)]
    rows.insert(35, "Marek Novak,Server room,7781")
    return ("Person,Room,Phone\n" + "\n".join(rows) + "\n").encode()


@pytest.fixture(scope="module")
def office_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("office-kb")


@pytest.fixture(scope="module")
def office_kb(office_dir: Path, embedder: Embedder) -> KnowledgeBase:
    """One knowledge base of a needle document per format, shared by the answering tests."""
    kb = KnowledgeBase(IndexConfig(data_dir=office_dir), embedder=embedder)
    for filename, (build, _, _) in NEEDLES.items():
        doc = kb.ingest_bytes(build(), filename).document
        assert doc.state == DocState.INDEXED, doc.failure_reason
    return kb


def _linked_passage(kb: KnowledgeBase, source: dict[str, object]) -> str:
    """The text a passage link selects; it must be the passage's own offsets."""
    text = kb.canonical_text(int(str(source["document_id"])))
    found = re.search(r"#char=(\d+),(\d+)$", str(source["url"]))
    assert found, source["url"]
    a, b = int(found[1]), int(found[2])
    assert (a, b) == (source["start"], source["end"])
    return text[a:b]


async def test_a_needle_in_each_format_is_found_with_an_exact_link(
    office_kb: KnowledgeBase, office_dir: Path
) -> None:
    settings = make_settings(data_dir=office_dir, threshold=0.9)
    engine = build_engine(settings.engine_config(), office_kb)
    try:
        for filename, (_, question, needle) in NEEDLES.items():
            doc_id = office_kb.store.find_document(filename).id
            answer = await engine.ask(question)
            kept = [dataclasses.asdict(s) for s in answer.kept if s.document_id == doc_id]
            assert any(needle in _linked_passage(office_kb, s) for s in kept), (filename, kept)
    finally:
        await engine.aclose()


@pytest.mark.parametrize(
    ("filename", "section"),
    [
        ("onboarding.pptx", "Slide 2: Who to ask"),
        ("travel.docx", "Allowances"),
        ("rota.xlsx", "Sheet: On-call"),
        ("rooms.csv", ""),
    ],
)
def test_kb_ask_json_names_the_place_of_a_needle(
    office_kb: KnowledgeBase,
    office_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    filename: str,
    section: str,
) -> None:
    _, question, needle = NEEDLES[filename]
    monkeypatch.setenv("KB_THRESHOLD", "0.9")
    result = CliRunner().invoke(main, ["--data-dir", str(office_dir), "ask", question, "--json"])
    assert result.exit_code == 0, result.output
    sources = json.loads(result.stdout)["sources"]
    doc_id = office_kb.store.find_document(filename).id
    cited = [
        s for s in sources if s["document_id"] == doc_id and needle in _linked_passage(office_kb, s)
    ]
    assert cited, sources
    assert cited[0]["section"] == section and cited[0]["page"] is None
    assert cited[0]["columns"] == COLUMNS.get(filename, "")


async def test_the_model_reads_a_sheet_passage_below_its_header_with_the_column_names(
    office_kb: KnowledgeBase, office_dir: Path, llm: OpenAICompatServer
) -> None:
    settings = make_settings(
        data_dir=office_dir,
        threshold=0.9,
        openai_base_url=llm.url,
        openai_api_key=DEFAULT_OPENAI_API_KEY,
    )
    engine = build_engine(settings.engine_config(), office_kb)
    try:
        for filename, columns in COLUMNS.items():
            _, question, needle = NEEDLES[filename]
            doc_id = office_kb.store.find_document(filename).id
            answer = await engine.ask(question)
            assert answer.model_called, answer.outcome
            (kept,) = [s for s in answer.kept if s.document_id == doc_id and needle in s.quote]
            assert columns not in kept.quote, "the passage starts below the header row"
            assert _linked_passage(office_kb, dataclasses.asdict(kept)) == kept.quote
            prompt = llm.requests[-1]["messages"][-1]["content"]
            block = re.search(rf'<source n="{kept.n}">\n(.*)\n((?s:.*?))\n</source>', prompt)
            assert block is not None, prompt
            assert block[1].endswith(
                f" - {kept.section + ', ' if kept.section else ''}columns: {columns}"
            )
            assert block[2] == quoted(kept.quote), "the quoted text stays exactly the passage"
            first = [s for s in answer.kept if s.quote.startswith(columns)]
            assert all(not s.columns for s in first), "a passage with its header row needs none"
    finally:
        await engine.aclose()


async def test_an_mcp_search_gives_a_sheet_passage_as_the_answer_keeps_it_columns_included(
    office_kb: KnowledgeBase, office_dir: Path
) -> None:
    settings = make_settings(data_dir=office_dir, threshold=0.9)
    engine = build_engine(settings.engine_config(), office_kb)
    tools = Tools(engine, None)
    try:
        for filename, columns in COLUMNS.items():
            _, question, needle = NEEDLES[filename]
            answer = await engine.ask(question)
            found = await tools.found(EVERYONE, question, MAX_LIMIT)
            # The same passages as the answer keeps, built the same way: links, columns, origin.
            assert [_unsigned(r) for r in found.written_from] == [_unsigned(s) for s in answer.kept]
            (passage,) = [p for p in found.result.passages if needle in p.quote]
            assert passage.columns == columns and passage.passes_gate
            assert f"columns: {columns})" in search_text(found.result)
    finally:
        await engine.aclose()


def _unsigned(ref: SourceRef) -> SourceRef:
    """``ref`` with its link's token left out (signed anew at each call)."""
    return dataclasses.replace(ref, url=re.sub(r"\?[^#]*", "?", ref.url))


def test_the_docs_and_kb_ingest_help_name_every_supported_type() -> None:
    readme = (Path(__file__).parent.parent / "docs/operating.md").read_text()
    help_text = CliRunner().invoke(main, ["ingest", "--help"]).output
    for suffix in SUPPORTED_SUFFIXES:
        if suffix not in {".markdown", ".htm"}:
            assert f"`{suffix}`" in readme and suffix in help_text, suffix
    for legacy in (".doc", ".xls", ".ppt"):
        assert f"`{legacy}`" in readme and legacy in help_text
    # What is refused, with the limits the code applies.
    said = (" ".join(readme.split()), " ".join(help_text.split()))
    mb = 1024 * 1024
    for fact in (
        f"past {DEFAULT_MAX_UNZIPPED_BYTES // mb} MB",
        f"a part over {RATIO_FLOOR // mb} MB",
        f"{MAX_RATIO} times",
        f"{MAX_CELLS:,} cells",
        "OpenDocument",
        "damaged",
        "password",
    ):
        assert all(fact in text for text in said), fact


# --- Slack


async def test_a_word_file_uploaded_through_slack_is_indexed(bot: Bot) -> None:
    await bot.post(slash_command_body("/kb-upload", "", USER_ID, CHANNEL_ID))
    (call,) = await bot.slack.wait_for("views.open")
    view = dict(call["view"])
    file_input = next(b["element"] for b in view["blocks"] if b["type"] == "input")
    assert {"docx", "pptx", "xlsx", "csv"} <= set(file_input["filetypes"])
    intro = json.dumps(view["blocks"][0])
    assert all(kind in intro for kind in ("Word", "PowerPoint", "Excel", "CSV"))
    mime = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    f = bot.slack.add_file("F0TRAVEL01", "travel.docx", policy_docx(), mime, filetype="docx")
    state = file_input_state("files", "files", [f])
    state["values"]["visibility"] = {
        "visibility": {"type": "radio_buttons", "selected_option": {"value": "channel"}}
    }
    resp = await bot.post(view_submission_body({**view, "state": state}))
    assert resp.status == 200
    await bot.settle()
    doc = bot.kb.store.find_document("travel.docx")
    assert doc.state == "indexed" and doc.chunk_count > 0 and doc.kind == "docx"
