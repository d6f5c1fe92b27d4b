"""Scanned PDF pages read by Tesseract: page map, marker, limits, and Tesseract missing.

Every scan here is a picture of text rendered by Pillow, put into a PDF by
Pillow or fpdf2; Tesseract reads it for real (about a second a page), so the
pages are few.
"""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytesseract
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from click.testing import CliRunner
from fpdf import FPDF
from PIL import Image, ImageDraw, ImageFont
from pypdf import PdfReader, PdfWriter
from pypdf.generic import NameObject

from bot.cli import main
from bot.server.routes import _ocr_pages, fill_viewer
from bot.settings import Settings
from index.config import IndexConfig, OcrConfig
from index.embed import Embedder
from index.errors import EmptyDocument, OverLimit, UnsupportedType
from index.ingest.extract import extract
from index.ingest.ocr import (
    IMAGES_PER_OCR_PAGE,
    MAX_IMAGES_PER_PAGE,
    OCR_MARKER,
    UNREAD_MARKER,
    ocr_marker,
    ocr_pages,
    reading_until,
    unread_marker,
)
from index.knowledge_base import KnowledgeBase
from index.models import DocState
from tests.browser import dump_dom, requires_chromium
from tests.docs_factory import text_pdf

STATIC = Path(__file__).resolve().parents[1] / "bot" / "server" / "static"

NEEDLE = "The spare key of the server room is kept by Mirela Vostok"
QUESTION = "Who keeps the spare key of the server room?"


def scan_of(lines: list[str]) -> Image.Image:
    """A page-sized grey-scale picture of ``lines``, as a 150 dpi scanner makes it."""
    page = Image.new("L", (1240, 1754), color=255)
    draw = ImageDraw.Draw(page)
    font = ImageFont.load_default(size=34)
    for i, line in enumerate(lines):
        draw.text((100, 150 + i * 60), line, fill=0, font=font)
    return page


def scanned_pdf(lines: list[str]) -> bytes:
    """A one-page PDF holding only the picture (Pillow writes it)."""
    out = io.BytesIO()
    scan_of(lines).save(out, format="PDF", resolution=150)
    return out.getvalue()


def mixed_pdf() -> bytes:
    """Page 1 and 3 with a text layer, page 2 a scan with only its page number as text."""
    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    pdf.add_page()
    pdf.multi_cell(0, 6, "Office opening hours are eight to six on weekdays. " * 3)
    pdf.add_page()
    picture = io.BytesIO()
    scan_of(["Facilities", "", NEEDLE + ".", "Ask her at the front desk."]).save(picture, "PNG")
    pdf.image(picture, x=0, y=0, w=210, h=297)
    pdf.text(100, 290, "p. 2")  # a thin text layer: kept, and the page still read by OCR
    pdf.add_page()
    pdf.multi_cell(0, 6, "Parking permits are renewed every January by the front desk. " * 3)
    return bytes(pdf.output())


def test_a_scanned_page_is_read_by_ocr_and_marked() -> None:
    extracted = extract(
        scanned_pdf(["Expense policy", "", "Taxi receipts go to Jonas Berg."]), "s.pdf"
    )
    assert extracted.page_starts == (0,)
    assert extracted.text.startswith(ocr_marker(1) + "\n\n")
    assert "Taxi receipts go to Jonas Berg" in extracted.text
    assert [int(m) for m in OCR_MARKER.findall(extracted.text)] == [1]


