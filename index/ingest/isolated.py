"""Reading untrusted documents in reader processes of their own, with hard limits.

A small hostile file (an xlsx whose one shared string fills a million cells, a
docx of ten thousand styles) can cost the process reading it gigabytes or
minutes. ``read_isolated`` sends the bytes to a warm reader process (a
``python -c`` interpreter running ``serve``, started once and reused), which
runs ``index.ingest.extract.extract`` under ``RLIMIT_AS`` (``memory_mb``) and
``RLIMIT_CPU`` (``timeout``) while the parent watches the wall clock and kills
it at ``timeout``. Only the ``Extracted`` text comes back: the server's memory
never grows with what reading cost. A document over a limit fails with
``ReadingLimit``, a reason a person can act on; the reader is replaced and
nothing else is affected. Tesseract's time on scanned pages is not counted
(the reader says when it runs, ``index.ingest.ocr.listening_to_tesseract``):
each page has its own limit (``KB_OCR_TIMEOUT``), so honest OCR of many pages
is never cut short.

At most ``ExtractLimits.pool_size`` documents are read at once. A reader is
handed out fairly: round-robin across owners (the person who added the
document, or ``reindex``), and while the pool has more than one reader no
owner holds all of them, so one person's slow document never holds up
everyone else's.

The reader's environment holds no secret (no token, no key): only what
Python, the extractors and Tesseract need. Before it reads anything it confines
itself (``index.ingest.sandbox``, ``ExtractLimits.sandbox``): it reads only what
reading needs, writes only its own temporary directory (made here, removed when
it stops) and opens no socket.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from index.config import DEFAULT_MAX_TEXT_CHARS, ExtractLimits, OcrConfig
from index.errors import (
    CorruptDocument,
    EmptyDocument,
    ExtractionError,
    OverLimit,
    ReadingLimit,
    TooLarge,
    UnsupportedType,
)
from index.ingest.sandbox import Confinement, ReaderSandbox, SandboxFailed, confine
from index.models import Extracted

log = logging.getLogger(__name__)

__all__ = ["ReaderPool", "over_reading_limit", "read_isolated", "reader_pool"]

# A reader reads this many documents, then a fresh one takes its place (a
# long-lived interpreter's heap only grows).
_JOBS_PER_READER = 200
# Seconds a new reader may take to start (imports); never counted against a document.
_START_TIMEOUT = 120.0
# Beyond KB_OCR_TIMEOUT, what one Tesseract run may take before the reader is killed
# (pytesseract kills Tesseract itself at the page timeout).
_OCR_GRACE = 15.0
# The environment a reader gets: what Python, the extractors and Tesseract read.
_ENV_PASSED = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TESSDATA_PREFIX")
_ENV_PREFIXES = ("OMP_", "COVERAGE_")
_ERRORS: dict[str, type[ExtractionError]] = {
    cls.__name__: cls
    for cls in (
        ExtractionError,
        EmptyDocument,
        UnsupportedType,
        TooLarge,
        OverLimit,
        CorruptDocument,
    )
}

# The sentences a limit failure's reason holds; ``over_reading_limit`` reads them back.
_MEMORY = re.compile(r"needed more than (\d+) MB of memory to read")
_TIME = re.compile(r"took longer than (\d+(?:\.\d+)?) s to read")
_CRASH = re.compile(r"stopped the document reader \(\w+\) with (\d+) MB of memory")


def memory_reason(name: str, limits: ExtractLimits) -> str:
    """Why a document over the memory limit failed."""
    return (
        f"{name} needed more than {limits.memory_mb} MB of memory to read, the limit per "
        "document (KB_EXTRACT_MEMORY_MB). Save it again from the program that made it (or "
        "split it) and upload the new copy, or ask an admin to raise KB_EXTRACT_MEMORY_MB."
    )


def time_reason(name: str, limits: ExtractLimits) -> str:
    """Why a document over the time limit failed."""
    return (
        f"{name} took longer than {limits.timeout:g} s to read, the limit per document "
        "(KB_EXTRACT_TIMEOUT). Save it again from the program that made it (or split it) "
        "and upload the new copy, or ask an admin to raise KB_EXTRACT_TIMEOUT."
    )


def crash_reason(name: str, limits: ExtractLimits, how: str) -> str:
    """Why a document that made the reader process die failed."""
    return (
        f"{name} stopped the document reader ({how}) with {limits.memory_mb} MB of memory "
        "allowed: it may need more than that to read (KB_EXTRACT_MEMORY_MB), or be damaged. "
        "Save it again from the program that made it and upload the new copy."
    )


def over_reading_limit(reason: str | None, limits: ExtractLimits) -> bool:
    """Whether a failure ``reason`` says reading went over a limit that is not higher now.

    A document whose stored bytes needed more memory or time than allowed
    would need them again: ``kb reindex`` skips it until its limit is raised.
    """
    if not reason:
        return False
    # The reason starts with the document's name, which its uploader chose: only the
    # last sentence of the kind is the reader's own.
    if memory := _MEMORY.findall(reason) or _CRASH.findall(reason):
        return limits.memory_mb <= int(memory[-1])
    if time_taken := _TIME.findall(reason):
        return limits.timeout <= float(time_taken[-1])
    return False


# ---------------------------------------------------------------- the parent's side


@dataclass(frozen=True)
class _Job:
    data: bytes
    filename: str
    max_bytes: int
    max_pages: int
    max_text_chars: int
    ocr: OcrConfig | None
    memory_mb: int
    cpu_seconds: float


class _Reader:
    """One reader process, the two pipes to it and its temporary directory."""

    def __init__(self, sandbox: ReaderSandbox) -> None:
        self.sandbox = sandbox
        self.temp_dir = tempfile.mkdtemp(prefix="kb-reader-")
        try:
            confinement = sandbox.confinement(self.temp_dir)
        except BaseException:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            raise
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        root = str(Path(__file__).resolve().parents[2])
        code = (
            "import sys; from index.ingest.isolated import serve; "
            f"serve({job_r}, {out_w}, sys.argv[1])"
        )
        spec = confinement.to_json() if confinement else ""
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, spec],
                pass_fds=(job_r, out_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                cwd=root,
                env={**_reader_env(root), "TMPDIR": self.temp_dir},
                start_new_session=True,  # a Ctrl-C in the terminal is the parent's to handle
            )
        except BaseException:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            raise
        finally:
            os.close(job_r)
            os.close(out_w)
        self.jobs = Connection(job_w, readable=False)
        self.results = Connection(out_r, writable=False)
        self.ready = False
        self.done = 0
        self.retire = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, job: _Job, name: str, limits: ExtractLimits, ocr_timeout: float) -> Extracted:
        """Read one document; raises its ExtractionError, or ReadingLimit over a limit."""
        if not self.ready:
            self._await_ready()
        self.jobs.send(job)
        self.done += 1
        remaining = limits.timeout
        in_ocr = False
        while True:
            started = time.monotonic()
            wait = ocr_timeout + _OCR_GRACE if in_ocr else max(remaining, 0.0)
            arrived = self.results.poll(wait)
            if not in_ocr:
                remaining -= time.monotonic() - started
            if not arrived:
                self.kill()
                raise ReadingLimit(time_reason(name, limits), kind="time", filename=job.filename)
            try:
                message = self.results.recv()
            except (EOFError, OSError):
                raise self._died(name, job.filename, limits) from None
            match message:
                case ("ocr", bool(running)):
                    in_ocr = running
                case ("log", int(level), str(logger), str(text)):
                    _relog(level, logger, text)
                case ("ok", Extracted() as extracted, bool(retire)):
                    self.retire = retire
                    return extracted
                case ("error", str(kind), str(reason), bool(retire)):
                    self.retire = retire
                    raise _ERRORS.get(kind, ExtractionError)(reason, filename=job.filename)
                case ("memory",):
                    self.retire = True
                    raise ReadingLimit(
                        memory_reason(name, limits), kind="memory", filename=job.filename
                    )
                case ("crash", str(kind), str(text)):
                    self.retire = True
                    raise RuntimeError(f"the document reader raised {kind}: {text}")
                case _:
                    self.kill()
                    raise RuntimeError(f"the document reader sent {type(message).__name__}")

    def _await_ready(self) -> None:
        if not self.results.poll(_START_TIMEOUT):
            self.kill()
            raise RuntimeError(f"the document reader did not start in {_START_TIMEOUT:g} s")
        try:
            message = self.results.recv()
        except (EOFError, OSError):
            code = self.proc.wait()
            raise RuntimeError(f"the document reader could not start (exit {code})") from None
        if message != ("ready",):
            self.kill()
            raise RuntimeError("the document reader started wrong")
        self.ready = True

    def _died(self, name: str, filename: str, limits: ExtractLimits) -> ReadingLimit:
        code = self.proc.wait()
        self.retire = True
        if code == -signal.SIGXCPU:
            return ReadingLimit(time_reason(name, limits), kind="time", filename=filename)
        how = f"exit {code}"
        if code < 0:
            with contextlib.suppress(ValueError):
                how = signal.Signals(-code).name
        log.warning("the document reader died reading %s (%s)", filename, how)
        return ReadingLimit(crash_reason(name, limits, how), kind="crash", filename=filename)

    def kill(self) -> None:
        self.retire = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self) -> None:
        for conn in (self.jobs, self.results):
            with contextlib.suppress(OSError):
                conn.close()
        if not self.alive():  # what it wrote goes with it
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _reader_env(root: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _ENV_PASSED or k.startswith(_ENV_PREFIXES)}
    path = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([root, path] if path else [root])
    # numpy is imported with the extractors: one BLAS thread keeps its address space small.
    env["OPENBLAS_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class ReaderPool:
    """At most ``size`` warm reader processes, handed out fairly among owners.

    An owner waits when every reader is busy, or when it already holds
    ``size - 1`` of them (``size`` > 1) so that one is always left for someone
    else; waiting owners are served round-robin.
    """

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.per_owner = max(1, self.size - 1)
        self._cond = threading.Condition()
        self._idle: list[_Reader] = []
        self._busy = 0
        self._held: Counter[str] = Counter()
        self._queues: dict[str, deque[object]] = {}  # each waiting owner's tickets, in turn order
        self._granted: set[object] = set()
        self._closed = False

    def waiting(self) -> int:
        """How many reads wait for a reader."""
        with self._cond:
            return sum(len(q) for q in self._queues.values())

    def reading(self) -> int:
        """How many documents are being read now."""
        with self._cond:
            return self._busy

    @contextlib.contextmanager
    def _reader(self, owner: str, sandbox: ReaderSandbox) -> Iterator[_Reader]:
        ticket = object()
        with self._cond:
            self._queues.setdefault(owner, deque()).append(ticket)
            self._dispatch()
            while ticket not in self._granted:
                self._cond.wait()
            self._granted.discard(ticket)
            reader = self._idle.pop() if self._idle else None
        try:
            if reader is not None and (not reader.alive() or reader.sandbox != sandbox):
                _stop(reader)
                reader = None
            if reader is None:
                reader = _Reader(sandbox)
            yield reader
        finally:
            keep = reader is not None and not reader.retire and reader.alive()
            if reader is not None and reader.done >= _JOBS_PER_READER:
                keep = False
            if reader is not None and not keep:
                _stop(reader)
            with self._cond:
                self._busy -= 1
                self._held[owner] -= 1
                if not self._held[owner]:
                    del self._held[owner]
                if keep and reader is not None and not self._closed:
                    self._idle.append(reader)
                elif keep and reader is not None:
                    _stop(reader)
                self._dispatch()

    def _dispatch(self) -> None:
        """Grant free readers to waiting owners, round-robin (called holding the lock)."""
        granted = False
        while self._busy < self.size:
            owner = next(
                (o for o in self._queues if self._held[o] < self.per_owner),
                None,
            )
            if owner is None:
                break
            queue = self._queues.pop(owner)
            self._granted.add(queue.popleft())
            if queue:
                self._queues[owner] = queue  # to the back of the turn order
            self._busy += 1
            self._held[owner] += 1
            granted = True
        if granted:
            self._cond.notify_all()

    def read(
        self,
        data: bytes,
        filename: str,
        *,
        limits: ExtractLimits,
        max_bytes: int,
        max_pages: int,
        max_text_chars: int,
        ocr: OcrConfig | None,
        owner: str = "",
    ) -> Extracted:
        """``extract`` in a reader process, within ``limits``.

        Raises:
            ExtractionError: what ``extract`` raises; ``ReadingLimit`` over a limit.
        """
        name = _display_name(filename)
        job = _Job(
            data,
            filename,
            max_bytes,
            max_pages,
            max_text_chars,
            ocr,
            memory_mb=limits.memory_mb,
            cpu_seconds=limits.timeout,
        )
        ocr_timeout = (ocr or OcrConfig()).page_timeout
        sandbox = ReaderSandbox(limits.sandbox, (ocr or OcrConfig()).tesseract_cmd)
        with self._reader(owner, sandbox) as reader:
            try:
                return reader.run(job, name, limits, ocr_timeout)
            except (BrokenPipeError, ConnectionResetError):
                # The reader was gone before it took the document (killed from outside).
                reader.kill()
                raise RuntimeError("the document reader stopped before reading") from None

    def close(self) -> None:
        """Stop the idle readers; busy ones stop when their document is read."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
        for reader in idle:
            _stop(reader)


