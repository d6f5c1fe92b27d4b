"""A document reader cannot reach the server's secrets, its files or the network.

A parser exploit in a reader runs whatever code the document carries; to show
what that code could do, ``tests/sandbox_probe.py`` is started the way the server
starts a reader (interpreter, working directory, environment, the confinement
``ReaderSandbox`` builds for it) and tries: read a data dir's secrets, write
beside them, run a program, reach a port, a UNIX socket or another process. Each
attempt is made once unconfined too, so a probe that could not have succeeded
proves nothing. Real documents (a PDF, a Word file, a scanned page read by
Tesseract) are still read in there, and through the real reader pool.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import docx
import pytest
from PIL import Image, ImageDraw, ImageFont
from pydantic import ValidationError

from index.config import ExtractLimits, IndexConfig, OcrConfig
from index.embed import Embedder
from index.ingest.isolated import ReaderPool, _reader_env
from index.ingest.sandbox import MAX_FILE_BYTES, ReaderSandbox, kernel_support
from index.knowledge_base import KnowledgeBase
from tests.conftest_bot import BotFactory, make_settings
from tests.docs_factory import text_pdf
from tests.environment import cannot_run_here

ROOT = Path(__file__).resolve().parents[1]
SECRET = "xoxb-canary-reader-must-not-see"


@pytest.fixture(autouse=True)
def _landlock() -> None:
    if not kernel_support().landlock_abi:
        cannot_run_here(f"readers cannot be confined here: {kernel_support().reason}")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data dir as the server keeps one, its secrets canaries."""
    data = tmp_path / "kb-data"
    data.mkdir()
    (data / "link-secret").write_text(SECRET)
    (data / "kb.sqlite").write_text(f"SQLite format 3 {SECRET}")
    (tmp_path / ".env").write_text(f"SLACK_BOT_TOKEN={SECRET}\n")
    return data


