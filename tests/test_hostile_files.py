"""Small Office and CSV files that would cost gigabytes or minutes: each fails with its reason,
or is read with bounded work, and an honest file just under a limit is still read.

The files are built in ``tests.hostile``; what is counted here is deterministic
(cells read, slides read, style lookups, the size of the CSV sniffing sample),
never the wall time.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from typing import Any

import docx
import pptx
import pytest
from docx.oxml.ns import nsdecls
from docx.oxml.styles import CT_Styles
from docx.styles.styles import Styles
from pypdf import PageObject

from bot.settings import Settings
from index.config import DEFAULT_MAX_TEXT_CHARS
from index.errors import CorruptDocument, EmptyDocument, OverLimit
from index.ingest import office, sheets
from index.ingest.extract import extract
from index.ingest.office import TextBudget
from tests import hostile
from tests.docs_factory import text_pdf
from tests.steps import assert_linear
from tests.test_office import _saved, _word_markup_docx, onboarding_pptx

OVER_TEXT = r"over the limit of {:,} characters of text per document.*KB_MAX_TEXT_CHARS"


def _counting(monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> list[int]:
    """Count the calls of ``owner.name`` (still calling it)."""
    calls: list[int] = []
    real: Callable[..., Any] = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


# --- Excel


def test_one_shared_string_in_many_cells_counts_its_text_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = hostile.shared_string_xlsx(cells=1600, chars=64 * 1024)
    assert len(data) < 50 * 1024  # 105 MB of text in a 15 KB upload
    cells = _counting(monkeypatch, sheets, "_cell_text")
    with pytest.raises(OverLimit, match=OVER_TEXT.format(DEFAULT_MAX_TEXT_CHARS)):
        extract(data, "notes.xlsx")
    # Reading stopped at the cell that went over: the other ~1,450 were never built.
    assert len(cells) == DEFAULT_MAX_TEXT_CHARS // (64 * 1024) + 1


def test_a_workbook_just_under_the_text_limit_is_read() -> None:
    data = hostile.shared_string_xlsx(cells=20, chars=1000, columns=4)
    text = extract(data, "notes.xlsx").text
    assert text.count(hostile.words(1000)) == 20
    assert extract(data, "notes.xlsx", max_text_chars=len(text)).text == text
    with pytest.raises(OverLimit, match=OVER_TEXT.format(len(text) - 1)):
        extract(data, "notes.xlsx", max_text_chars=len(text) - 1)


@pytest.mark.parametrize("one_rel", [False, True], ids=["own-relationships", "one-relationship"])
def test_a_sheet_part_listed_many_times_is_refused_before_any_cell_is_read(
    monkeypatch: pytest.MonkeyPatch, one_rel: bool
) -> None:
    data = hostile.aliased_sheets_xlsx(aliases=300, one_rel=one_rel)
    assert len(data) < 50 * 1024  # 614 MB of text
    cells = _counting(monkeypatch, sheets, "_cell_text")
    with pytest.raises(
        CorruptDocument, match="lists its sheet part 'xl/worksheets/sheet1.xml' 300 times"
    ):
        extract(data, "aliased.xlsx")
    assert cells == []


def test_copies_of_one_sheet_are_each_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    # 300 distinct parts: nothing is aliased, the budget alone stops them.
    data = hostile.copied_sheets_xlsx(copies=300, cells=32, chars=64 * 1024)
    assert len(data) < 200 * 1024
    cells = _counting(monkeypatch, sheets, "_cell_text")
    with pytest.raises(OverLimit, match=OVER_TEXT.format(DEFAULT_MAX_TEXT_CHARS)):
        extract(data, "copies.xlsx")
    assert len(cells) == DEFAULT_MAX_TEXT_CHARS // (64 * 1024) + 1


def test_honest_copies_of_a_sheet_are_read() -> None:
    doc = extract(hostile.copied_sheets_xlsx(copies=3, cells=2, chars=100), "copies.xlsx")
    assert [line for line in doc.text.split("\n") if line.startswith("#")] == [
        "# Sheet: Sheet 0",
        "# Sheet: Sheet 1",
        "# Sheet: Sheet 2",
    ]


# --- PowerPoint


@pytest.mark.parametrize("one_rel", [False, True], ids=["own-relationships", "one-relationship"])
def test_a_slide_listed_many_times_is_refused_before_any_slide_is_read(
    monkeypatch: pytest.MonkeyPatch, one_rel: bool
) -> None:
    data = hostile.aliased_slides_pptx(aliases=400, chars=256 * 1024, one_rel=one_rel)
    assert len(data) < 200 * 1024  # 105 MB of text
    slides = _counting(monkeypatch, office, "_slide_section")
    with pytest.raises(CorruptDocument, match="lists one slide part 400 times.*PowerPoint"):
        extract(data, "deck.pptx")
    assert slides == []


def test_slides_are_counted_as_they_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    prs = hostile.pptx.Presentation()
    for n in range(10):
        slide = prs.slides.add_slide(prs.slide_layouts[5])
        slide.shapes.title.text = f"Part {n}"
        box = slide.shapes.add_textbox(0, 0, 100, 100)
        box.text_frame.text = hostile.words(1000, seed=n)
    slides = _counting(monkeypatch, office, "_slide_section")
    with pytest.raises(OverLimit, match=OVER_TEXT.format(2500)):
        extract(_saved(prs), "deck.pptx", max_text_chars=2500)
    assert len(slides) == 3  # the third slide went over; seven were never read


def test_a_long_slide_just_under_the_text_limit_is_read() -> None:
    data = hostile.long_slide_pptx(chars=20_000)
    text = extract(data, "deck.pptx").text
    assert len(text) > 20_000 and text.startswith("# Slide 1: Expense policy\n\n")
    assert extract(data, "deck.pptx", max_text_chars=len(text)).text == text
    with pytest.raises(OverLimit):
        extract(data, "deck.pptx", max_text_chars=len(text) - 1)


def test_placeholders_take_their_layouts_positions_in_linear_steps() -> None:
    files = {n: hostile.placeholders_pptx(n) for n in (40, 160)}
    assert_linear(lambda n: extract(files[n], "placeholders.pptx"), 40)
    # The reading order is python-pptx's own: by top, then left, inherited where unset.
    for data in (files[40], onboarding_pptx(), hostile.long_slide_pptx(4096)):
        for slide in pptx.Presentation(io.BytesIO(data)).slides:
            positions = office._Positions(slide)
            shapes = list(slide.shapes)
            assert [positions.of(s) for s in shapes] == [(s.top or 0, s.left or 0) for s in shapes]
    text = extract(files[40], "placeholders.pptx").text
    assert all(f"Item {i}" in text for i in range(40))


# --- Word


def test_styles_are_resolved_once_per_document_not_per_paragraph(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = hostile.styled_docx(styles=4000, paragraphs=4000)
    assert len(data) < 100 * 1024
    tables = _counting(monkeypatch, office, "_paragraph_styles")
    scans = [
        _counting(monkeypatch, owner, name)
        for owner, name in (
            (Styles, "get_by_id"),
            (Styles, "default"),
            (CT_Styles, "get_by_id"),
            (CT_Styles, "default_for"),
        )
    ]
    doc = extract(data, "styles.docx")
    assert doc.text.count("of the handbook.") == 4000
    assert len(tables) == 1  # one table of 4,000 styles ...
    assert [len(s) for s in scans] == [0, 0, 0, 0]  # ... and no scan of them per paragraph


def test_a_table_merged_down_many_rows_is_read_in_linear_steps() -> None:
    files = {rows: hostile.merged_table_docx(rows) for rows in (100, 400)}
    assert len(files[400]) < 50 * 1024
    assert_linear(lambda rows: extract(files[rows], "merged.docx"), 100)
    text = extract(files[400], "merged.docx").text
    # The merged cell is shown on every row it spans, once per row, as python-docx lists it.
    assert text.count("Merged down every row | ") == 400 and "r399c2" in text


def _merged_tables() -> docx.document.Document:
    d = docx.Document()
    t = d.add_table(rows=6, cols=5)
    for r, row in enumerate(t.rows):
        for c, cell in enumerate(row.cells):
            cell.text = f"{r}.{c}"
    t.cell(0, 0).merge(t.cell(2, 1))  # a block spanning rows and columns
    t.cell(1, 3).merge(t.cell(4, 3))  # a column merged down
    t.cell(3, 0).merge(t.cell(3, 2))  # a row merged across
    t.cell(5, 1).merge(t.cell(5, 4))
    inner = t.cell(4, 4).add_table(rows=3, cols=2)
    inner.cell(0, 0).merge(inner.cell(2, 0))
    late = d.add_table(rows=3, cols=3)  # rows that start after the first grid column
    for r, row in enumerate(late.rows):
        for cell in row.cells:
            cell.text = f"late {r}"
        row._tr.get_or_add_trPr().append(
            docx.oxml.parse_xml(f'<w:gridBefore {nsdecls("w")} w:val="1"/>')
        )
        row._tr.remove(row._tr.tc_lst[-1])
    late.rows[0]._tr.tc_lst[0].vMerge = "restart"
    late.rows[1]._tr.tc_lst[0].vMerge = "continue"
    return docx.Document(io.BytesIO(_saved(d)))


def test_table_cells_are_those_python_docx_lists() -> None:
    d = _merged_tables()
    tables = [*d.tables, d.tables[0].cell(4, 4).tables[0]]
    for table in tables:
        mine = list(office._row_cells(table))
        assert mine == [[cell._tc for cell in row.cells] for row in table.rows]
    assert any(len(set(map(id, row))) < len(row) for row in office._row_cells(tables[0]))
    # A merge that continues from no row above is a damaged table, for both.
    first = tables[2].rows[0]._tr.tc_lst[0]
    first.vMerge = "continue"
    with pytest.raises(ValueError, match="no tr above"):
        [row.cells for row in tables[2].rows]
    with pytest.raises(ValueError, match="no tr above"):
        list(office._row_cells(tables[2]))


def test_style_names_are_those_python_docx_resolves() -> None:
    d = docx.Document()
    d.add_heading("Chapter", 1)
    d.add_paragraph("Listed", style="List Bullet")
    d.add_paragraph("Plain")
    for style_id in ("Custom1", "Twice", "CharOnly", "Missing", "Unnamed"):
        p = d.add_paragraph(f"Styled {style_id}")
        p._p.get_or_add_pPr().get_or_add_pStyle().val = style_id
    styles = d.styles.element
    extra = (
        '<w:style xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" '
        'w:type="{type}" w:styleId="{id}"{default}>{name}</w:style>'
    )
    for type_, id_, name, default in (
        ("paragraph", "Custom1", "heading 2", ""),  # a custom id with a built-in's name
        ("paragraph", "Twice", "First of two", ""),
        ("paragraph", "Twice", "Second of two", ""),  # the first of an id counts
        ("character", "CharOnly", "Character style", ""),  # another type: the default
        ("paragraph", "Unnamed", "", ""),
        ("paragraph", "Body", "Body text", ' w:default="1"'),  # the last default counts
    ):
        xml = extra.format(
            type=type_,
            id=id_,
            default=default,
            name=f'<w:name w:val="{name}"/>' if name else "",
        )
        styles.append(docx.oxml.parse_xml(xml))
    doc = docx.Document(io.BytesIO(_saved(d)))
    word = office._Word(doc, TextBudget(DEFAULT_MAX_TEXT_CHARS, "x", "x"))
    resolved = [word.style(p) for p in doc.paragraphs]
    assert resolved == [(p.style.name if p.style is not None else "") or "" for p in doc.paragraphs]
    assert "Heading 2" in resolved and "Body text" in resolved and "First of two" in resolved


def test_list_formats_are_read_once_per_document(monkeypatch: pytest.MonkeyPatch) -> None:
    tables = _counting(monkeypatch, office, "_numbering_formats")
    text = extract(_word_markup_docx(), "markup.docx").text
    assert "1. " in text
    assert len(tables) == 1


def test_a_word_file_just_under_the_text_limit_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    data = hostile.plain_docx(paragraphs=200)
    text = extract(data, "plain.docx").text
    assert extract(data, "plain.docx", max_text_chars=len(text)).text == text
    paragraphs = _counting(monkeypatch, office, "_paragraph_text")
    with pytest.raises(OverLimit, match=OVER_TEXT.format(1000)):
        extract(data, "plain.docx", max_text_chars=1000)
    assert len(paragraphs) < 50  # stopped where it went over, not after all 200


# --- CSV and PDF


def test_the_csv_dialect_is_found_on_a_bounded_sample_without_the_regex_sniffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def regex_sniffer(*_: object, **__: object) -> None:
        raise AssertionError("csv.Sniffer backtracks for minutes over this file")

    monkeypatch.setattr(csv.Sniffer, "sniff", regex_sniffer)
    samples: list[int] = []
    real = sheets._sample_widths

    def widths(sample: str, *args: Any) -> list[int]:
        samples.append(len(sample))
        return real(sample, *args)

    monkeypatch.setattr(sheets, "_sample_widths", widths)
    with pytest.raises(EmptyDocument, match="CSV file with no values"):
        extract(hostile.quoted_spaces_csv(120_000), "quotes.csv")
    assert samples == []  # no candidate delimiter in it: nothing to parse but the file itself
    # With a header, the comma is a candidate: each quote character parses the sample once.
    doc = extract(b'name,note\n"' + b" " * 120_000 + b'"\n', "quotes.csv")
    assert doc.text == "name | note"
    assert len(samples) == 2 and max(samples) <= 64 * 1024
    samples.clear()
    long = "x;y\n" * 100_000
    assert extract(long.encode(), "long.csv").text.startswith("x | y\n\nx | y")
    assert len(samples) == 2 and max(samples) <= 64 * 1024


@pytest.mark.parametrize(
    ("data", "first_row"),
    [
        (b"Name;Room\nAnna;B12\nBo;C3\n", "Name | Room"),
        (b"Name\tRoom\nAnna\tB12\nBo\tC3\n", "Name | Room"),
        (b"Name|Room|Note\nAnna|B12|x, y\nBo|C3|z\n", "Name | Room | Note"),
        (b'a, b, c\n1, "2, 3", 4\n', "a | b | c"),
        (b"name,note\nBob,'hi, there'\nAnn,'ok, fine'\n", "name | note"),
        (b"name,city\nO'Brien,Cork\nD'Arcy,Dublin\n", "name | city"),
    ],
    ids=["semicolon", "tab", "pipe", "spaced", "single-quoted", "apostrophes"],
)
def test_csv_delimiters_and_quotes_are_found(data: bytes, first_row: str) -> None:
    rows = extract(data, "t.csv").text.split("\n\n")
    assert rows[0] == first_row
    assert len({row.count(" | ") for row in rows}) == 1  # every row as wide as the header


def test_pdf_pages_are_counted_as_they_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    pdf = text_pdf([f"Page {i} says the same long sentence about travel." for i in range(10)])
    pages = _counting(monkeypatch, PageObject, "extract_text")
    with pytest.raises(OverLimit, match=OVER_TEXT.format(120)):
        extract(pdf, "pages.pdf", max_text_chars=120)
    assert len(pages) < 10


def test_the_text_limit_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().index_config().max_text_chars == DEFAULT_MAX_TEXT_CHARS
    monkeypatch.setenv("KB_MAX_TEXT_CHARS", "1234")
    assert Settings().index_config().max_text_chars == 1234
    monkeypatch.setenv("KB_MAX_TEXT_CHARS", "0")
    with pytest.raises(ValueError, match="KB_MAX_TEXT_CHARS"):
        Settings()