def _relog(level: int, logger: str, text: str) -> None:
    """A reader's log record, logged here: the server's log is where operators look."""
    name = logger if logger == "index" or logger.startswith("index.") else __name__
    logging.getLogger(name).log(level, "%s", text)


def _stop(reader: _Reader) -> None:
    reader.close()  # the reader sees the end of its jobs and exits
    try:
        reader.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        reader.kill()
    reader.close()  # exited: its temporary directory goes


def _display_name(filename: str) -> str:
    return PureWindowsPath(PurePosixPath(filename).name).name or filename


_pools: dict[int, ReaderPool] = {}
_pools_guard = threading.Lock()


def reader_pool(limits: ExtractLimits) -> ReaderPool:
    """This process's pool of ``limits.pool_size`` readers (one per size, shared)."""
    with _pools_guard:
        pool = _pools.get(limits.pool_size)
        if pool is None:
            pool = _pools[limits.pool_size] = ReaderPool(limits.pool_size)
        return pool


@atexit.register
def _close_pools() -> None:
    with _pools_guard:
        pools = list(_pools.values())
    for pool in pools:
        pool.close()


def read_isolated(
    data: bytes,
    filename: str,
    *,
    limits: ExtractLimits,
    max_bytes: int,
    max_pages: int,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
    ocr: OcrConfig | None = None,
    owner: str = "",
) -> Extracted:
    """``index.ingest.extract.extract`` in a reader process of the shared pool, within ``limits``."""
    return reader_pool(limits).read(
        data,
        filename,
        limits=limits,
        max_bytes=max_bytes,
        max_pages=max_pages,
        max_text_chars=max_text_chars,
        ocr=ocr,
        owner=owner,
    )


