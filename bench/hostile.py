"""The server's memory and another member's wait while hostile files are uploaded.

Runs the real bot (``bot.app.create_app``) on loopback against the tests' mock
Slack, with its default reading limits. For each small hostile file of
``tests.hostile`` (and an honest 19 MB Markdown file the reader must absorb),
one member sends it in a DM (a signed ``file_share`` event) and another member
sends a small file at the same moment. Sampled every 20 ms meanwhile: this
process's resident memory. Reported per file: how it ended, how long it took,
the server's peak resident memory above its size before the file (goal: under
100 MB while only reading; a file that is read and indexed is embedded in the
server, which costs what its passages cost),
and how long the other member's small upload took (goal: under 10 s).

The shapes part (``shapes``) prints what a document's shape costs, each shape at ``n`` and ``4n`` units side
by side (medians of a few runs; linear work shows a ratio near 4): the viewer's
formatting (``bot.server.render``), chunking and sentence splitting
(``index.ingest.chunk``, ``sentences``), a Word table merged down its rows and
a Word file of one-word paragraphs (``index.ingest.office``), and a scanned page
listing its one image under 8 names (``index.ingest.ocr``, Tesseract's runs
counted). Then, before the uploads, the running server opens the worst Markdown
block shape of 400,000 characters (one paragraph of one-letter lines) through
``/d/<id>``: the first open and the median of the next (goal: under 1 s), with
``/readyz`` asked meanwhile.

Another part attacks the web server's doors (``python -m bench.hostile
connections``): ``kb serve`` runs in a process of its own whose open-file limit
is 1,024 (soft and hard, ``resource.setrlimit``), with its default limits.
1,100 connections each send half a request (the head cut short, or a body
promised and not sent), at once; then a health check and a signed Slack event
are timed, each on a connection of its own (goal: under 1 s each). Reported
per shape: those two times, how the half-sent connections ended (closed to make
room, or at their deadline, ``KB_HTTP_HEADER_TIMEOUT`` / ``KB_HTTP_BODY_TIMEOUT``),
the most descriptors the server held, and what its log grew by.

The fairness part (``python -m bench.hostile fair``): two members each send a
file that holds a reader for long (a scan of six pages of small print, read by
Tesseract), and a third member then sends a 60-byte file, three times one after
the other: the median seconds until the third member's file is indexed (goal:
under 10 s), read in the readers' quick lane
(``index.ingest.isolated.QUICK_LANE_BYTES``), and how many scans still read then.

Run: python -m bench.hostile [shapes|files|connections|fair]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import aiohttp

from bench.machine import describe as machine
from bench.slack import bench_settings, loaded_kb, serve
from bot.server import routes
from bot.server.render import render_document
from index.ingest.chunk import chunk_document
from index.ingest.extract import extract
from index.ingest.sentences import sentences
from index.knowledge_base import KnowledgeBase
from index.models import Extracted

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests import hostile  # noqa: E402
from tests.servers import (  # noqa: E402
    DEFAULT_SIGNING_SECRET,
    USER_ID,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    event_body,
    file_share_event,
    slack_headers,
)
from tests.test_ocr import scanned_pdf  # noqa: E402

OTHER_USER = "U0OTHER001"
THIRD_USER = "U0THIRD001"
GOAL_RSS_MB = 100
GOAL_BESIDE_S = 10.0
TIMEOUT_S = 180.0


def big_markdown() -> bytes:
    """An honest 19 MB Markdown file: over KB_MAX_TEXT_CHARS, read whole by the reader first."""
    paragraphs = (f"Paragraph {i} tells how the office works on day {i}." for i in range(350_000))
    return ("# Guide\n\n" + "\n\n".join(paragraphs)).encode()


FILES: dict[str, Callable[[], bytes]] = {
    "shared-string.xlsx": hostile.shared_string_xlsx,
    "aliased-sheets.xlsx": hostile.aliased_sheets_xlsx,
    "aliased-slides.pptx": hostile.aliased_slides_pptx,
    "styles.docx": hostile.styled_docx,
    "paragraphs.docx": hostile.plain_docx,
    "spaces.csv": hostile.quoted_spaces_csv,
    "big.md": big_markdown,
}


def rss_mb() -> float:
    """This process's resident memory now, in MB."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def final(slack: MockSlackAPI, name: str) -> str | None:
    """The final status the bot gave ``name``, if any yet."""
    for method, params in reversed(slack.log):
        text = str(params.get("text", ""))
        ended = ": indexed," in text or ": failed:" in text
        if method in {"chat.postMessage", "chat.update"} and f"*{name}*" in text and ended:
            return text
    return None


