"""Builders of real document bytes for tests: PDFs (text, encrypted, image-only), bad files."""

from __future__ import annotations

import functools
import io
import os

from fpdf import FPDF
from pypdf import PdfReader, PdfWriter


def text_pdf(pages: list[str], *, title: str = "Test PDF") -> bytes:
    """A real PDF with a text layer, one string per page."""
    pdf = FPDF()
    pdf.set_title(title)
    pdf.set_font("Helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    return bytes(pdf.output())


def encrypted_pdf(pages: list[str], *, user_password: str = "secret") -> bytes:
    """A PDF that needs a password to open."""
    reader = PdfReader(io.BytesIO(text_pdf(pages)))
    writer = PdfWriter()
    for page in reader.pages:
        writer.add_page(page)
    writer.encrypt(user_password=user_password, owner_password="owner", algorithm="AES-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def image_only_pdf() -> bytes:
    """A PDF whose page is only drawn shapes: no text layer (like a scan)."""
    pdf = FPDF()
    pdf.add_page()
    pdf.set_fill_color(30, 30, 30)
    for i in range(10):
        pdf.rect(20, 20 + i * 20, 150, 10, style="F")
    return bytes(pdf.output())


LOGIN_PAGE = b"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Slack</title></head>
<body><form action="/signin" method="post"><input name="email"><button>Sign in</button></form></body></html>
"""


@functools.cache
def bad_inputs() -> dict[str, tuple[str, bytes]]:
    """Named bad files: (filename, bytes)."""
    good_pdf = text_pdf(["Quarterly numbers for the sales team. " * 20, "Second page. " * 30])
    return {
        "zero_bytes": ("empty.md", b""),
        "random_pdf": ("random.pdf", os.urandom(4096)),
        "truncated_pdf": ("truncated.pdf", good_pdf[: len(good_pdf) // 3]),
        "encrypted_pdf": ("locked.pdf", encrypted_pdf(["Top secret plans for the merger."])),
        "image_only_pdf": ("scan.pdf", image_only_pdf()),
        "nul_bytes": ("nul.txt", b"hello\x00world\x00" * 100),
        "login_page_as_pdf": ("report.pdf", LOGIN_PAGE),
        "unknown_type": ("archive.zip", b"PK\x03\x04" + os.urandom(2000)),
        "only_headings": ("headings.md", b"# Title\n\n## Section A\n\n## Section B\n\n### Sub\n"),
        "whitespace_only": ("blank.txt", b"   \n\n\t \n"),
    }
