"""Untrusted documents are read in reader processes with memory and time limits.

The files are real: an honest but big markdown file against a low memory
limit, an honest PDF of many pages against a one-second time limit, and an xlsx
whose one large shared string fills a thousand cells (a gigabyte of text from
half a megabyte), read by the product's own knowledge base with its limits set
through its configuration.
"""

from __future__ import annotations

import io
import pickle
import re
import secrets
import threading
import time
import zipfile
from pathlib import Path

import pytest
from fpdf import FPDF
from PIL import Image, ImageDraw, ImageFont
from pypdf import PdfReader, PdfWriter

from index.config import ExtractLimits, IndexConfig
from index.embed import Embedder
from index.ingest.extract import extract
from index.ingest.isolated import memory_reason, over_reading_limit, reader_pool, time_reason
from index.knowledge_base import KnowledgeBase
from index.models import DocState, Extracted

_NS = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_PKG = "http://schemas.openxmlformats.org/package/2006/relationships"
_CT = "application/vnd.openxmlformats-officedocument.spreadsheetml"


def shared_string_bomb(string_chars: int = 1_000_000, rows: int = 10, cols: int = 100) -> bytes:
    """An xlsx of half a megabyte whose one shared string fills every cell: a gigabyte of text."""
    shared = secrets.token_hex(string_chars // 2)  # random: within the package's expansion ratio
    letters = [
        chr(ord("A") + c // 26 - 1) * (c >= 26) + chr(ord("A") + c % 26) for c in range(cols)
    ]
    cells = "".join(
        f'<row r="{r}">'
        + "".join(f'<c r="{col}{r}" t="s"><v>0</v></c>' for col in letters)
        + "</row>"
        for r in range(1, rows + 1)
    )
    parts = {
        "[Content_Types].xml": (
            '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
            f'<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
            '<Default Extension="xml" ContentType="application/xml"/>'
            f'<Override PartName="/xl/workbook.xml" ContentType="{_CT}.sheet.main+xml"/>'
            f'<Override PartName="/xl/worksheets/sheet1.xml" ContentType="{_CT}.worksheet+xml"/>'
            f'<Override PartName="/xl/sharedStrings.xml" ContentType="{_CT}.sharedStrings+xml"/>'
            "</Types>"
        ),
        "_rels/.rels": (
            f'<Relationships xmlns="{_PKG}"><Relationship Id="rId1" '
            f'Type="{_REL}/officeDocument" Target="xl/workbook.xml"/></Relationships>'
        ),
        "xl/workbook.xml": (
            f'<workbook xmlns="{_NS}" xmlns:r="{_REL}"><sheets>'
            '<sheet name="Data" sheetId="1" r:id="rId1"/></sheets></workbook>'
        ),
        "xl/_rels/workbook.xml.rels": (
            f'<Relationships xmlns="{_PKG}">'
            f'<Relationship Id="rId1" Type="{_REL}/worksheet" Target="worksheets/sheet1.xml"/>'
            f'<Relationship Id="rId2" Type="{_REL}/sharedStrings" Target="sharedStrings.xml"/>'
            "</Relationships>"
        ),
        "xl/sharedStrings.xml": f'<sst xmlns="{_NS}" count="1" uniqueCount="1"><si><t>{shared}</t></si></sst>',
        "xl/worksheets/sheet1.xml": f'<worksheet xmlns="{_NS}"><sheetData>{cells}</sheetData></worksheet>',
    }
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, xml in parts.items():
            z.writestr(name, '<?xml version="1.0" encoding="UTF-8"?>' + xml)
    return out.getvalue()


def long_pdf(pages: int = 1500) -> bytes:
    """An honest PDF of many text pages: seconds of reading on any machine."""
    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    pdf.add_page()
    pdf.multi_cell(0, 6, "Office opening hours are eight to six on weekdays. " * 40)
    page = PdfReader(io.BytesIO(bytes(pdf.output()))).pages[0]
    writer = PdfWriter()
    for _ in range(pages):
        writer.add_page(page)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def big_markdown() -> bytes:
    """An honest 20 MB markdown file: more than a 200 MB reader can hold."""
    paragraphs = (f"Paragraph {i} tells how the office works on day {i}." for i in range(350_000))
    return ("# Guide\n\n" + "\n\n".join(paragraphs)).encode()


def _kb(tmp_path: Path, embedder: Embedder, **limits: float) -> KnowledgeBase:
    config = IndexConfig(data_dir=tmp_path / "kb", extract=ExtractLimits(**limits))  # type: ignore[arg-type]
    return KnowledgeBase(config, embedder=embedder)


def _resident_peak_kb() -> int:
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("max_text_chars", "reason"),
    [
        # The text budget (the knowledge base's own, not the default) stops it first...
        (1_000_000, "over the limit of 1,000,000 characters of text per document"),
        # ...and with that budget out of the way, the reader's memory limit does.
        (10**12, "payroll.xlsx needed more than 400 MB of memory to read"),
    ],
)
def test_a_shared_string_bomb_costs_the_server_nothing(
    tmp_path: Path, embedder: Embedder, max_text_chars: int, reason: str
) -> None:
    config = IndexConfig(
        data_dir=tmp_path / "kb",
        max_text_chars=max_text_chars,
        extract=ExtractLimits(memory_mb=400),
    )
    kb = KnowledgeBase(config, embedder=embedder)
    data = shared_string_bomb()
    assert len(data) < 1024 * 1024  # a small file...
    doc = kb.add_bytes(data, "payroll.xlsx", uploader="U1").document
    Path("/proc/self/clear_refs").write_text("5")  # this process's peak resident memory: from now
    before = _resident_peak_kb()

    row = kb.index_document(doc.id)

    assert row.state == DocState.FAILED
    assert row.failure_reason is not None and reason in row.failure_reason, row.failure_reason
    # ...that needs a gigabyte to read in this process: the server's own peak grew by far less.
    assert _resident_peak_kb() - before < 150 * 1024
    # Nothing else is affected: the next document is read by a fresh reader.
    after = kb.ingest_bytes(b"# Lunch\n\nLunch is served at noon.\n", "lunch.md").document
    assert after.state == DocState.INDEXED


def test_an_honest_file_over_a_low_memory_limit_fails_and_the_server_never_pays_for_it(
    tmp_path: Path, embedder: Embedder
) -> None:
    config = IndexConfig(
        data_dir=tmp_path / "kb",
        max_upload_bytes=50 * 1024 * 1024,
        extract=ExtractLimits(memory_mb=200),
    )
    kb = KnowledgeBase(config, embedder=embedder)
    data = big_markdown()
    doc = kb.add_bytes(data, "guide.md", uploader="U1").document
    Path("/proc/self/clear_refs").write_text("5")  # this process's peak resident memory: from now
    before = _resident_peak_kb()

    row = kb.index_document(doc.id)

    assert row.state == DocState.FAILED
    assert row.failure_reason is not None
    assert "guide.md needed more than 200 MB of memory to read" in row.failure_reason
    # The server held the bytes and sent them; reading them cost it nothing more.
    assert (_resident_peak_kb() - before) * 1024 < 3 * len(data)
    # Nothing else is affected: the next document is read by a fresh reader.
    after = kb.ingest_bytes(b"# Lunch\n\nLunch is served at noon.\n", "lunch.md").document
    assert after.state == DocState.INDEXED


def test_a_document_over_the_time_limit_fails_and_the_server_stays_responsive(
    tmp_path: Path, embedder: Embedder
) -> None:
    kb = _kb(tmp_path, embedder, timeout=1)
    doc = kb.add_bytes(long_pdf(), "manual.pdf", uploader="U1").document
    pool = reader_pool(kb.config.extract)  # type: ignore[arg-type]
    result: dict[str, object] = {}

    def index() -> None:
        started = time.monotonic()
        result["row"] = kb.index_document(doc.id)
        result["seconds"] = time.monotonic() - started

    worker = threading.Thread(target=index)
    worker.start()
    deadline = time.monotonic() + 30
    while pool.reading() == 0 and worker.is_alive():
        assert time.monotonic() < deadline, "the document was never read"
        time.sleep(0.01)
    # While the reader is busy on it, this process answers at once.
    started = time.monotonic()
    for _ in range(20):
        kb.document_count()
    assert time.monotonic() - started < 1.0
    worker.join(60)
    assert not worker.is_alive()

    row = result["row"]
    assert row.state == DocState.FAILED  # type: ignore[attr-defined]
    assert "manual.pdf took longer than 1 s to read" in row.failure_reason  # type: ignore[attr-defined]
    assert "KB_EXTRACT_TIMEOUT" in row.failure_reason  # type: ignore[attr-defined]
    assert result["seconds"] < 15  # type: ignore[operator]


def _scan(lines: list[str]) -> bytes:
    page = Image.new("L", (1240, 1754), color=255)
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=34)
    for i, line in enumerate(lines):
        draw.text((100, 150 + i * 60), line, fill=0, font=font)
    out = io.BytesIO()
    page.save(out, format="PDF", resolution=150, save_all=True, append_images=[page.copy()] * 2)
    return out.getvalue()


