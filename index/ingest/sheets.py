"""Excel workbooks and CSV files -> canonical text, one section per sheet.

Each row is one line, its cells separated by `` | `` in column order (empty
cells kept between filled ones, so a value stays under its column), and a
blank line between rows so that the chunker packs whole rows and never cuts
one. Rows are written as values, not ``Header: value`` pairs: the header row is
the sheet's first line, and the chunker repeats it in the embedded header of
every chunk that starts further down (``index.ingest.chunk``), so a chunk reads on its
own while the canonical text stays the table itself and a 512-character chunk
holds two to three times more rows.

Excel (openpyxl, read-only, cached values: a formula is read as the value Excel
last computed; a file saved by a tool that never computed it reads empty
there): a level-1 heading ``Sheet: <name>`` per visible sheet; hidden sheets
are skipped and named in a note at the start. CSV: the delimiter is sniffed
(``,`` ``;`` tab ``|``), the text decoded as text files are; no heading.

Empty rows are skipped. A workbook or file of more than ``MAX_CELLS`` cells
(rows times columns as read) is refused before its text is built, and one
whose cells' text passes ``KB_MAX_TEXT_CHARS`` stops at the cell that does: a
shared string counts as its text each time a cell uses it. A workbook listing
one sheet part twice is refused before any sheet is read.

The CSV dialect is found in linear time on a bounded sample: the first
``_SNIFF_ROWS`` records of at most ``_SNIFF_CHARS`` characters are parsed with
each candidate delimiter and quote, and the one giving the most rows of one
width wins. ``csv.Sniffer`` is not used: its regular expressions backtrack for
tens of seconds over a quote, a long run of spaces and a quote.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import islice

from openpyxl import load_workbook

from index.config import DEFAULT_MAX_TEXT_CHARS
from index.errors import CorruptDocument, EmptyDocument, OverLimit
from index.ingest.office import (
    CELL_SEPARATOR,
    TextBudget,
    heading,
    join_blocks,
    read_failed,
    safe_line,
)
from index.ingest.office_zip import Package, aliased_part
from index.models import Extracted

# About 5 MB of text: more chunks than KB_MAX_CHUNKS allows, read in a few seconds.
MAX_CELLS = 1_000_000
# The sample the CSV dialect is found on: at most this many characters, and records.
_SNIFF_CHARS = 64 * 1024
_SNIFF_ROWS = 100
_DELIMITERS = ",;\t|"  # in order of preference when two fit as well
_QUOTES = "\"'"
# Excel shows at most 15 significant digits; more would print float noise.
_FLOAT_DIGITS = 15


def xlsx_document(
    package: Package,
    name: str,
    filename: str,
    fallback_title: str,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> Extracted:
    """The canonical text of an Excel package (checked by ``open_package``)."""
    budget = TextBudget(max_text_chars, name, filename)
    try:
        book = load_workbook(io.BytesIO(package.data), read_only=True, data_only=True)
    except Exception as exc:  # openpyxl raises assorted errors on bad parts
        raise read_failed(name, filename, "Excel", exc) from exc
    try:
        blocks, hidden = _workbook_blocks(book, name, filename, budget)
        title = " ".join((book.properties.title or "").split())
    except (OverLimit, CorruptDocument):
        raise
    except Exception as exc:
        raise read_failed(name, filename, "Excel", exc) from exc
    finally:
        book.close()
    if not any(not b.startswith("#") for b in blocks):
        what = "all its sheets are hidden" if hidden else "its sheets are empty"
        raise EmptyDocument(f"{name} is an Excel file with no text: {what}.", filename=filename)
    if hidden:
        blocks.insert(0, "Hidden sheets, not indexed: " + ", ".join(hidden) + ".")
    text = budget.check(join_blocks(blocks))
    return Extracted(text=text, title=title[:200] or fallback_title, kind="xlsx")


def _workbook_blocks(
    book: object, name: str, filename: str, text_budget: TextBudget
) -> tuple[list[str], list[str]]:
    blocks: list[str] = []
    hidden: list[str] = []
    budget = _CellBudget(name, filename, text_budget)
    sheets = book.worksheets  # type: ignore[attr-defined]
    _refuse_aliased_sheets(sheets, name, filename)
    for sheet in sheets:
        title = " ".join(str(sheet.title).split())
        if sheet.sheet_state != "visible":
            hidden.append(title)
            continue
        # The sheet's stated dimension can be far wider than its cells (a tool's
        # bug, or a hostile file); rows would then be padded to it.
        sheet.reset_dimensions()
        rows = list(_row_lines(sheet.iter_rows(values_only=True), budget))
        if rows:
            blocks.append(heading(1, f"Sheet: {title}"))
            blocks.extend(rows)
    return blocks, hidden


def _refuse_aliased_sheets(sheets: list[object], name: str, filename: str) -> None:
    """Refuse a workbook whose sheets (hidden ones too) list one worksheet part twice."""
    seen = Counter(str(getattr(sheet, "_worksheet_path", id(sheet))) for sheet in sheets)
    for part, times in seen.items():
        if times > 1:
            raise aliased_part(name, filename, "Excel", "sheet", part, times)


def csv_document(
    text: str,
    name: str,
    filename: str,
    suffix: str,
    title: str,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> Extracted:
    """The canonical text of a CSV (or TSV) file's decoded text."""
    budget = TextBudget(max_text_chars, name, filename)
    try:
        rows = list(
            _row_lines(
                csv.reader(io.StringIO(text), _dialect(text, suffix)),
                _CellBudget(name, filename, budget),
            )
        )
    except csv.Error as exc:
        raise CorruptDocument(
            f"{name} is not a readable CSV file ({exc}). Export it again from the "
            "spreadsheet and upload the new copy.",
            filename=filename,
        ) from exc
    if not rows:
        raise EmptyDocument(f"{name} is a CSV file with no values.", filename=filename)
    return Extracted(text=budget.check(join_blocks(rows)), title=title, kind="csv")