async def until(predicate: Callable[[], object], samples: list[float]) -> float:
    """Seconds until ``predicate`` holds, sampling the memory meanwhile."""
    started = time.perf_counter()
    while not predicate():
        samples.append(rss_mb())
        if time.perf_counter() - started > TIMEOUT_S:
            raise TimeoutError(f"no final status within {TIMEOUT_S} s")
        await asyncio.sleep(0.02)
    return time.perf_counter() - started


async def run() -> None:
    with tempfile.TemporaryDirectory(prefix="kb-bench-hostile-") as tmp:
        async with MockSlackAPI() as slack, OpenAICompatServer(reply="ok [1]") as llm:
            settings = bench_settings(Path(tmp) / "kb", slack, llm).model_copy(
                update={"publishers": f"{USER_ID},{OTHER_USER}"}
            )
            kb = loaded_kb(settings)
            runner, url = await serve(settings, kb)
            try:
                async with aiohttp.ClientSession() as http:
                    await send(http, url, slack, "warm.md", b"# Warm\n\nup\n", OTHER_USER)
                    await until(lambda: final(slack, "warm.md"), [])
                    await viewer_opens(http, url.removesuffix("/slack/events"), runner.app, kb)
                    idle = rss_mb()
                    print(f"idle server: {idle:.0f} MB resident")
                    print(
                        f"{'file':<22}{'size':>8}{'ended':>10}{'took':>8}{'+RSS':>8}{'beside':>8}"
                    )
                    for n, (name, build) in enumerate(FILES.items()):
                        data = build()
                        small = f"small-{n}.md"
                        before = rss_mb()
                        samples: list[float] = []
                        await send(http, url, slack, name, data, USER_ID)
                        await send(
                            http,
                            url,
                            slack,
                            small,
                            f"# Lunch {n}\n\nAt noon on day {n}.\n".encode(),
                            OTHER_USER,
                        )
                        beside = await until(lambda s=small: final(slack, s), samples)
                        took = await until(lambda f=name: final(slack, f), samples)
                        ended = "failed" if ": failed:" in str(final(slack, name)) else "indexed"
                        grew = max(samples, default=before) - before
                        print(
                            f"{name:<22}{len(data) / 1024:>7.0f}K{ended:>10}{took + beside:>7.1f}s"
                            f"{grew:>7.0f}M{beside:>7.1f}s"
                        )
                    print(
                        f"goals: +RSS under {GOAL_RSS_MB} MB, the other member's upload "
                        f"under {GOAL_BESIDE_S} s"
                    )
            finally:
                await runner.cleanup()


async def fair() -> None:
    """A 60-byte upload indexed while two other members' slow files read: median seconds."""
    from tests.test_isolated_extract import _dense_scan

    slow = {"scan-1.pdf": (_dense_scan(6), USER_ID), "scan-2.pdf": (_dense_scan(6), THIRD_USER)}
    with tempfile.TemporaryDirectory(prefix="kb-bench-fair-") as tmp:
        async with MockSlackAPI() as slack, OpenAICompatServer(reply="ok [1]") as llm:
            settings = bench_settings(Path(tmp) / "kb", slack, llm).model_copy(
                update={"publishers": f"{USER_ID},{OTHER_USER},{THIRD_USER}"}
            )
            kb = loaded_kb(settings)
            runner, url = await serve(settings, kb)
            try:
                async with aiohttp.ClientSession() as http:
                    await send(http, url, slack, "warm.md", b"# Warm\n\nup\n", OTHER_USER)
                    await until(lambda: final(slack, "warm.md"), [])
                    for name, (data, user) in slow.items():
                        await send(http, url, slack, name, data, user)
                    times, still_reading = [], []
                    for n in range(3):
                        small = f"lunch-{n}.txt"
                        tiny = f"Lunch is at noon on day {n}; the canteen is on floor 2.".ljust(60)
                        await send(http, url, slack, small, tiny.encode()[:60], OTHER_USER)
                        times.append(await until(lambda s=small: final(slack, s), []))
                        still_reading.append(sum(final(slack, name) is None for name in slow))
                    print(
                        f"fairness: a 60-byte upload beside two scans of 6 pages read by OCR: "
                        f"median {statistics.median(times):.2f} s of {len(times)} (goal: under "
                        f"{GOAL_BESIDE_S:g} s); scans still reading when each was indexed: "
                        f"{still_reading}"
                    )
                    for name in slow:
                        took = await until(lambda f=name: final(slack, f), [])
                        ended = "failed" if ": failed:" in str(final(slack, name)) else "indexed"
                        print(f"  {name}: {ended}, {took:.1f} s after the last small upload")
            finally:
                await runner.cleanup()


