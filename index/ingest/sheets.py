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
(rows times columns as read) is refused before its text is built.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterable, Iterator

from openpyxl import load_workbook

from index.errors import CorruptDocument, EmptyDocument, OverLimit
from index.ingest.office import CELL_SEPARATOR, heading, join_blocks, read_failed, safe_line
from index.ingest.office_zip import Package
from index.models import Extracted

# About 5 MB of text: more chunks than KB_MAX_CHUNKS allows, read in a few seconds.
MAX_CELLS = 1_000_000
_SNIFF_BYTES = 64 * 1024
_DELIMITERS = ",;\t|"
# Excel shows at most 15 significant digits; more would print float noise.
_FLOAT_DIGITS = 15


def xlsx_document(package: Package, name: str, filename: str, fallback_title: str) -> Extracted:
    """The canonical text of an Excel package (checked by ``open_package``)."""
    try:
        book = load_workbook(io.BytesIO(package.data), read_only=True, data_only=True)
    except Exception as exc:  # openpyxl raises assorted errors on bad parts
        raise read_failed(name, filename, "Excel", exc) from exc
    try:
        blocks, hidden = _workbook_blocks(book, name, filename)
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
    return Extracted(text=join_blocks(blocks), title=title[:200] or fallback_title, kind="xlsx")


def _workbook_blocks(book: object, name: str, filename: str) -> tuple[list[str], list[str]]:
    blocks: list[str] = []
    hidden: list[str] = []
    budget = _CellBudget(name, filename)
    for sheet in book.worksheets:  # type: ignore[attr-defined]
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


def csv_document(text: str, name: str, filename: str, suffix: str, title: str) -> Extracted:
    """The canonical text of a CSV (or TSV) file's decoded text."""
    try:
        rows = list(
            _row_lines(
                csv.reader(io.StringIO(text), _dialect(text, suffix)), _CellBudget(name, filename)
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
    return Extracted(text=join_blocks(rows), title=title, kind="csv")


def _dialect(text: str, suffix: str) -> type[csv.Dialect]:
    try:
        return csv.Sniffer().sniff(text[:_SNIFF_BYTES], delimiters=_DELIMITERS)
    except csv.Error:  # one column, or too irregular to tell
        return csv.excel_tab if suffix == ".tsv" else csv.excel


class _CellBudget:
    """Counts the cells read and stops a document at ``MAX_CELLS``."""

    def __init__(self, name: str, filename: str) -> None:
        self.left = MAX_CELLS
        self.name = name
        self.filename = filename

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
        cells = [_cell_text(v) for v in row]
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


__all__ = ["MAX_CELLS", "csv_document", "xlsx_document"]
