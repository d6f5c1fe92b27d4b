"""Seconds per page of scanned PDFs read by OCR, beside the same pages with a text layer.

Each page is a picture of about 40 lines of rendered text (Pillow, grey-scale,
at 150 and at 300 dpi, as scanners write them), put into a PDF; the same text is
also written as a PDF with a text layer (fpdf2). ``index.ingest.extract.extract`` reads
each PDF ``--rounds`` times, side by side in one run; the medians per page are
printed with the machine. The 150 dpi scan is also read with Tesseract limited
to one OpenMP thread (``OMP_THREAD_LIMIT=1``), which matters on a busy machine.

Run: python -m bench.ocr [--pages 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

from fpdf import FPDF
from PIL import Image, ImageDraw, ImageFont

from bench.machine import describe as machine
from index.ingest.extract import extract

LINES = [
    f"{i + 1}. Expense claims above {50 * (i + 1)} euros need a receipt and a manager's approval."
    for i in range(40)
]


def scanned_pdf(pages: int, dpi: int) -> bytes:
    """``pages`` A4 pages, each one picture of ``LINES`` at ``dpi``."""
    scale = dpi / 150
    width, height = int(1240 * scale), int(1754 * scale)
    font = ImageFont.load_default(size=int(22 * scale))
    images = []
    for _ in range(pages):
        page = Image.new("L", (width, height), color=255)
        draw = ImageDraw.Draw(page)
        for i, line in enumerate(LINES):
            draw.text((int(90 * scale), int((100 + i * 38) * scale)), line, fill=0, font=font)
        images.append(page)
    out = io.BytesIO()
    images[0].save(out, format="PDF", resolution=dpi, save_all=True, append_images=images[1:])
    return out.getvalue()


def text_pdf(pages: int) -> bytes:
    """The same pages with a text layer."""
    pdf = FPDF()
    pdf.set_font("Helvetica", size=9)
    for _ in range(pages):
        pdf.add_page()
        pdf.multi_cell(0, 6, "\n".join(LINES))
    return bytes(pdf.output())


def per_page(data: bytes, pages: int, rounds: int) -> float:
    """Median seconds per page of extracting ``data``."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        extracted = extract(data, "bench.pdf")
        times.append((time.perf_counter() - start) / pages)
        assert extracted.page_starts is not None and len(extracted.page_starts) == pages
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pages", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"machine: {machine()}")
    print(f"{args.pages} pages of {len(LINES)} lines, median of {args.rounds} rounds\n")
    print("| PDF | seconds per page |")
    print("|---|---|")
    scan = scanned_pdf(args.pages, 150)
    inputs = [
        ("text layer (no OCR)", text_pdf(args.pages), None),
        ("scanned, 150 dpi (OCR)", scan, None),
        ("scanned, 150 dpi (OCR), OMP_THREAD_LIMIT=1", scan, "1"),
        ("scanned, 300 dpi (OCR)", scanned_pdf(args.pages, 300), None),
    ]
    for label, data, threads in inputs:
        # Tesseract runs as a child process and reads its thread limit from the environment.
        os.environ.pop("OMP_THREAD_LIMIT", None)
        if threads:
            os.environ["OMP_THREAD_LIMIT"] = threads
        print(f"| {label} | {per_page(data, args.pages, args.rounds):.3f} |")


if __name__ == "__main__":
    main()