@pytest.mark.skipif(not Path("/usr/bin/tesseract").exists(), reason="needs Tesseract")
def test_tesseracts_time_on_scanned_pages_is_not_counted_against_the_time_limit(
    tmp_path: Path, embedder: Embedder
) -> None:
    kb = _kb(tmp_path, embedder, timeout=1)
    data = _scan(["Expense policy", "", "Taxi receipts go to Jonas Berg."])
    started = time.monotonic()
    row = kb.ingest_bytes(data, "scan.pdf").document
    took = time.monotonic() - started
    assert row.state == DocState.INDEXED, row.failure_reason
    assert took > 1  # three pages of OCR took longer than the limit, and were not cut short
    assert "Jonas Berg" in kb.canonical_text(row.id)


def test_reindex_skips_documents_over_a_reading_limit_until_it_is_raised(
    tmp_path: Path, embedder: Embedder
) -> None:
    kb = _kb(tmp_path, embedder, timeout=1)
    slow = kb.add_bytes(long_pdf(), "manual.pdf", uploader="U1").document
    assert kb.index_document(slow.id).state == DocState.FAILED
    kb.ingest_bytes(b"# Lunch\n\nLunch is served at noon.\n", "lunch.md")

    report = kb.reindex()
    assert [s.document.id for s in report.skipped] == [slow.id]
    assert "not read again" in report.skipped[0].reason
    assert "took longer than 1 s to read" in report.skipped[0].reason
    assert report.documents == 1 and not report.failed
    assert kb.document(slow.id).state == DocState.FAILED


