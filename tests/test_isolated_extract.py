"""Untrusted documents are read in reader processes with memory and time limits.

The files are real: an honest but big markdown file against a low memory
limit, an honest PDF of many pages against a one-second time limit, and an xlsx
whose one large shared string fills a thousand cells (a gigabyte of text from
half a megabyte), read by the product's own knowledge base with its limits set
through its configuration.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
from fpdf import FPDF
from PIL import Image, ImageDraw, ImageFont
from pypdf import PdfReader, PdfWriter

from index.config import ExtractLimits, IndexConfig, OcrConfig
from index.embed import Embedder
from index.errors import ReaderRefused
from index.ingest.isolated import (
    ReaderPool,
    _Job,
    _reader_env,
    memory_reason,
    message_cap,
    over_reading_limit,
    reader_pool,
    time_reason,
)
from index.knowledge_base import KnowledgeBase
from index.models import DocState, Extracted
from tests.docs_factory import text_pdf
from tests.environment import cannot_run_here, unshare_reason

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


def _dense_scan(pages: int, mark: str = "") -> bytes:
    """A scan of ``pages`` full 300 dpi pages of small print: seconds of Tesseract each
    (``mark`` on every line: two scans of other marks are other files)."""
    images = []
    font = ImageFont.load_default(size=30)
    for p in range(pages):
        page = Image.new("L", (2480, 3508), color=255)
        draw = ImageDraw.Draw(page)
        for i in range(90):
            line = f"Page {p + 1} line {i}{mark}: taxi receipts go to Jonas Berg by the fifth day."
            draw.text((120, 120 + i * 36), line, fill=0, font=font)
        images.append(page)
    out = io.BytesIO()
    images[0].save(out, format="PDF", resolution=300, save_all=True, append_images=images[1:])
    return out.getvalue()


@pytest.mark.skipif(not Path("/usr/bin/tesseract").exists(), reason="needs Tesseract")
def test_tesseracts_time_is_paid_from_the_documents_time_limit(
    tmp_path: Path, embedder: Embedder
) -> None:
    kb = _kb(tmp_path, embedder, timeout=1)
    doc = kb.add_bytes(_dense_scan(3), "scan.pdf", uploader="U1").document
    started = time.monotonic()
    row = kb.index_document(doc.id)
    took = time.monotonic() - started
    # Not one page of small print is read in a second: the clock ran through OCR.
    assert row.state == DocState.FAILED
    assert (row.failure_kind, row.failure_limit) == ("time", 1.0)
    assert (row.failure_reason or "").startswith("scan.pdf took longer than 1 s to read")
    assert took < 10  # three pages of small print were read to the end before, OCR uncounted


def test_reindex_skips_documents_over_a_reading_limit_until_it_is_raised(
    tmp_path: Path, embedder: Embedder
) -> None:
    kb = _kb(tmp_path, embedder, timeout=1)
    slow = kb.add_bytes(long_pdf(), "manual.pdf", uploader="U1").document
    failed = kb.index_document(slow.id)
    assert failed.state == DocState.FAILED
    assert (failed.failure_kind, failed.failure_limit) == ("time", 1.0)
    kb.ingest_bytes(b"# Lunch\n\nLunch is served at noon.\n", "lunch.md")

    report = kb.reindex()
    assert [s.document.id for s in report.skipped] == [slow.id]
    assert "not read again" in report.skipped[0].reason
    assert "took longer than 1 s to read" in report.skipped[0].reason
    assert report.documents == 1 and not report.failed
    assert kb.document(slow.id).state == DocState.FAILED


def test_reindex_decides_by_the_stored_kind_and_limit_never_by_the_reason(
    tmp_path: Path, embedder: Embedder
) -> None:
    kb = _kb(tmp_path, embedder, timeout=60)
    limits = kb.config.extract
    assert limits is not None
    named = kb.add_bytes(b"Badges are renewed in May.\n", "named.txt", uploader="U1").document
    plain = kb.add_bytes(b"Parking is free on Sundays.\n", "plain.txt", uploader="U1").document
    # A reason that reads like a time limit (a name can say anything), stored as corrupt...
    kb.store.update_document(
        named.id,
        state="failed",
        failure_reason=time_reason("x.pdf", limits),
        failure_kind="corrupt",
    )
    # ...and a plain sentence stored as a time limit of 60 s, the limit now.
    kb.store.update_document(
        plain.id, state="failed", failure_reason="It failed.", failure_kind="time", failure_limit=60
    )
    report = kb.reindex()
    assert [s.document.id for s in report.skipped] == [plain.id]
    assert kb.document(named.id).state == DocState.INDEXED


def test_a_reading_limit_failure_is_known_until_the_limit_is_raised() -> None:
    limits = ExtractLimits(memory_mb=512, timeout=60)
    assert over_reading_limit("memory", 512, limits) and over_reading_limit("time", 60, limits)
    assert over_reading_limit("crash", 512, limits)
    assert over_reading_limit("memory", 512, ExtractLimits(memory_mb=256, timeout=60))
    assert not over_reading_limit("memory", 512, ExtractLimits(memory_mb=1024, timeout=60))
    assert not over_reading_limit("time", 60, ExtractLimits(memory_mb=512, timeout=120))
    assert over_reading_limit("ocr_time", 5, limits, OcrConfig(page_timeout=5))
    assert not over_reading_limit("ocr_time", 5, limits, OcrConfig(page_timeout=10))
    # Other failures are read again: the bytes may read now (a fix, a new version).
    assert not over_reading_limit("corrupt", None, limits)
    assert not over_reading_limit("pages", 2000, limits)
    assert not over_reading_limit(None, None, limits)
    assert memory_reason("a.xlsx", limits).startswith("a.xlsx needed more than 512 MB")


_NO_SANDBOX = ExtractLimits(timeout=30, sandbox="off")


def _read(pool: ReaderPool, data: bytes, filename: str, owner: str = "") -> Extracted:
    return pool.read(
        data,
        filename,
        limits=_NO_SANDBOX,
        max_bytes=10**6,
        max_pages=10,
        max_text_chars=1_000,
        ocr=None,
        owner=owner,
    )


@pytest.mark.parametrize(
    ("reader", "refused"),
    [
        ("pickled", "a message that is not JSON"),
        ("malformed", "a message that is not JSON"),
        ("big", f"a message of more than {message_cap(1_000, 10):,} bytes"),
        ("wrong_shape", "a text of the wrong shape"),
        ("wrong_error", "a message of the wrong shape (a list of 5 'error')"),
    ],
)
def test_a_reader_that_sends_anything_but_a_checked_json_message_is_refused_unread(
    tmp_path: Path, reader: str, refused: str
) -> None:
    created = tmp_path / "created-by-unpickling"
    pool = ReaderPool(1, serve_with=f"tests.hostile_readers:{reader}")
    try:
        with pytest.raises(ReaderRefused) as exc:
            _read(pool, b"Badges are renewed in May.", str(created))
        # The reader that sent it is gone; the next document gets a new one.
        assert pool.reading() == 0
    finally:
        pool.close()
    assert refused in exc.value.reason
    assert "which a reader never sends" in exc.value.reason
    assert exc.value.kind == "reader"
    assert not created.exists(), "the server ran what the reader sent"


def test_a_job_and_its_text_cross_the_pipe_as_data() -> None:
    job = _Job(b"\x00\xff", "a.pdf", 10, 2, 100, OcrConfig(page_timeout=3), 64, 1.5)
    assert _Job.from_messages(job.head(), job.data) == job
    pool = ReaderPool(1)
    try:
        extracted = _read(pool, b"# Guide\n\nBadges at 09:30.\n", "guide.md")
    finally:
        pool.close()
    assert extracted == Extracted(text="# Guide\n\nBadges at 09:30.\n", title="Guide", kind="md")
    pool = ReaderPool(1)
    try:
        paged = _read(pool, text_pdf(["Badges at 09:30.", "Lunch at noon."]), "two.pdf")
    finally:
        pool.close()
    assert paged.kind == "pdf" and paged.page_starts is not None and len(paged.page_starts) == 2


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def test_a_small_file_is_read_while_two_people_hold_every_reader_with_slow_ones(
    tmp_path: Path,
) -> None:
    pool = ReaderPool(2, serve_with="tests.hostile_readers:held")
    slow = [_fifo(tmp_path / "slow-1.pdf"), _fifo(tmp_path / "slow-2.pdf")]
    readers = [
        threading.Thread(target=_read, args=(pool, b"x" * 200_000, str(path), owner))
        for path, owner in zip(slow, ("U1", "U2"), strict=True)
    ]
    try:
        for reader in readers:
            reader.start()
        # Opening a FIFO waits for its reader: both slow documents are being read now,
        # and stay so until the test closes them.
        holds = [open(path, "w") for path in slow]  # noqa: SIM115
        assert pool.reading() == 2
        small: dict[str, Extracted] = {}
        third = threading.Thread(
            target=lambda: small.update(
                done=_read(pool, b"Lunch is at noon." * 3, "lunch.txt", "U3")
            )
        )
        third.start()
        third.join(30)
        assert "done" in small, "the small file waited for the slow ones"
        assert small["done"].text == "Lunch is at noon." * 3
        assert all(reader.is_alive() for reader in readers)
        # A big file of a third person is not read in the quick lane: it waits its turn.
        big = threading.Thread(target=_read, args=(pool, b"y" * 100_000, "big.txt", "U3"))
        big.start()
        deadline = time.monotonic() + 30
        while pool.waiting() == 0:
            assert time.monotonic() < deadline and big.is_alive()
            time.sleep(0.01)
        assert pool.reading() == 2
        for hold in holds:
            hold.close()
        for thread in (*readers, big):
            thread.join(30)
            assert not thread.is_alive()
    finally:
        pool.close()


def _opened_by_a_reader(path: Path) -> int | None:
    """The write end of the FIFO ``path`` if a reader has it open to read, else ``None``."""
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: nobody reads it yet
        return None


def test_a_freed_reader_goes_to_the_person_holding_fewest(tmp_path: Path) -> None:
    pool = ReaderPool(3, serve_with="tests.hostile_readers:held")  # at most 2 a person
    names = ("u1-a", "u2-a", "u2-b", "u1-b", "u3-a")
    fifo = {name: _fifo(tmp_path / name) for name in names}
    threads = {
        name: threading.Thread(target=_read, args=(pool, b"z" * 100_000, str(path), name[:2]))
        for name, path in fifo.items()
    }
    opened: dict[str, int] = {}

    def hold(name: str) -> None:
        deadline = time.monotonic() + 30
        while (fd := _opened_by_a_reader(fifo[name])) is None:
            assert time.monotonic() < deadline, f"{name} was never read"
            time.sleep(0.01)
        opened[name] = fd

    try:
        for name in ("u1-a", "u2-a", "u2-b"):  # u1 holds one reader, u2 two: the pool is full
            threads[name].start()
            hold(name)
        for name in ("u1-b", "u3-a"):  # u1 asks first, then u3, who holds none
            threads[name].start()
            deadline = time.monotonic() + 30
            while pool.waiting() < ("u1-b", "u3-a").index(name) + 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        os.close(opened.pop("u2-a"))  # one of u2's documents is read: a reader is free
        hold("u3-a")
        assert _opened_by_a_reader(fifo["u1-b"]) is None  # u1 already holds one: it waits
        assert pool.waiting() == 1
    finally:
        for fd in opened.values():
            os.close(fd)
        hold("u1-b")
        os.close(opened.pop("u1-b"))
        for thread in threads.values():
            thread.join(30)
        pool.close()
    assert not any(thread.is_alive() for thread in threads.values())


def test_tesseract_in_a_reader_runs_one_thread_unless_the_operator_set_a_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Tesseract's OpenMP threads in each reader would fight the pool's other readers.
    monkeypatch.delenv("OMP_THREAD_LIMIT", raising=False)
    assert _reader_env("/root-of-the-code")["OMP_THREAD_LIMIT"] == "1"
    monkeypatch.setenv("OMP_THREAD_LIMIT", "3")
    assert _reader_env("/root-of-the-code")["OMP_THREAD_LIMIT"] == "3"


_HOLDS_A_READER = """
import sys
from index.config import ExtractLimits
from index.ingest.isolated import read_isolated
read_isolated(b"# Hours\\n\\nEight to six.", "hours.md", limits=ExtractLimits(workers=1),
              max_bytes=10**6, max_pages=10)
