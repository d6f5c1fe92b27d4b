"""Extraction: bytes -> canonical text, type from content, clear failures."""

from __future__ import annotations

import io
import os
import time

import pytest
from fpdf import FPDF
from fpdf.enums import EncryptionMethod
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image
from pypdf import PdfReader, PdfWriter

from index.errors import (
    CorruptDocument,
    EmptyDocument,
    ExtractionError,
    TooLarge,
    UnsupportedType,
)
from index.ingest.chunk import chunk_document
from index.ingest.extract import EXTRACTOR_VERSION, SUPPORTED_SUFFIXES, extract

# --- documents built at test time


def text_pdf(pages: list[str], *, title: str | None = None) -> FPDF:
    """An fpdf2 document with a text layer, one string per page."""
    pdf = FPDF()
    if title is not None:
        pdf.set_title(title)
    pdf.set_font("Helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    return pdf


def pdf_bytes(pages: list[str], *, title: str | None = None) -> bytes:
    return bytes(text_pdf(pages, title=title).output())


def rc4_pdf(pages: list[str], *, user_password: str) -> bytes:
    pdf = text_pdf(pages)
    pdf.set_encryption(
        owner_password="owner", user_password=user_password, encryption_method=EncryptionMethod.RC4
    )
    return bytes(pdf.output())


def aes_pdf(pages: list[str], *, user_password: str) -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes(pages))))
    writer.encrypt(user_password=user_password, owner_password="owner", algorithm="AES-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def scanned_pdf() -> bytes:
    """A page that is only a picture of text, like a scan without OCR."""
    picture = io.BytesIO()
    Image.new("L", (200, 80), color=200).save(picture, format="PNG")
    pdf = FPDF()
    pdf.add_page()
    pdf.image(picture, x=10, y=10, w=180)
    return bytes(pdf.output())


def png_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, format="PNG")
    return out.getvalue()