# ---------------------------------------------------------------- shapes

GOAL_VIEWER_S = 1.0
WORST_BLOCK_CHARS = 400_000
REPEATS = 3


def _docx_chunks(data: bytes) -> None:
    doc = extract(data, "shape.docx")
    for chunk in chunk_document(doc).chunks:
        sentences(chunk.content)


def _md_chunks(text: str) -> None:
    for chunk in chunk_document(Extracted(text=text, title="T", kind="md")).chunks:
        sentences(chunk.content)


# name: (units at n, build the input for k units, the work on it)
SHAPES: dict[str, tuple[int, Callable[[int], object], Callable[[object], object]]] = {
    "viewer: one-letter lines": (1_000, lambda k: "w\n" * k, lambda t: render_document(t, "md")),
    "viewer: numbered items": (1_000, lambda k: "1. a\n" * k, lambda t: render_document(t, "md")),
    "viewer: '![' run": (1_500, lambda k: "![a" * k, lambda t: render_document(t, "md")),
    "viewer: one-word blocks": (1_000, lambda k: "w\n\n" * k, lambda t: render_document(t, "docx")),
    "chunk: dots, no space": (20_000, lambda k: "." * k, _md_chunks),
    "chunk: empty sections": (20_000, lambda k: "# h\n" * k, _md_chunks),
    "chunk: one-letter lines": (20_000, lambda k: "w\n" * k, _md_chunks),
    "word: merged table rows": (300, hostile.merged_table_docx, _docx_chunks),
    "word: one-word paragraphs": (1_000, hostile.one_word_paragraphs_docx, _docx_chunks),
}


def median_s(work: Callable[[], object], repeats: int = REPEATS) -> float:
    """The median wall time of ``work()``, in seconds."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def shapes() -> None:
    """Each shape at n and 4n units, medians side by side."""
    print(f"\n{'shape':<28}{'n':>8}{'at n':>9}{'at 4n':>9}{'ratio':>7}")
    for name, (n, build, work) in SHAPES.items():
        small, large = build(n), build(4 * n)
        at_n = median_s(lambda small=small, work=work: work(small))
        at_4n = median_s(lambda large=large, work=work: work(large))
        print(f"{name:<28}{n:>8,}{at_n:>8.3f}s{at_4n:>8.3f}s{at_4n / at_n:>7.1f}")
    print("linear work: a ratio near 4 (the quadratic shapes before were near 16)")
    ocr_page()


def ocr_page() -> None:
    """A scanned page listing its one image under 8 names: Tesseract's runs and the time."""
    import pytesseract
    from pypdf import PdfReader, PdfWriter
    from pypdf.generic import NameObject

    writer = PdfWriter()
    writer.append(PdfReader(io.BytesIO(scanned_pdf(["The spare key is kept at the desk."]))))
    xobjects = writer.pages[0]["/Resources"]["/XObject"]
    (image,) = [xobjects.raw_get(k) for k in xobjects]
    for n in range(1, 8):
        xobjects[NameObject(f"/Alias{n}")] = image
    out = io.BytesIO()
    writer.write(out)
    runs = []
    real = pytesseract.image_to_string

    def counted(*args: object, **kwargs: object) -> str:
        runs.append(1)
        return real(*args, **kwargs)

    pytesseract.image_to_string = counted
    try:
        took = median_s(lambda: extract(out.getvalue(), "aliases.pdf"), 1)
    finally:
        pytesseract.image_to_string = real
    print(f"OCR: one image under 8 names on a page: {len(runs)} Tesseract run(s), {took:.1f} s")