def _dialect(text: str, suffix: str) -> type[csv.Dialect]:
    """The CSV dialect of ``text``, found on a bounded sample in linear time.

    Each candidate delimiter and quote character parses the sample (the C
    reader: one pass); the candidate under which most rows have one width of
    two or more cells wins, ties to ``,`` and the double quote. None fits: one
    column, read as Excel's CSV (or tab-separated for ``.tsv``).
    """
    sample = sniff_sample(text)
    best: tuple[int, int, int] | None = None
    found: type[csv.Dialect] | None = None
    for d_rank, delimiter in enumerate(_DELIMITERS):
        if delimiter not in sample:
            continue
        skip = _spaced(sample, delimiter)
        for q_rank, quote in enumerate(_QUOTES):
            widths = Counter(w for w in _sample_widths(sample, delimiter, quote, skip) if w)
            width, count = widths.most_common(1)[0] if widths else (0, 0)
            if width < 2:
                continue
            score = (count, -d_rank, -q_rank)
            if best is None or score > best:
                best = score
                found = _make_dialect(delimiter, quote, skip)
    if found is not None:
        return found
    return csv.excel_tab if suffix == ".tsv" else csv.excel


def sniff_sample(text: str) -> str:
    """The start of ``text`` the dialect is found on: at most ``_SNIFF_CHARS`` characters.

    Cut at its last line end when the text goes on, so no half line is judged.
    """
    sample = text[:_SNIFF_CHARS]
    if len(text) > _SNIFF_CHARS and "\n" in sample:
        sample = sample[: sample.rindex("\n")]
    return sample


def _spaced(sample: str, delimiter: str) -> bool:
    """Whether every delimiter of the first line is followed by a space (``a, b, c``)."""
    first = sample.split("\n", 1)[0]
    return first.count(delimiter) > 0 and first.count(delimiter) == first.count(delimiter + " ")


def _sample_widths(sample: str, delimiter: str, quote: str, skip: bool) -> list[int]:
    reader = csv.reader(
        io.StringIO(sample),
        delimiter=delimiter,
        quotechar=quote,
        doublequote=True,
        skipinitialspace=skip,
        strict=False,
    )
    try:
        return [len(row) for row in islice(reader, _SNIFF_ROWS)]
    except csv.Error:  # a field over the size limit: not this dialect's sample to judge
        return []


def _make_dialect(delimiter: str, quote: str, skip: bool) -> type[csv.Dialect]:
    class Sniffed(csv.excel):
        pass

    Sniffed.delimiter = delimiter
    Sniffed.quotechar = quote
    Sniffed.skipinitialspace = skip
    return Sniffed


class _CellBudget:
    """Counts the cells read and stops a document at ``MAX_CELLS``; their text goes to ``text``."""

    def __init__(self, name: str, filename: str, text: TextBudget) -> None:
        self.left = MAX_CELLS
        self.name = name
        self.filename = filename
        self.text = text

    def spend(self, cells: int) -> None:
        self.left -= cells
        if self.left < 0:
            raise OverLimit(
                f"{self.name} is over the limit of {MAX_CELLS:,} cells per document. Delete "
                "unused rows and columns, or split it into smaller files, and upload those.",
                filename=self.filename,
            )


def _row_lines(rows: Iterable[Iterable[object]], budget: _CellBudget) -> Iterator[str]:
    for row in rows:
        cells: list[str] = []
        for value in row:  # counted cell by cell: one row may hold 16,384 long shared strings
            cell = _cell_text(value)
            budget.text.spend(len(cell))
            cells.append(cell)
        budget.spend(max(1, len(cells)))
        while cells and not cells[-1]:
            cells.pop()
        if cells:
            yield safe_line(CELL_SEPARATOR.join(cells))


def _cell_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.{_FLOAT_DIGITS}g}"
    if isinstance(value, dt.datetime):
        if value.time() == dt.time():
            return value.date().isoformat()
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    return " ".join(str(value).split())


__all__ = ["MAX_CELLS", "csv_document", "sniff_sample", "xlsx_document"]