# ---------------------------------------------------------------- the reader's side


def serve(jobs_fd: int, results_fd: int, confinement: str = "") -> None:
    """The reader process: confine itself to ``confinement`` (``Confinement.to_json``;
    empty: unconfined), then read documents from ``jobs_fd`` until it closes."""
    if confinement:
        try:
            confine(Confinement.from_json(confinement))
        except SandboxFailed as exc:  # asked for, it is never skipped: the server says why
            sys.exit(f"the document reader could not confine itself: {exc}")
    from index.ingest.extract import extract
    from index.ingest.ocr import listening_to_tesseract

    jobs = Connection(jobs_fd, writable=False)
    results = Connection(results_fd, readable=False)
    logging.getLogger().addHandler(_ToParent(results))
    started_size = _address_space()
    results.send(("ready",))
    while True:
        try:
            job = jobs.recv()
        except (EOFError, OSError):
            return
        if not isinstance(job, _Job):
            return
        reply: tuple[Any, ...]
        try:
            with (
                _limits(job),
                listening_to_tesseract(lambda running: results.send(("ocr", running))),
            ):
                extracted = extract(
                    job.data,
                    job.filename,
                    max_bytes=job.max_bytes,
                    max_pages=job.max_pages,
                    max_text_chars=job.max_text_chars,
                    ocr=job.ocr,
                )
            reply = ("ok", extracted, _grown(started_size))
        except MemoryError:
            reply = ("memory",)
        except ExtractionError as exc:
            if _caused_by_memory(exc):
                reply = ("memory",)
            else:
                reply = ("error", type(exc).__name__, exc.reason, _grown(started_size))
        except Exception as exc:  # a bug in an extractor: the parent logs it
            reply = ("crash", type(exc).__name__, str(exc)[:500])
        del job
        results.send(reply)
        if reply[0] in ("memory", "crash"):
            return