def test_a_reading_limit_failure_is_known_until_the_limit_is_raised() -> None:
    limits = ExtractLimits(memory_mb=512, timeout=60)
    memory, slow = memory_reason("a.xlsx", limits), time_reason("b.docx", limits)
    assert "needed more than 512 MB" in memory and "took longer than 60 s to read" in slow
    assert over_reading_limit(memory, limits) and over_reading_limit(slow, limits)
    assert over_reading_limit(memory, ExtractLimits(memory_mb=256, timeout=60))
    assert not over_reading_limit(memory, ExtractLimits(memory_mb=1024, timeout=60))
    assert not over_reading_limit(slow, ExtractLimits(memory_mb=512, timeout=120))
    # A name (the uploader's) that reads like a limit changes nothing: the reader's sentence counts.
    named = memory_reason("needed more than 99999 MB of memory to read.xlsx", limits)
    assert not over_reading_limit(named, ExtractLimits(memory_mb=1024, timeout=60))
    assert not over_reading_limit("notes.csv is not a CSV file.", limits)
    assert not over_reading_limit(None, limits)


def test_extracted_text_pickles_and_extract_still_runs_in_this_process() -> None:
    extracted = extract(b"# Guide\n\nBadges at 09:30.\n", "guide.md")
    assert isinstance(extracted, Extracted)
    assert pickle.loads(pickle.dumps(extracted)) == extracted
    paged = Extracted(text="a\fb", title="t", kind="pdf", page_starts=(0, 2))
    assert pickle.loads(pickle.dumps(paged)) == paged