LOGIN_PAGE = b"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in</title></head>
<body><form action="/signin" method="post"><input name="email"><button>Sign in</button></form>
</body></html>
"""


def reason_of(exc_info: pytest.ExceptionInfo[ExtractionError]) -> str:
    return exc_info.value.reason


# --- text and Markdown


def test_markdown_keeps_its_text_and_takes_the_first_level_one_heading_as_title() -> None:
    data = b"Intro\r\n\r\n```\r\n# not the title\r\n```\r\n## Sub\r\n# Real Title #\r\nBody\r"
    doc = extract(data, "guide.md")
    assert doc.kind == "md"
    assert doc.text == "Intro\n\n```\n# not the title\n```\n## Sub\n# Real Title #\nBody\n"
    assert doc.title == "Real Title"
    assert doc.page_starts is None


def test_markdown_without_a_level_one_heading_is_titled_by_its_file_name() -> None:
    assert extract(b"## Only a section\n\ntext", "dir/on-call notes.markdown").title == (
        "on-call notes"
    )


@pytest.mark.parametrize(
    ("filename", "kind"),
    [("a.md", "md"), ("a.MARKDOWN", "md"), ("a.txt", "txt"), ("README", "txt")],
)
def test_text_kind_comes_from_the_suffix(filename: str, kind: str) -> None:
    doc = extract(b"# Heading\n\nplain words", filename)
    assert doc.kind == kind
    assert doc.text == "# Heading\n\nplain words"


def test_a_text_file_is_titled_by_its_stem() -> None:
    assert extract(b"hello", "C:\\Users\\me\\Expense policy.txt").title == "Expense policy"


def test_utf8_bom_is_dropped_and_utf16_with_a_bom_is_read() -> None:
    assert extract("\ufeffcafé".encode(), "a.txt").text == "café"
    assert extract("café\r\nbar".encode("utf-16"), "a.txt").text == "café\nbar"


def test_windows_1252_text_is_read_when_it_is_not_utf8() -> None:
    data = "Le café coûte 3 € — voilà.\r\n".encode("cp1252")
    assert extract(data, "menu.txt").text == "Le café coûte 3 € — voilà.\n"


def test_mostly_utf8_with_a_bad_byte_fails_instead_of_turning_into_mojibake() -> None:
    data = "Zürich, Genève, Köln ".encode() * 5 + b"\xff end"
    with pytest.raises(CorruptDocument) as exc:
        extract(data, "cities.txt")
    assert "cities.txt is not valid UTF-8" in reason_of(exc)
    assert "0xff" in reason_of(exc) and "Save it as UTF-8" in reason_of(exc)


def test_undecodable_high_bytes_fail_clearly() -> None:
    with pytest.raises(CorruptDocument, match="not valid UTF-8"):
        extract(bytes(range(0x80, 0x100)) * 4, "weird.md")


@pytest.mark.parametrize("data", [b"   \n\t\r\n  ", "\u00a0\u3000\n".encode()])
def test_whitespace_only_is_empty(data: bytes) -> None:
    with pytest.raises(EmptyDocument, match=r"blank\.txt contains no text"):
        extract(data, "blank.txt")


def test_zero_bytes_is_empty() -> None:
    with pytest.raises(EmptyDocument) as exc:
        extract(b"", "empty.md")
    assert reason_of(exc).startswith("empty.md is empty (0 bytes).")
    assert exc.value.filename == "empty.md"


def test_nul_bytes_in_a_text_file_mean_a_binary_file() -> None:
    with pytest.raises(CorruptDocument, match=r"nul\.txt looks like a binary file"):
        extract(b"hello\x00world\x00" * 100, "nul.txt")
    with pytest.raises(UnsupportedType, match=r"blob\.bin looks like a binary file.*Supported"):
        extract(b"hello\x00world", "blob.bin")


@pytest.mark.parametrize(
    ("filename", "data", "what"),
    [
        ("photo.png", png_bytes(), "a PNG image"),
        ("photo.txt", png_bytes(), "a PNG image"),
        ("scan.jpg", b"\xff\xd8\xff\xe0" + os.urandom(200), "a JPEG image"),
    ],
)
def test_images_and_archives_are_unsupported(filename: str, data: bytes, what: str) -> None:
    with pytest.raises(UnsupportedType) as exc:
        extract(data, filename)
    assert reason_of(exc).startswith(f"{filename} is ")
    assert what in reason_of(exc)
    assert "Supported: Markdown (.md), plain text (.txt), HTML (.html), PDF (.pdf), Word" in (
        reason_of(exc)
    )


def test_size_is_checked_first_and_reported_in_mb() -> None:
    data = b"\x00" * (3 * 1024 * 1024 + 1)  # binary too, but the size speaks first
    with pytest.raises(TooLarge) as exc:
        extract(data, "huge.bin", max_bytes=3 * 1024 * 1024)
    assert reason_of(exc).startswith("huge.bin is 3.1 MB, over the 3 MB upload limit.")
    assert "KB_MAX_UPLOAD_BYTES" in reason_of(exc)
    assert extract(b"x" * 100, "ok.txt", max_bytes=100).text == "x" * 100


def test_a_5mb_single_line_extracts_fast() -> None:
    data = b"word " * 1_000_000
    started = time.process_time()  # CPU time, as the nested pages' guard below
    doc = extract(data, "line.txt")
    assert time.process_time() - started < 2
    assert len(doc.text) == len(data)


_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00<%\ufeff"),
    min_size=1,
    max_size=200,
).filter(lambda s: s.strip())


@settings(max_examples=200, deadline=None)
@given(text=_TEXT, suffix=st.sampled_from([".txt", ".md", ""]))
def test_utf8_text_round_trips_with_normalised_newlines(text: str, suffix: str) -> None:
    doc = extract(text.encode(), "doc" + suffix)
    assert doc.text == text.replace("\r\n", "\n").replace("\r", "\n")
    assert "\r" not in doc.text


# --- HTML


PAGE = b"""<!DOCTYPE html>
<html><head><title>Travel   Policy | Intranet</title><style>p { color: red }</style>
<script>var tracking = "nope";</script></head>
<body><noscript>Enable JavaScript</noscript><template><p>hidden</p></template>
<h1>Travel policy</h1>
<p>Book   flights
   through <b>the portal</b>&nbsp;only.</p>