class _ToParent(logging.Handler):
    """Sends the extractors' warnings to the parent, which logs them (``_relog``)."""

    def __init__(self, results: Connection) -> None:
        super().__init__(logging.WARNING)
        self.results = results

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.results.send(("log", record.levelno, record.name, record.getMessage()[:2000]))
        except Exception:  # a log line must never fail the document
            self.handleError(record)


@contextlib.contextmanager
def _limits(job: _Job) -> Iterator[None]:
    """Hold this process to the job's memory and processor time while inside."""
    _, as_hard = resource.getrlimit(resource.RLIMIT_AS)
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_soft = math.ceil(usage.ru_utime + usage.ru_stime + job.cpu_seconds)
    memory = job.memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (_under(memory, as_hard), as_hard))
    resource.setrlimit(resource.RLIMIT_CPU, (_under(cpu_soft, cpu_hard), cpu_hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (as_hard, as_hard))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))


def _under(value: int, hard: int) -> int:
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _caused_by_memory(exc: BaseException) -> bool:
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, MemoryError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _address_space() -> int:
    """This process's address space now, in bytes (0 when /proc cannot say)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _grown(started: int) -> bool:
    """Whether this reader kept so much of what it read that a fresh one should replace it."""
    return bool(started) and _address_space() > 2 * started