def test_a_mixed_pdf_keeps_its_page_numbers_and_the_needle_is_cited_on_its_page(
    index_dir: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    doc = kb.ingest_bytes(mixed_pdf(), "facilities.pdf").document
    assert doc.state == DocState.INDEXED, doc.failure_reason
    text = kb.canonical_text(doc.id)
    starts = [int(s) for s in (doc.page_starts or "").split(",")]
    assert len(starts) == 3
    assert text[starts[1] :].startswith(f"p. 2\n\n{ocr_marker(2)}\n\n")
    assert "Office opening hours" in text[: starts[1]] and "Parking" in text[starts[2] :]
    assert [int(m) for m in OCR_MARKER.findall(text)] == [2]
    assert _ocr_pages(doc, text) == [2]  # what the viewer names
    # A Markdown document quoting the marker line names no page.
    quoted = f"# Scans\n\n{ocr_marker(1)}\n\nThis line only quotes the marker.\n"
    md = kb.ingest_bytes(quoted.encode(), "quote.md").document
    assert _ocr_pages(md, kb.canonical_text(md.id)) == []

    monkeypatch.setenv("KB_THRESHOLD", "0.9")
    result = CliRunner().invoke(main, ["--data-dir", str(index_dir), "ask", QUESTION, "--json"])
    assert result.exit_code == 0, result.output
    sources = json.loads(result.stdout)["sources"]
    cited = [s for s in sources if "Mirela Vostok" in s["quote"]]
    assert cited, sources
    assert cited[0]["page"] == 2 and cited[0]["url"].endswith("#page=2")


def test_without_tesseract_a_scan_fails_clearly_and_text_pdfs_are_unaffected(
    index_dir: Path, embedder: Embedder, tmp_path: Path
) -> None:
    config = IndexConfig(
        data_dir=index_dir, ocr=OcrConfig(tesseract_cmd=str(tmp_path / "no-tesseract"))
    )
    kb = KnowledgeBase(config, embedder=embedder)
    scan = kb.ingest_bytes(scanned_pdf(["Anything at all"]), "scan.pdf").document
    assert scan.state == DocState.FAILED
    assert (scan.failure_reason or "").startswith("OCR not available: scan.pdf is a scanned PDF")
    assert "install tesseract-ocr" in (scan.failure_reason or "")
    text = kb.ingest_bytes(text_pdf(["A PDF with a text layer. " * 5]), "text.pdf").document
    assert text.state == DocState.INDEXED


def test_without_tesseract_a_text_pdf_keeps_its_text_pages_and_marks_the_scanned_one(
    index_dir: Path, embedder: Embedder, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = IndexConfig(
        data_dir=index_dir, ocr=OcrConfig(tesseract_cmd=str(tmp_path / "no-tesseract"))
    )
    kb = KnowledgeBase(config, embedder=embedder)
    doc = kb.ingest_bytes(mixed_pdf(), "facilities.pdf").document
    assert doc.state == DocState.INDEXED, doc.failure_reason
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("1 scanned page(s) not read by OCR (OCR not available)" in m for m in warned)
    text = kb.canonical_text(doc.id)
    starts = [int(s) for s in (doc.page_starts or "").split(",")]
    assert len(starts) == 3
    marker = "[page 2: image only, not read: OCR not available]"
    assert marker == unread_marker(2, "OCR not available")
    assert text[starts[1] : starts[2]] == f"p. 2\n\n{marker}\n\n"
    assert [(int(n), why) for n, why in UNREAD_MARKER.findall(text)] == [(2, "OCR not available")]
    assert OCR_MARKER.findall(text) == [] and NEEDLE not in text
    assert text[starts[2] :].startswith("Parking permits are renewed")
    pages = {c["page"] for c in kb.store.chunk_rows(doc.id) if "Parking permits" in c["content"]}
    assert pages == {3}, "the pages after the unread one keep their numbers"
    assert {c["page"] for c in kb.store.chunk_rows(doc.id) if marker in c["content"]} == {2}


def test_scanned_pages_over_the_limit_or_the_timeout_are_marked_in_a_text_pdf() -> None:
    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    for typed in (
        "Office opening hours are eight to six.",
        None,
        "Parking permits in January.",
        None,
    ):
        pdf.add_page()
        if typed:
            pdf.multi_cell(0, 6, typed * 3)
        else:
            picture = io.BytesIO()
            scan_of(["Facilities", "", NEEDLE + "."]).save(picture, "PNG")
            pdf.image(picture, x=0, y=0, w=210, h=297)
    config = OcrConfig(max_pages=1, page_timeout=0.001)
    extracted = extract(bytes(pdf.output()), "facilities.pdf", ocr=config)
    starts = extracted.page_starts or ()
    pages = [extracted.text[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    assert pages[1] == unread_marker(2, "OCR took longer than 0.001 s (KB_OCR_TIMEOUT)")
    assert pages[3] == unread_marker(4, "more scanned pages than KB_OCR_MAX_PAGES (1)")
    assert pages[0].startswith("Office opening hours") and pages[2].startswith("Parking permits")


def test_a_missing_language_is_named() -> None:
    with pytest.raises(UnsupportedType, match="the OCR language xx is not installed") as exc:
        extract(scanned_pdf(["Hello"]), "s.pdf", ocr=OcrConfig(language="eng+xx"))
    assert "KB_OCR_LANGUAGE" in exc.value.reason


def test_too_many_scanned_pages_fail_before_any_is_read() -> None:
    pdf = FPDF()
    for _ in range(3):
        pdf.add_page()
        picture = io.BytesIO()
        Image.new("L", (300, 300), color=255).save(picture, "PNG")
        pdf.image(picture, x=0, y=0, w=100)
    # Tesseract is not even looked for: the limit is checked first.
    config = OcrConfig(max_pages=2, tesseract_cmd="/nonexistent/tesseract")
    with pytest.raises(OverLimit, match="3 scanned pages, over the limit of 2") as exc:
        extract(bytes(pdf.output()), "big.pdf", ocr=config)
    assert "KB_OCR_MAX_PAGES" in exc.value.reason


def test_a_page_over_the_timeout_fails_naming_the_setting() -> None:
    with pytest.raises(OverLimit, match=r"Page 1 of slow\.pdf took longer than") as exc:
        extract(scanned_pdf(["Slow"]), "slow.pdf", ocr=OcrConfig(page_timeout=0.001))
    assert "KB_OCR_TIMEOUT" in exc.value.reason


def test_a_page_with_neither_text_nor_images_says_so() -> None:
    pdf = FPDF()
    pdf.add_page()
    pdf.rect(20, 20, 150, 10, style="F")
    with pytest.raises(EmptyDocument, match="no text layer, and OCR found no text"):
        extract(bytes(pdf.output()), "drawn.pdf")


@pytest.mark.parametrize(("env", "value"), [("KB_OCR_TIMEOUT", "0"), ("KB_OCR_MAX_PAGES", "0")])
def test_ocr_settings_must_be_positive(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=rf"{env}\n  Input should be greater than"):
        Settings()


def test_ocr_settings_reach_the_index_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KB_OCR_LANGUAGE", "eng+deu")
    monkeypatch.setenv("KB_OCR_MAX_PAGES", "7")
    ocr = Settings().index_config().ocr
    assert (ocr.language, ocr.max_pages) == ("eng+deu", 7)


@requires_chromium
def test_only_a_pages_own_marker_names_it() -> None:
    pages = ["Typed first page.\n\n", f"{ocr_marker(2)}\n\nScanned.\n\n", f"{ocr_marker(2)}\n\n"]
    text = "".join(pages)
    starts = [0, len(pages[0]), len(pages[0]) + len(pages[1])]
    # Page 3 holds page 2's marker (a forged or quoted line): it names nothing.
    assert ocr_pages(text, starts) == [2]
    assert ocr_pages(f"p. 1\n\n{ocr_marker(1)}\n\nText.", [0]) == [1]
    assert ocr_pages("No marker here.", [0]) == []


async def test_the_viewer_names_the_pages_read_by_ocr(tmp_path: Path) -> None:
    text = f"Typed first page.\n\n{ocr_marker(2)}\n\nScanned words.\n\n{ocr_marker(4)}\n\nMore."
    pages = {
        "/d/1": fill_viewer(
            title="Scan", meta="scan.pdf", file_url="/d/1/file", text=text, ocr_pages=[2, 4]
        ),
        # The same text without the server naming its pages: the marker lines alone name none.
        "/d/2": fill_viewer(title="Quote", meta="quote.md", file_url="/d/2/file", text=text),
    }

    async def viewer(request: web.Request) -> web.Response:
        return web.Response(text=pages[request.path], content_type="text/html")

    app = web.Application()
    app.router.add_get("/d/{id}", viewer)
    app.router.add_static("/static/", STATIC)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        dom = await dump_dom(f"http://127.0.0.1:{server.port}/d/1", budget_ms=1000)
        quoted = await dump_dom(f"http://127.0.0.1:{server.port}/d/2", budget_ms=1000)
    finally:
        await server.close()
    assert 'data-ocr-pages="2,4"' in dom
    note = re.search(
        r'<p class="notice" id="ocr" data-pages="2,4"( hidden="")?>(.*?)</p>', dom, re.S
    )
    assert note is not None and note.group(1) is None
    assert note.group(2).startswith("Pages 2, 4: text read by OCR")
    assert 'data-ocr-pages=""' in quoted and 'data-ready="true"' in quoted
    assert re.search(r'<p class="notice" id="ocr" data-pages="" hidden="">\s*</p>', quoted)


# --- one image, many names; many pages; many images


def _aliased(pdf: bytes, names: int, pages: int = 1) -> bytes:
    """``pdf``'s one scanned page, its image listed under ``names`` names, on ``pages`` pages."""
    reader = PdfReader(io.BytesIO(pdf))
    writer = PdfWriter()
    for _ in range(pages):
        page = writer.add_page(reader.pages[0])
    xobjects = writer.pages[0]["/Resources"]["/XObject"]
    (image,) = [xobjects.raw_get(k) for k in xobjects]
    for n in range(1, names):
        xobjects[NameObject(f"/Alias{n}")] = image
    for page in writer.pages[1:]:
        page[NameObject("/Resources")] = writer.pages[0]["/Resources"]
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _tesseract_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count Tesseract's runs (each still runs)."""
    runs: list[int] = []
    real = pytesseract.image_to_string

    def counted(*args: object, **kwargs: object) -> str:
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pytesseract, "image_to_string", counted)
    return runs


def test_an_image_listed_under_many_names_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _aliased(scanned_pdf([NEEDLE + "."]), names=8)
    assert len(PdfReader(io.BytesIO(data)).pages[0].images) == 8  # pypdf lists it 8 times
    runs = _tesseract_runs(monkeypatch)
    text = extract(data, "aliases.pdf").text
    assert len(runs) == 1
    assert text.count("Mirela Vostok") == 1


def test_an_image_shown_on_many_pages_is_read_once_and_each_page_has_its_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _aliased(scanned_pdf([NEEDLE + "."]), names=2, pages=5)
    runs = _tesseract_runs(monkeypatch)
    doc = extract(data, "repeated.pdf")
    assert len(runs) == 1
    assert ocr_pages(doc.text, doc.page_starts or ()) == [1, 2, 3, 4, 5]
    assert doc.text.count("Mirela Vostok") == 5


def test_pages_past_the_image_bounds_are_left_unread_saying_which(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = _tesseract_runs(monkeypatch)
    # A page of more distinct images than a scan has is not read, image by image, for minutes.
    crowded = _many_images_pdf(MAX_IMAGES_PER_PAGE + 1)
    with pytest.raises(OverLimit, match=f"{MAX_IMAGES_PER_PAGE + 1} images on one page"):
        extract(crowded, "crowded.pdf")
    # A document reads at most IMAGES_PER_OCR_PAGE images per page KB_OCR_MAX_PAGES allows.
    busy = _many_images_pdf(IMAGES_PER_OCR_PAGE + 1)
    with pytest.raises(OverLimit, match=r"images read per document.*KB_OCR_MAX_PAGES"):
        extract(busy, "busy.pdf", ocr=OcrConfig(max_pages=1))
    assert runs == []
    # Beside a text page, the page is indexed unread, saying why.
    mixed = PdfWriter()
    mixed.append(PdfReader(io.BytesIO(text_pdf(["Opening hours are eight to six on weekdays."]))))
    mixed.append(PdfReader(io.BytesIO(crowded)))
    doc = extract(_written(mixed), "mixed.pdf")
    assert (
        unread_marker(
            2,
            f"{MAX_IMAGES_PER_PAGE + 1} images on one page, over the "
            f"{MAX_IMAGES_PER_PAGE} read per page",
        )
        in doc.text
    )
    assert runs == []


def _many_images_pdf(images: int, pages: int = 1) -> bytes:
    """``pages`` pages of ``images`` distinct small scans each (different pixels)."""
    pdf = FPDF()
    for p in range(pages):
        pdf.add_page()
        for i in range(images):
            picture = io.BytesIO()
            Image.new("L", (80, 80), color=(p * images + i) % 250).save(picture, "PNG")
            pdf.image(picture, x=5 + (i % 10) * 20, y=5 + (i // 10) * 20, w=18, h=18)
    return bytes(pdf.output())


def _written(writer: PdfWriter) -> bytes:
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_a_pages_images_share_the_pages_ocr_time(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _tesseract_runs(monkeypatch)
    # Sixteen small images, each read well within the page's limit: together over it.
    data = _many_images_pdf(MAX_IMAGES_PER_PAGE)
    with pytest.raises(OverLimit, match=r"Page 1 of crowded\.pdf took longer than 0\.5 s") as exc:
        extract(data, "crowded.pdf", ocr=OcrConfig(page_timeout=0.5))
    assert (exc.value.kind, exc.value.limit) == ("ocr_time", 0.5)
    # Each image had the page's whole limit before: all sixteen were read.
    assert 1 <= len(runs) < MAX_IMAGES_PER_PAGE


def test_ocr_ends_by_the_documents_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _tesseract_runs(monkeypatch)
    data = _aliased(scanned_pdf([NEEDLE + "."]), names=1, pages=1)
    with reading_until(time.monotonic(), 7.0), pytest.raises(OverLimit) as exc:
        extract(data, "late.pdf", ocr=OcrConfig(page_timeout=60))
    assert (exc.value.kind, exc.value.limit) == ("time", 7.0)
    assert "late.pdf took longer than 7 s to read, OCR included" in exc.value.reason
    assert runs == []  # the time was spent before OCR began: Tesseract never ran