<!-- an HTML comment -->
<ul><li>Economy class</li><li>Receipts <ul><li>within 30 days</li></ul></li></ul>
<h2>Per diem</h2>
<table><tr><th>City</th><th>Rate</th></tr><tr><td>Paris</td><td>90 &euro;</td></tr></table>
<pre>
# convert currency
rate  =  1.08
</pre>
<p>Line one<br>Line two<br><br>New paragraph</p>
<p># not a heading</p>
</body></html>"""


def test_html_becomes_sections_and_paragraphs() -> None:
    doc = extract(PAGE, "travel.html")
    assert doc.kind == "html"
    assert doc.title == "Travel Policy | Intranet"
    assert doc.text == (
        "# Travel policy\n\n"
        "Book flights through the portal only.\n\n"
        "- Economy class\n\n"
        "- Receipts\n\n"
        "  - within 30 days\n\n"
        "## Per diem\n\n"
        "City | Rate\n\n"
        "Paris | 90 €\n\n"
        "```\n# convert currency\nrate  =  1.08\n```\n\n"
        "Line one\nLine two\n\nNew paragraph\n\n"
        "\\# not a heading"
    )
    for hidden in ("tracking", "color", "Enable JavaScript", "hidden", "comment"):
        assert hidden not in doc.text


def test_html_headings_and_code_reach_the_chunker_as_sections() -> None:
    chunks = chunk_document(extract(PAGE, "travel.html"), budget=60).chunks
    by_section = {c.section: c.content for c in chunks}
    assert "Per diem" in " ".join(by_section)
    code = next(c for c in chunks if "# convert currency" in c.content)
    assert code.section == "Travel policy > Per diem"
    assert code.text.startswith("Travel Policy | Intranet > Travel policy > Per diem\n")


def test_html_is_detected_from_the_content_whatever_the_name() -> None:
    doc = extract(b"  <!-- saved -->\n<html><body><p>Hi</p></body></html>", "page.txt")
    assert (doc.kind, doc.text, doc.title) == ("html", "Hi", "page")
    h1_title = extract(b"<body><h1>Main  heading</h1><p>x</p></body>", "x.md").title
    assert h1_title == "Main heading"
    fragment = extract(b"<p>Just a fragment</p>", "frag.htm")
    assert (fragment.kind, fragment.text) == ("html", "Just a fragment")


def test_markdown_that_mentions_html_stays_markdown() -> None:
    doc = extract(b"# Tags\n\nUse <html> and <body> tags.", "tags.md")
    assert doc.kind == "md"


def test_a_heading_left_open_does_not_swallow_the_page() -> None:
    doc = extract(
        b"<html><body><h2>Title</h3><p>Body text.</p><p>More.</p></body></html>", "b.html"
    )
    assert doc.text == "## Title\n\nBody text.\n\nMore."
    nested = extract(b"<html><body><h2><div>Wrapped</div></h2><p>x</p></body></html>", "n.html")
    assert nested.text == "## Wrapped\n\nx"


def test_html_without_visible_text_is_empty() -> None:
    page = b"<!doctype html><html><head><title>T</title><script>x()</script></head><body> </body></html>"
    with pytest.raises(EmptyDocument, match=r"empty\.html is an HTML page with no visible text"):
        extract(page, "empty.html")


@pytest.mark.parametrize("tag", ["div", "b"])
def test_pathologically_nested_html_is_read_without_recursion(tag: str) -> None:
    depth = 50_000
    page = f"<html><body>{f'<{tag}>' * depth}deep text{f'</{tag}>' * depth}</body></html>"
    # This process's CPU time, not the clock's: a recursive or quadratic reader takes
    # minutes of it, while other work on a shared machine only stretches the wall clock.
    started = time.process_time()
    doc = extract(page.encode(), "deep.html")
    assert time.process_time() - started < 10
    assert "deep text" in doc.text


_TAGS = ["<p>", "</p>", "<div>", "</div>", "<h2>", "</h2>", "<li>", "<ul>", "</ul>", "<br>",
         "<pre>", "</pre>", "<td>", "<tr>", "<script>", "</script>", "<!--", "-->", "&amp;",
         "# ", "```", "\n", " ", "text", "more words.", "<b>", "</b>", "<", ">"]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.sampled_from(_TAGS), max_size=40))
@example(parts=["<ul>", "<ul>", "<li>", "<!--"])  # a nested item first: no leading indent
def test_any_tag_soup_extracts_or_fails_cleanly(parts: list[str]) -> None:
    try:
        doc = extract(("<html><body>" + "".join(parts)).encode(), "soup.html")
    except EmptyDocument:
        return
    assert doc.kind == "html" and doc.text.strip() == doc.text
    chunks = chunk_document(doc).chunks
    assert all(doc.text[c.start : c.end] == c.content for c in chunks)


# --- PDF


def test_pdf_pages_are_joined_and_mapped() -> None:
    data = pdf_bytes(["Page one text.", "Page two text.", "Page three."], title="Q3 Report")
    doc = extract(data, "report.pdf")
    assert (doc.kind, doc.title) == ("pdf", "Q3 Report")
    assert doc.page_starts is not None and doc.page_starts[0] == 0 and len(doc.page_starts) == 3
    ends = [*doc.page_starts[1:], len(doc.text)]
    texts = [doc.text[s:e] for s, e in zip(doc.page_starts, ends, strict=True)]
    assert [t.strip() for t in texts] == ["Page one text.", "Page two text.", "Page three."]
    assert "\r" not in doc.text
    pages = [c.page for c in chunk_document(doc, budget=15).chunks]
    assert pages == [1, 2, 3]


def test_pdf_without_a_metadata_title_uses_its_first_line() -> None:
    doc = extract(pdf_bytes(["  \nHoliday calendar 2025\nJanuary 1"]), "cal.pdf")
    assert doc.title == "Holiday calendar 2025"


def test_a_pdf_named_as_text_is_still_a_pdf() -> None:
    assert extract(pdf_bytes(["Hello"]), "download.txt").kind == "pdf"


def test_a_pdf_after_some_junk_is_a_pdf_but_a_note_about_pdfs_is_text() -> None:
    assert extract(b"junk\n" + pdf_bytes(["Hello"]), "j.pdf").kind == "pdf"
    note = extract(b"# PDF\n\nA PDF file starts with %PDF-1.7 and a binary line.", "pdf.md")
    assert note.kind == "md"


def test_an_html_login_page_saved_as_pdf_is_corrupt() -> None:
    with pytest.raises(CorruptDocument) as exc:
        extract(LOGIN_PAGE, "report.pdf")
    assert reason_of(exc).startswith(
        "report.pdf is an HTML page, not a PDF (a login page saved instead of the file?)"
    )


def test_random_bytes_named_pdf_are_corrupt() -> None:
    with pytest.raises(CorruptDocument, match=r"random\.pdf is not a PDF"):
        extract(os.urandom(4096), "random.pdf")


def test_a_truncated_pdf_is_corrupt() -> None:
    data = pdf_bytes(["Quarterly numbers for the sales team. " * 40, "Second page. " * 40])
    for cut in (len(data) // 3, len(data) - 20):
        with pytest.raises(CorruptDocument, match=r"truncated\.pdf is truncated"):
            extract(data[:cut], "truncated.pdf")


def test_a_damaged_pdf_is_corrupt_and_the_pypdf_error_does_not_leak() -> None:
    data = b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 9 0 R >> endobj\ntrailer <<>>\n%%EOF\n"
    with pytest.raises(CorruptDocument) as exc:
        extract(data, "broken.pdf")
    assert reason_of(exc).startswith("broken.pdf is a damaged PDF that could not be read")
    assert exc.value.__cause__ is not None


def test_a_pdf_with_an_owner_password_only_is_read() -> None:
    assert "Open to all" in extract(rc4_pdf(["Open to all"], user_password=""), "a.pdf").text
    pytest.importorskip("cryptography")
    assert "AES too" in extract(aes_pdf(["AES too"], user_password=""), "b.pdf").text


def test_a_pdf_with_a_user_password_is_refused() -> None:
    with pytest.raises(CorruptDocument, match=r"locked\.pdf is password-protected"):
        extract(rc4_pdf(["Merger plans"], user_password="secret"), "locked.pdf")


def test_an_aes_pdf_without_the_crypto_package_fails_clearly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pypdf.errors import DependencyError

    def no_aes(self: PdfReader, password: str) -> int:
        raise DependencyError("cryptography is required for AES algorithm")

    monkeypatch.setattr(PdfReader, "decrypt", no_aes)
    with pytest.raises(CorruptDocument, match=r"aes\.pdf is encrypted with AES") as exc:
        extract(rc4_pdf(["x"], user_password=""), "aes.pdf")
    assert isinstance(exc.value.__cause__, DependencyError)


def test_a_blank_scan_has_no_text_even_by_ocr() -> None:
    with pytest.raises(EmptyDocument) as exc:
        extract(scanned_pdf(), "scan.pdf")
    assert reason_of(exc).startswith("scan.pdf has no text layer, and OCR found no text")


# --- stamps


def test_version_and_suffixes() -> None:
    assert isinstance(EXTRACTOR_VERSION, str) and EXTRACTOR_VERSION
    assert {".md", ".txt", ".html", ".pdf"} <= set(SUPPORTED_SUFFIXES)