async def viewer_opens(
    http: aiohttp.ClientSession, base: str, app: object, kb: KnowledgeBase
) -> None:
    """The server opens the worst Markdown block shape of 400k characters, /readyz meanwhile."""
    text = "w\n" * (WORST_BLOCK_CHARS // 2)
    doc = kb.ingest_bytes(text.encode(), "worst-block.md", uploader="bench").document
    token = app[routes.ENGINE].signer.token(doc.id, "*")
    link = f"{base}/d/{doc.id}?t={quote(token, safe='')}"
    times = []
    for _ in range(1 + 5):
        started = time.perf_counter()
        opening = asyncio.ensure_future(http.get(link))
        ready_started = time.perf_counter()
        async with http.get(f"{base}/readyz") as ready:
            await ready.read()
        ready_took = time.perf_counter() - ready_started
        async with await opening as resp:
            page = await resp.text()
            assert resp.status == 200, resp.status
        times.append(time.perf_counter() - started)
    layout = "formatted" if "document formatted" in page else "plain"
    print(
        f"viewer: {len(text):,}-character paragraph of one-letter lines ({layout}): first open "
        f"{times[0]:.3f} s, median of the next {statistics.median(times[1:]):.3f} s, "
        f"/readyz meanwhile {ready_took:.3f} s (goal: under {GOAL_VIEWER_S:g} s)"
    )
    costliest = "1. a\n" * 10_000  # at MAX_FORMATTING_WORK: the costliest text still formatted
    print(
        f"viewer: costliest shape still formatted ({len(costliest):,} characters of one-letter "
        f"numbered items), formatted cold: {median_s(lambda: render_document(costliest, 'md')):.3f} s"
    )


_sent = 0


async def send(
    http: aiohttp.ClientSession, url: str, slack: MockSlackAPI, name: str, data: bytes, user: str
) -> None:
    """One member sends one file to the bot in a DM."""
    global _sent
    _sent += 1
    file = slack.add_file(f"F0BENCH{_sent:04d}", name, data, "application/octet-stream", user=user)
    body = event_body(file_share_event([file], user=user), event_id=f"Ev0BENCH{_sent:04d}")
    headers = slack_headers(DEFAULT_SIGNING_SECRET, body)
    async with http.post(url, data=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()


# ---------------------------------------------------------------- the doors

ROOT = Path(__file__).resolve().parent.parent
HALF_OPEN = 1100
OPEN_FILES = 1024
GOAL_ANSWER_S = 1.0
DEADLINE_S = 10.0  # KB_HTTP_HEADER_TIMEOUT and KB_HTTP_BODY_TIMEOUT's default
# Two ways to send half a request (apart from SHAPES, the shapes of documents).
HALF_SENT = {
    "head cut short": b"GET /healthz HTTP/1.1\r\nHost: kb\r\nX-Slow: ",
    "body not sent": b"POST /slack/events HTTP/1.1\r\nHost: kb\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n{",
}
# kb serve as an operator runs it, in a process whose open-file limit is 1,024.
SERVE = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, ({OPEN_FILES}, {OPEN_FILES}))
from bot.cli import main
sys.argv = ["kb", "serve"]
main()
"""


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descriptors(pid: int) -> int:
    """How many files the process ``pid`` has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


async def half_open(
    port: int, data: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A connection that sent ``data`` and nothing more; ``None`` if none could be opened."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        writer.write(data)
        return reader, writer
    except (OSError, TimeoutError):
        return None


async def ended(reader: asyncio.StreamReader, started: float) -> tuple[float, bytes]:
    """When (seconds after ``started``) the server closed the connection, and what it said."""
    try:
        said = await asyncio.wait_for(reader.read(), DEADLINE_S * 3)
    except (OSError, TimeoutError):
        said = b"(still open)"
    return time.perf_counter() - started, said


async def timed(port: int, request: bytes) -> tuple[float, str]:
    """Seconds from connecting to the answer's status line, and that line."""
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
        writer.write(request)
        line = await asyncio.wait_for(reader.readline(), 30)
        writer.close()
    except (OSError, TimeoutError) as exc:
        return time.perf_counter() - started, type(exc).__name__
    return time.perf_counter() - started, line.decode().strip()


def signed_event() -> bytes:
    """A signed ``app_mention`` as Slack posts it, closing its connection."""
    body = event_body(app_mention_event("How long do I have to submit an expense claim?"))
    headers = {**slack_headers(DEFAULT_SIGNING_SECRET, body), "Connection": "close"}
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (
        f"POST /slack/events HTTP/1.1\r\nHost: kb\r\n{head}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def attack(port: int, pid: int, log: Path, shape: str) -> None:
    """One shape of half-sent requests against the server; print what it cost."""
    log_before = log.stat().st_size
    most_fds = descriptors(pid)
    started = time.perf_counter()
    readers = await asyncio.gather(*(half_open(port, HALF_SENT[shape]) for _ in range(HALF_OPEN)))
    # The writers are kept: a connection is the client's to hold until the server closes it.
    opened = [r for r in readers if r is not None]
    endings = [asyncio.create_task(ended(r, started)) for r, _ in opened]
    most_fds = max(most_fds, descriptors(pid))
    health, health_line = await timed(
        port, b"GET /healthz HTTP/1.1\r\nHost: kb\r\nConnection: close\r\n\r\n"
    )
    event, event_line = await timed(port, signed_event())
    while not all(e.done() for e in endings):
        most_fds = max(most_fds, descriptors(pid))
        await asyncio.sleep(0.05)
    results = [e.result() for e in endings]
    for _, writer in opened:
        writer.close()
    made_room = sum(1 for at, _ in results if at < DEADLINE_S * 0.9)
    at_deadline = [at for at, said in results if at >= DEADLINE_S * 0.9 and said != b"(still open)"]
    still_open = sum(1 for _, said in results if said == b"(still open)")
    grew = log.stat().st_size - log_before
    print(
        f"{shape:<16}{len(opened):>6}{health:>9.3f}s {health_line[:15]:<16}{event:>7.3f}s "
        f"{event_line[:15]:<16}{made_room:>6}{len(at_deadline):>6} (last {max(at_deadline, default=0):.1f} s)"
        f"{still_open:>6}{most_fds:>6}{grew / 1024:>8.1f} KB"
    )


async def doors() -> None:
    """1,100 half-sent requests against kb serve limited to 1,024 descriptors, per shape."""
    with tempfile.TemporaryDirectory(prefix="kb-bench-doors-") as tmp:
        async with MockSlackAPI() as slack, OpenAICompatServer(reply="ok [1]") as llm:
            settings = bench_settings(Path(tmp) / "kb", slack, llm)
            loaded_kb(settings).store.close()
            port = free_port()
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith(("KB_", "SLACK_"))},
                "PYTHONPATH": str(ROOT),
                "KB_DATA_DIR": str(settings.data_dir),
                "KB_PORT": str(port),
                "SLACK_BOT_TOKEN": slack.bot_token,
                "SLACK_SIGNING_SECRET": DEFAULT_SIGNING_SECRET,
                "SLACK_API_URL": slack.api_url,
                "OPENAI_BASE_URL": llm.url,
                "OPENAI_API_KEY": llm.api_key or "",
                "KB_THRESHOLD": "0.6",
            }
            if "KB_ENCODER_CACHE" in os.environ:
                env["KB_ENCODER_CACHE"] = os.environ["KB_ENCODER_CACHE"]
            log = Path(tmp) / "serve.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, "-c", SERVE], env=env, cwd=tmp, stdout=out, stderr=out
                )
            try:
                await until_ready(port, proc)
                print(
                    f"kb serve: open-file limit {OPEN_FILES}, started with {descriptors(proc.pid)} open"
                )
                print(
                    f"{'half-sent':<16}{'open':>6}{'/healthz':>10} {'':<16}{'event':>8} {'':<16}"
                    f"{'room':>6}{'dline':>6}{'':>12}{'open':>6}{'fds':>6}{'log':>11}"
                )
                for shape in HALF_SENT:
                    await attack(port, proc.pid, log, shape)
            finally:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            print(
                f"log at the end: {log.stat().st_size / 1024:.1f} KB, "
                f"{log.read_bytes().count(b'Traceback')} tracebacks"
            )
    print(
        f"goals: /healthz and a signed event under {GOAL_ANSWER_S:.0f} s each; every "
        "half-sent connection closed (to make room, or at its deadline); a log of a few lines"
    )


async def until_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    """Wait until kb serve answers /healthz (it loads its model first)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kb serve exited with {proc.returncode}")
        _, line = await timed(
            port, b"GET /healthz HTTP/1.1\r\nHost: kb\r\nConnection: close\r\n\r\n"
        )
        if " 200 " in line:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"kb serve did not answer within {TIMEOUT_S} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "part", nargs="?", choices=["shapes", "files", "connections", "fair"], default=None
    )
    part = parser.parse_args().part
    print(f"machine: {machine()}")
    if part in (None, "shapes"):
        shapes()
    if part in (None, "files"):
        asyncio.run(run())
    if part in (None, "connections"):
        asyncio.run(doors())
    if part in (None, "fair"):
        asyncio.run(fair())


if __name__ == "__main__":
    main()