def _probe(temp_dir: Path, attempts: list[list[Any]], *, confined: bool) -> list[dict[str, Any]]:
    """Run the attempts in a process started and confined as a reader is."""
    confinement = ReaderSandbox("required").confinement(str(temp_dir)) if confined else None
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.sandbox_probe",
            confinement.to_json() if confinement else "",
            json.dumps(attempts),
        ],
        cwd=ROOT,
        env={**_reader_env(str(ROOT)), "TMPDIR": str(temp_dir)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    outcomes: list[dict[str, Any]] = json.loads(done.stdout)
    return outcomes


def _scan(line: str) -> bytes:
    page = Image.new("L", (1240, 400), color=255)
    ImageDraw.Draw(page).text((60, 150), line, fill=0, font=ImageFont.load_default(size=40))
    out = io.BytesIO()
    page.save(out, format="PDF", resolution=150)
    return out.getvalue()


def _word(text: str) -> bytes:
    document = docx.Document()
    document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_a_reader_cannot_read_write_run_or_connect_beyond_what_reading_needs(
    tmp_path: Path, data_dir: Path
) -> None:
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix_path = str(tmp_path / "server.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    unix.listen()
    abstract_name = f"kb-test-{os.getpid()}-{tmp_path.name}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + abstract_name)
    abstract.listen()
    outside = tmp_path / "outside"
    outside.mkdir()
    attempts = [
        ["read", str(data_dir / "link-secret")],
        ["read", str(data_dir / "kb.sqlite")],
        ["read", str(tmp_path / ".env")],
        ["read", str(ROOT / "pyproject.toml")],  # the checkout beyond the index package
        ["read", f"/proc/{os.getpid()}/environ"],  # the server's environment
        ["list", str(data_dir)],
        ["write", str(data_dir / "planted")],
        ["write", str(outside / "planted")],
        ["exec", "/bin/sh"],
        ["tcp", tcp.getsockname()[1]],
        ["tcp_early", tcp.getsockname()[1]],
        ["udp", udp.getsockname()[1]],
        ["unix", unix_path],
        ["abstract_early", abstract_name],
        ["signal", os.getpid()],
    ]
    temp_dir = tmp_path / "reader-temp"
    temp_dir.mkdir()
    own = [["write", str(temp_dir / "page.png")], ["read", str(temp_dir / "page.png")]]

    unconfined = _probe(temp_dir, [*attempts, *own], confined=False)
    assert [o for o in unconfined if "ok" not in o] == [], "each attempt works unconfined"
    assert SECRET in unconfined[0]["ok"]
    (data_dir / "planted").unlink()
    (outside / "planted").unlink()
    tcp.accept()[0].close()  # the unconfined connections, taken before the confined run
    tcp.accept()[0].close()
    unix.accept()[0].close()
    abstract.accept()[0].close()
    udp.recvfrom(100)

    confined = _probe(temp_dir, [*attempts, *own], confined=True)
    outcomes = dict(zip([f"{kind} {arg}" for kind, arg in attempts], confined, strict=False))
    assert {k: o for k, o in outcomes.items() if o.get("errno") not in ("EACCES", "EPERM")} == {}
    assert confined[len(attempts) :] == [
        {"ok": str(temp_dir / "page.png")},
        {"ok": "written by a reader"},
    ], "its own temporary directory stays writable"
    assert not (data_dir / "planted").exists() and not (outside / "planted").exists()
    for server in (tcp, unix, abstract, udp):
        server.setblocking(False)
    for listening in (tcp, unix, abstract):
        with pytest.raises(BlockingIOError):
            listening.accept()
    with pytest.raises(BlockingIOError):
        udp.recvfrom(100)


def test_a_reader_cannot_run_a_program_it_wrote(tmp_path: Path) -> None:
    temp_dir = tmp_path / "reader-temp"
    temp_dir.mkdir()
    attempt = [["write_and_exec", str(temp_dir / "payload")]]
    assert _probe(temp_dir, attempt, confined=False) == [{"ok": 0}]
    assert _probe(temp_dir, attempt, confined=True) == [{"errno": "EACCES"}]


def test_a_confined_reader_still_reads_pdf_word_and_scanned_pages(tmp_path: Path) -> None:
    temp_dir = tmp_path / "reader-temp"
    temp_dir.mkdir()
    documents = {
        "policy.pdf": text_pdf(["Taxi receipts go to Jonas Berg."]),
        "badges.docx": _word("Badges are collected at 09:30."),
    }
    if shutil.which(OcrConfig().tesseract_cmd):
        documents["scan.pdf"] = _scan("Lunch is served at noon.")
    else:
        cannot_run_here("Tesseract is not installed: the scanned page is not read")
    for name, data in documents.items():
        (temp_dir / name).write_bytes(data)
    attempts = [["extract", [str(temp_dir / name), name]] for name in documents]

    texts = [o.get("ok") or o for o in _probe(temp_dir, attempts, confined=True)]
    assert "Taxi receipts go to Jonas Berg." in texts[0]
    assert "Badges are collected at 09:30." in texts[1]
    assert "[page 1: text read by OCR]" in texts[2] and "noon" in texts[2]


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def test_the_pool_reads_with_confined_readers_and_removes_their_temporary_directories() -> None:
    pool = ReaderPool(1)
    before = set(Path(tempfile.gettempdir()).glob("kb-reader-*"))
    extracted = pool.read(
        _word("Expense reports are due on Fridays."),
        "expenses.docx",
        limits=ExtractLimits(),  # the default: auto
        max_bytes=10**6,
        max_pages=10,
        max_text_chars=10**6,
        ocr=OcrConfig(),
    )
    assert "Expense reports are due on Fridays." in extracted.text
    (reader,) = pool._idle
    status = _status(reader.proc.pid)
    # Seen from outside: the reader gained no privilege and runs under a seccomp filter,
    # with no core dump, no file over a gigabyte and a few hundred files open at most.
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
    limits = Path(f"/proc/{reader.proc.pid}/limits").read_text()
    assert re.search(r"Max core file size\s+0\s+0\s", limits)
    assert re.search(rf"Max file size\s+{MAX_FILE_BYTES}\s+{MAX_FILE_BYTES}\s", limits)
    assert re.search(r"Max open files\s+256\s+256\s", limits)
    # Other tests' readers may start at the same time: this reader's is one of the new ones.
    temp_dir = Path(reader.temp_dir)
    assert temp_dir in set(Path(tempfile.gettempdir()).glob("kb-reader-*")) - before
    assert reader.proc.pid and temp_dir.is_dir()
    pool.close()
    assert not temp_dir.exists(), "a stopped reader's temporary directory is removed"


def test_without_landlock_auto_reads_unconfined_and_says_why_required_refuses() -> None:
    document = base64.b64encode(b"# Notes\n\nThe office opens at eight.\n").decode()
    done = subprocess.run(
        [sys.executable, "-m", "tests.sandbox_probe", "--without-landlock", document],
        cwd=ROOT,
        env=_reader_env(str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    by_mode = json.loads(done.stdout)

    auto = by_mode["auto"]
    assert auto["read"] == {"text": "# Notes\n\nThe office opens at eight.\n"}
    assert auto["status"]["confined"] is False and auto["status"]["landlock_abi"] == 0
    assert "has no Landlock" in auto["status"]["reason"]
    assert "not confined" in auto["status"]["summary"]

    required = by_mode["required"]
    assert required["read"]["error"] == "ReadersUnconfined"
    assert "KB_READER_SANDBOX is required" in required["read"]["reason"]
    assert "has no Landlock" in required["read"]["reason"]
    assert required["status"]["summary"].startswith("documents are not read")

    off = by_mode["off"]
    assert off["read"] == auto["read"]
    assert off["status"]["reason"] == "KB_READER_SANDBOX is off"


def test_the_setting_reaches_the_readers_and_a_wrong_value_is_refused_by_name() -> None:
    assert make_settings(reader_sandbox="required").index_config().extract == ExtractLimits(
        sandbox="required"
    )
    assert make_settings().index_config().extract.sandbox == "auto"  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="KB_READER_SANDBOX"):
        make_settings(reader_sandbox="sometimes")


def test_kb_status_says_what_the_readers_are_held_to(tmp_path: Path, embedder: Embedder) -> None:
    config = IndexConfig(data_dir=tmp_path / "kb", extract=ExtractLimits(sandbox="required"))
    facts = KnowledgeBase(config, embedder=embedder).status()["reader_sandbox"]
    assert facts["mode"] == "required" and facts["confined"] is True
    assert facts["landlock_abi"] == kernel_support().landlock_abi
    assert facts["summary"].startswith("document readers are confined")
    off = IndexConfig(data_dir=tmp_path / "kb", extract=ExtractLimits(sandbox="off"))
    facts = KnowledgeBase(off, embedder=embedder).status()["reader_sandbox"]
    assert facts["confined"] is False and facts["reason"] == "KB_READER_SANDBOX is off"


async def test_the_server_says_at_start_and_in_readyz_whether_readers_are_confined(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="bot.app"):
        bot = await make_bot(reader_sandbox="off")
    said = [r.getMessage() for r in caplog.records if r.name == "bot.app"]
    assert [m for m in said if "readers are not confined (KB_READER_SANDBOX is off)" in m]
    ready = await (await bot.http.get("/readyz")).json()
    assert ready["reader_sandbox"]["mode"] == "off" and ready["reader_sandbox"]["confined"] is False

    confined = await make_bot()
    ready = await (await confined.http.get("/readyz")).json()
    assert (
        ready["reader_sandbox"]["confined"] is True and ready["reader_sandbox"]["sockets"] == "none"
    )


def test_a_reader_that_cannot_confine_itself_reads_nothing(tmp_path: Path) -> None:
    # Landlock holds only the thread that asks (and what it starts later): a reader
    # with a second thread already running refuses to read rather than half-confine.
    confinement = ReaderSandbox("auto").confinement(str(tmp_path))
    assert confinement is not None
    code = (
        "import sys, threading, time; "
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
        "from index.ingest.isolated import serve; serve(0, 1, sys.argv[1])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, confinement.to_json()],
        cwd=ROOT,
        env={**_reader_env(str(ROOT)), "TMPDIR": str(tmp_path)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "the document reader could not confine itself" in done.stderr
    assert "not with 2 threads" in done.stderr
    assert done.stdout == "", "it never said it was ready"