print("read", flush=True)
sys.stdin.read()
"""


def _holding_a_reader(tmp_path: Path, *wrapper: str) -> subprocess.Popen[bytes]:
    """A process (run by ``wrapper``) that has read a document and holds its reader."""
    held = subprocess.Popen(
        [*wrapper, sys.executable, "-c", _HOLDS_A_READER],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert held.stdout is not None and held.stdout.readline() == b"read\n"
    return held


def test_a_killed_process_readers_directory_is_removed_by_the_next_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A killed server cannot remove its readers' directories: the next one on the host does.
    killed = _holding_a_reader(tmp_path)
    left = [p for p in tmp_path.iterdir() if f"-{killed.pid}-" in p.name]
    assert len(left) == 1 and left[0].is_dir()
    (left[0] / "page-1.png").write_bytes(b"\x89PNG" + bytes(1000))  # as Tesseract leaves
    killed.kill()
    killed.wait()
    # This process's own reader directory, another host's and a link stay.
    own = tmp_path / left[0].name.replace(f"-{killed.pid}-", f"-{os.getpid()}-")
    own.mkdir()
    other_host = tmp_path / f"kb-reader-00000000-{killed.pid}-abc"
    other_host.mkdir()
    link = tmp_path / left[0].name.replace(f"-{killed.pid}-", f"-{killed.pid}-link")
    link.symlink_to(own)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    pool = ReaderPool(1)
    pool.close()

    assert not left[0].exists()
    assert own.is_dir() and other_host.is_dir() and link.is_symlink()


def test_a_process_in_another_pid_namespace_leaves_this_ones_readers_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server in a container (its own pid namespace, the same temporary directory) sees
    # none of this host's processes: it must not take this one's readers for killed ones.
    if (reason := unshare_reason()) is not None:
        cannot_run_here(reason)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pool = ReaderPool(1)
    try:
        _read(pool, b"# Hours\n\nEight to six.", "hours.md", "u1")
        ours = list(tmp_path.glob("kb-reader-*"))
        assert len(ours) == 1  # the warm reader's, while it waits for the next document

        subprocess.run(
            ["unshare", "--pid", "--fork", sys.executable, "-c", _STARTS_A_POOL],
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "TMPDIR": str(tmp_path)},
            check=True,
        )

        assert ours[0].is_dir()
        assert "Monday" in _read(pool, b"# Days\n\nMonday to Friday.", "days.md", "u1").text
    finally:
        pool.close()
    assert not ours[0].exists()


_STARTS_A_POOL = "from index.ingest.isolated import ReaderPool; ReaderPool(1).close()"
