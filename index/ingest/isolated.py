"""Reading untrusted documents in reader processes of their own, with hard limits.

A small hostile file (an xlsx whose one shared string fills a million cells, a
docx of ten thousand styles) can cost the process reading it gigabytes or
minutes. ``read_isolated`` sends the bytes to a warm reader process (a
``python -c`` interpreter running ``serve``, started once and reused), which
runs ``index.ingest.extract.extract`` under ``RLIMIT_AS`` (``memory_mb``) and
``RLIMIT_CPU`` (``timeout``) while the parent watches the wall clock and kills
it at ``timeout``. Only the ``Extracted`` text comes back: the server's memory
never grows with what reading cost. A document over a limit fails with
``ReadingLimit``, a reason a person can act on and its ``kind`` and ``limit``
as data; the reader is replaced and nothing else is affected. The clock runs
while Tesseract reads scanned pages: OCR is paid from the document's one
budget (``index.ingest.ocr.reading_until`` ends each run by the document's
deadline, so a scan over it fails saying so rather than being killed).

What a reader sends is data, never code: each message is JSON
(``Connection.send_bytes``), at most ``message_cap`` bytes, and its shape is
checked (``_checked``) before anything is taken from it. A reader that sends
anything else (a pickle, malformed JSON, too many bytes, the wrong shape) is
killed and its document fails with ``ReaderRefused``: a parser exploit in the
reader gains nothing in the server.

At most ``ExtractLimits.pool_size`` documents are read at once, and one more
small document (``QUICK_LANE_BYTES``) in a lane of its own, so a small upload
is never queued behind big slow ones. A reader is handed out fairly: the
waiting owner (the person who added the document, or ``reindex``) holding the
fewest readers goes first, round-robin among equals, and while the pool has
more than one reader no owner holds all of them.

The reader's environment holds no secret (no token, no key): only what
Python, the extractors and Tesseract need. Before it reads anything it confines
itself (``index.ingest.sandbox``, ``ExtractLimits.sandbox``): it reads only what
reading needs, writes only its own temporary directory (made here, removed when
it stops) and opens no socket. A directory is named for this host, this
process's PID namespace and this process; one left by a process that was
killed (``SIGKILL``, out of memory) is removed when the next process of that
host and namespace starts its pool.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
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
    ReaderRefused,
    ReadingLimit,
    TooLarge,
    UnsupportedType,
)
from index.ingest.sandbox import Confinement, ReaderSandbox, SandboxFailed, confine
from index.models import EXTRACTED_KINDS, Extracted

log = logging.getLogger(__name__)

__all__ = [
    "QUICK_LANE_BYTES",
    "ReaderPool",
    "message_cap",
    "over_reading_limit",
    "read_isolated",
    "reader_pool",
]

# A reader reads this many documents, then a fresh one takes its place (a
# long-lived interpreter's heap only grows).
_JOBS_PER_READER = 200
# Seconds a new reader may take to start (imports); never counted against a document.
_START_TIMEOUT = 120.0
# A document's OCR stops this much before its deadline (never more than this share of
# it), so the reader says so itself rather than being killed.
_OCR_MARGIN = 2.0
_OCR_MARGIN_SHARE = 0.1
# A document of at most this many bytes may be read in the quick lane, beside the
# pool, when every reader of the pool is busy; a small file is read in a second.
QUICK_LANE_BYTES = 64 * 1024
# Readers of the quick lane.
_QUICK_READERS = 1
_POOL, _QUICK = "pool", "quick"
# The program a reader runs: ``module:function`` taking (jobs fd, results fd, confinement).
_SERVE = "index.ingest.isolated:serve"
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

# The kinds a reader may give each error it sends (the parent's own, time, memory
# and crash, are never taken from a reader).
_ERROR_KINDS: dict[str, frozenset[str]] = {
    "ExtractionError": frozenset({"unreadable"}),
    "EmptyDocument": frozenset({"empty"}),
    "UnsupportedType": frozenset({"unsupported"}),
    "TooLarge": frozenset({"size"}),
    "OverLimit": frozenset({"over_limit", "pages", "text", "ocr_pages", "ocr_time", "time"}),
    "CorruptDocument": frozenset({"corrupt"}),
}
# The most characters of a reason or a log line a reader may send.
_MOST_REASON_CHARS = 4_000
# Bytes of a message beyond its text: the JSON around it, a page map, a title.
_MESSAGE_OVERHEAD = 1 << 20
_LOG_LEVELS = frozenset(
    {logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL}
)
# A limit failure ``kb reindex`` skips while the limit is not higher: each kind's limit now.
_SKIPPED_LIMITS: dict[str, Callable[[ExtractLimits, OcrConfig], float]] = {
    "memory": lambda limits, ocr: limits.memory_mb,
    "crash": lambda limits, ocr: limits.memory_mb,
    "time": lambda limits, ocr: limits.timeout,
    "ocr_time": lambda limits, ocr: ocr.page_timeout,
}


def message_cap(max_text_chars: int, max_pages: int) -> int:
    """The most bytes one message of a reader may have: a text of ``max_text_chars``
    characters, each escaped at its longest in JSON (six bytes), and its page map."""
    return 6 * max_text_chars + 24 * max_pages + _MESSAGE_OVERHEAD


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


def over_reading_limit(
    kind: str | None, limit: float | None, limits: ExtractLimits, ocr: OcrConfig | None = None
) -> bool:
    """Whether a failure of ``kind`` over ``limit`` went over a limit that is not higher now.

    A document whose stored bytes needed more memory or time than allowed
    would need them again: ``kb reindex`` skips it until its limit is raised.
    Both are data stored with the failure; its reason (prose) is never read.
    """
    now = _SKIPPED_LIMITS.get(kind or "")
    if now is None or limit is None:
        return False
    return now(limits, ocr or OcrConfig()) <= limit


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

    def head(self) -> bytes:
        """Everything but the bytes, as JSON (the bytes follow as a message of their own)."""
        fields = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "data"
        }
        fields["ocr"] = dataclasses.asdict(self.ocr) if self.ocr else None
        return json.dumps(fields).encode()

    @classmethod
    def from_messages(cls, head: bytes, data: bytes) -> _Job:
        fields = json.loads(head)
        ocr = fields.pop("ocr")
        return cls(data=data, ocr=OcrConfig(**ocr) if ocr else None, **fields)


class _Refused(Exception):
    """What a reader sent is not what a reader sends; ``what`` says how."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _Reader:
    """One reader process, the two pipes to it and its temporary directory."""

    def __init__(self, sandbox: ReaderSandbox, serve_with: str = _SERVE) -> None:
        self.sandbox = sandbox
        self.temp_dir = tempfile.mkdtemp(prefix=_temp_prefix(os.getpid()))
        try:
            confinement = sandbox.confinement(self.temp_dir)
        except BaseException:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            raise
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        root = str(Path(__file__).resolve().parents[2])
        module, function = serve_with.split(":")
        code = f"import sys; from {module} import {function}; {function}({job_r}, {out_w}, sys.argv[1])"
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

    def run(self, job: _Job, name: str, limits: ExtractLimits) -> Extracted:
        """Read one document; raises its ExtractionError, ``ReadingLimit`` over a limit,
        ``ReaderRefused`` when the reader sends what a reader never sends."""
        if not self.ready:
            self._await_ready()
        self.jobs.send_bytes(job.head())
        self.jobs.send_bytes(job.data)
        self.done += 1
        deadline = time.monotonic() + limits.timeout
        cap = message_cap(job.max_text_chars, job.max_pages)
        while True:
            if not self.results.poll(max(deadline - time.monotonic(), 0.0)):
                self.kill()
                raise ReadingLimit(
                    time_reason(name, limits),
                    kind="time",
                    limit=limits.timeout,
                    filename=job.filename,
                )
            try:
                message = _checked(self._receive(cap), job)
            except _Died as died:
                raise _died_reason(died.code, name, job.filename, limits) from None
            except _Refused as refused:
                self.kill()
                log.warning("the document reader of %s was refused: %s", job.filename, refused.what)
                raise ReaderRefused(
                    refused_reason(name, refused.what), filename=job.filename
                ) from None
            match message:
                case ("log", int(level), str(logger), str(text)):
                    _relog(level, logger, text)
                case ("ok", Extracted() as extracted, bool(retire)):
                    self.retire = retire
                    return extracted
                case ("error", ExtractionError() as error, bool(retire)):
                    self.retire = retire
                    raise error
                case ("memory",):
                    self.retire = True
                    raise ReadingLimit(
                        memory_reason(name, limits),
                        kind="memory",
                        limit=limits.memory_mb,
                        filename=job.filename,
                    )
                case _:  # ("crash", kind, text): checked, nothing else is left
                    self.retire = True
                    raise RuntimeError(f"the document reader raised {message[1]}: {message[2]}")

    def _receive(self, cap: int) -> object:
        """The next message, decoded as JSON; raises ``_Refused`` for anything else."""
        try:
            raw = self.results.recv_bytes(cap)
        except EOFError:
            raise self._died() from None
        except OSError as exc:
            if not self.alive() or "bad message length" not in str(exc):
                raise self._died() from None
            raise _Refused(f"a message of more than {cap:,} bytes") from None
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise _Refused(f"a message that is not JSON ({type(exc).__name__})") from None

    def _await_ready(self) -> None:
        if not self.results.poll(_START_TIMEOUT):
            self.kill()
            raise RuntimeError(f"the document reader did not start in {_START_TIMEOUT:g} s")
        try:
            raw = self.results.recv_bytes(64)
        except (EOFError, OSError):
            code = self.proc.wait()
            raise RuntimeError(f"the document reader could not start (exit {code})") from None
        if raw != b'["ready"]':
            self.kill()
            raise RuntimeError("the document reader started wrong")
        self.ready = True

    def _died(self) -> _Died:
        code = self.proc.wait()
        self.retire = True
        return _Died(code)

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


class _Died(Exception):
    """The reader process ended while reading; ``code`` is its exit status."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _died_reason(code: int, name: str, filename: str, limits: ExtractLimits) -> ReadingLimit:
    if code == -signal.SIGXCPU:
        return ReadingLimit(
            time_reason(name, limits), kind="time", limit=limits.timeout, filename=filename
        )
    how = f"exit {code}"
    if code < 0:
        with contextlib.suppress(ValueError):
            how = signal.Signals(-code).name
    log.warning("the document reader died reading %s (%s)", filename, how)
    return ReadingLimit(
        crash_reason(name, limits, how), kind="crash", limit=limits.memory_mb, filename=filename
    )


def refused_reason(name: str, what: str) -> str:
    """Why a document whose reader sent what a reader never sends failed."""
    return (
        f"{name} was not read: its document reader sent {what}, which a reader never "
        "sends. The file may be made to attack the reader; check where it came from "
        "before uploading it again."
    )


def _checked(message: object, job: _Job) -> tuple[Any, ...]:
    """``message`` as the tuple it stands for, if it has the shape of one a reader sends.

    Raises:
        _Refused: anything else.
    """
    match message:
        case ["log", int(level), str(logger), str(text)] if (
            level in _LOG_LEVELS and len(logger) <= 200 and len(text) <= _MOST_REASON_CHARS
        ):
            return ("log", level, logger, text)
        case ["ok", dict() as fields, bool(retire)]:
            return ("ok", _extracted(fields), retire)
        case ["error", str(cls), str(reason), str(kind), bool(retire)] if (
            kind in _ERROR_KINDS.get(cls, ()) and len(reason) <= _MOST_REASON_CHARS
        ):
            # The limit is the one this side gave the reader, never one it claims.
            error = _ERRORS[cls](reason, filename=job.filename, kind=kind, limit=_given(kind, job))
            return ("error", error, retire)
        case ["memory"]:
            return ("memory",)
        case ["crash", str(kind), str(text)] if len(kind) <= 200 and len(text) <= 500:
            return ("crash", kind, text)
    raise _Refused(f"a message of the wrong shape ({_shape(message)})")


def _extracted(fields: dict[str, object]) -> Extracted:
    match fields:
        case {"text": str(text), "title": str(title), "kind": str(kind), "page_starts": starts} if (
            len(fields) == 4 and kind in EXTRACTED_KINDS and _page_map(starts, len(text))
        ):
            return Extracted(
                text=text,
                title=title,
                kind=kind,
                page_starts=tuple(starts) if isinstance(starts, list) else None,
            )
    raise _Refused(f"a text of the wrong shape ({_shape(fields)})")


def _page_map(starts: object, length: int) -> bool:
    """Whether ``starts`` is a page map of a text of ``length``: none, or offsets from 0 up."""
    if starts is None:
        return True
    if not isinstance(starts, list) or not starts or starts[0] != 0:
        return False
    if any(type(o) is not int for o in starts):
        return False
    return all(a <= b for a, b in zip(starts, starts[1:], strict=False)) and starts[-1] <= length


def _given(kind: str, job: _Job) -> float | None:
    """The limit of ``kind`` the reader was given for ``job``, if it is one."""
    ocr = job.ocr or OcrConfig()
    given: dict[str, float] = {
        "time": job.cpu_seconds,
        "pages": job.max_pages,
        "text": job.max_text_chars,
        "size": job.max_bytes,
        "ocr_time": ocr.page_timeout,
        "ocr_pages": ocr.max_pages,
    }
    return given.get(kind)


def _shape(value: object) -> str:
    """What ``value`` is, in a few words for the log (never its content)."""
    if isinstance(value, list):
        head = (
            f" {value[0]!r}" if value and isinstance(value[0], str) and len(value[0]) < 20 else ""
        )
        return f"a list of {len(value)}{head}"
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    return type(value).__name__


def _reader_env(root: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _ENV_PASSED or k.startswith(_ENV_PREFIXES)}
    path = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([root, path] if path else [root])
    # numpy is imported with the extractors: one BLAS thread keeps its address space small.
    env["OPENBLAS_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    # Tesseract's OpenMP threads, one per core in each reader of the pool, fight each other
    # and the server for the cores: one thread reads a page in a third of the CPU time and
    # less wall time on 2 cores (docs/benchmarks.md). Only the readers' own environment:
    # the server's embedding model keeps its threads. An operator's own limit is kept.
    env.setdefault("OMP_THREAD_LIMIT", "1")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass(eq=False)
class _Ticket:
    """One read waiting for a reader: whether it may take the quick lane, and the lane
    it was granted (``None`` while it waits)."""

    small: bool
    lane: str | None = None


class ReaderPool:
    """At most ``size`` warm reader processes, and one more for small documents,
    handed out fairly among owners.

    An owner waits when every reader is busy, or when it already holds
    ``size - 1`` of them (``size`` > 1) so that one is always left for someone
    else. Of the owners waiting, the one holding the fewest readers goes first,
    round-robin among equals. A document of at most ``QUICK_LANE_BYTES`` may also
    take the quick lane, a reader of its own beside the pool's, when the pool is
    busy: a person's small upload is never queued behind others' slow files.
    """

    def __init__(self, size: int, *, serve_with: str = _SERVE) -> None:
        self.size = max(1, size)
        self.serve_with = serve_with
        self.per_owner = max(1, self.size - 1)
        self._cond = threading.Condition()
        self._idle: list[_Reader] = []
        self._busy = {_POOL: 0, _QUICK: 0}
        self._held: Counter[str] = Counter()
        self._queues: dict[str, deque[_Ticket]] = {}  # each waiting owner's tickets, in turn order
        self._closed = False
        remove_killed_readers_dirs()

    def waiting(self) -> int:
        """How many reads wait for a reader."""
        with self._cond:
            return sum(len(q) for q in self._queues.values())

    def reading(self) -> int:
        """How many documents are being read now."""
        with self._cond:
            return sum(self._busy.values())

    @contextlib.contextmanager
    def _reader(self, owner: str, sandbox: ReaderSandbox, *, small: bool) -> Iterator[_Reader]:
        ticket = _Ticket(small)
        with self._cond:
            self._queues.setdefault(owner, deque()).append(ticket)
            self._dispatch()
            while ticket.lane is None:
                self._cond.wait()
            reader = self._idle.pop() if self._idle else None
        try:
            if reader is not None and (not reader.alive() or reader.sandbox != sandbox):
                _stop(reader)
                reader = None
            if reader is None:
                reader = _Reader(sandbox, self.serve_with)
            yield reader
        finally:
            keep = reader is not None and not reader.retire and reader.alive()
            if reader is not None and reader.done >= _JOBS_PER_READER:
                keep = False
            if reader is not None and not keep:
                _stop(reader)
            with self._cond:
                self._busy[ticket.lane] -= 1
                self._held[owner] -= 1
                if not self._held[owner]:
                    del self._held[owner]
                if keep and reader is not None and not self._closed:
                    self._idle.append(reader)
                elif keep and reader is not None:
                    _stop(reader)
                self._dispatch()

    def _dispatch(self) -> None:
        """Grant free readers to waiting owners, fewest held first (called holding the lock)."""
        granted = False
        while (grant := self._next()) is not None:
            owner, ticket, lane = grant
            queue = self._queues.pop(owner)
            queue.remove(ticket)
            if queue:
                self._queues[owner] = queue  # to the back of the turn order
            ticket.lane = lane
            self._busy[lane] += 1
            self._held[owner] += 1
            granted = True
        if granted:
            self._cond.notify_all()

    def _next(self) -> tuple[str, _Ticket, str] | None:
        """The owner, ticket and lane to grant next, if a reader is free for one."""
        # Stable: among owners holding as many, the turn order decides.
        owners = sorted(self._queues, key=lambda o: self._held[o])
        if self._busy[_POOL] < self.size:
            for owner in owners:
                if self._held[owner] < self.per_owner:
                    return owner, self._queues[owner][0], _POOL
        if self._busy[_QUICK] < _QUICK_READERS:
            for owner in owners:
                small = next((t for t in self._queues[owner] if t.small), None)
                if small is not None:
                    return owner, small, _QUICK
        return None

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
        sandbox = ReaderSandbox(limits.sandbox, (ocr or OcrConfig()).tesseract_cmd)
        with self._reader(owner, sandbox, small=len(data) <= QUICK_LANE_BYTES) as reader:
            try:
                return reader.run(job, name, limits)
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


def _temp_prefix(pid: int) -> str:
    """The start of the name of a temporary directory of a reader of process ``pid``."""
    return f"{_host_prefix() or 'kb-reader-'}{pid}-"


def _host_prefix() -> str:
    """The start of the names of the directories of readers of this host's processes that
    see this one's process ids (its PID namespace: a container's ``pid 1`` is another
    process outside it); another host, or another namespace sharing the temporary
    directory, is never mistaken for this one. Empty where the namespace cannot be read."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    seen_from = f"{socket.gethostname()}\0{namespace}".encode()
    return f"kb-reader-{hashlib.blake2b(seen_from, digest_size=4).hexdigest()}-"


def remove_killed_readers_dirs() -> list[Path]:
    """Remove the temporary directories of readers whose process is gone; return them.

    A process stopped in order removes its readers' directories; one killed
    (``SIGKILL``, out of memory) cannot, and a scan read by Tesseract leaves its
    page images there. Only directories of processes this one can see are
    looked at (:func:`_host_prefix`); one of a running process, of another
    user, or a link, stays.
    """
    prefix = _host_prefix()
    if not prefix:
        return []
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = path.name.removeprefix(prefix).split("-", 1)[0]
        if not pid.isdigit() or _running(int(pid)):
            continue
        try:
            info = path.lstat()
        except OSError:
            continue
        if not path.is_dir() or path.is_symlink() or info.st_uid != os.getuid():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _running(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


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
    # The parsers load before the reader confines itself: what they read to load
    # (their modules, shared libraries) is not what reading a document needs. Pillow
    # (pypdf decodes a page's images with it) and Tesseract's wrapper load on first use
    # elsewhere, so they are named here.
    import pytesseract  # noqa: F401
    from PIL import Image  # noqa: F401

    from index.ingest.extract import extract
    from index.ingest.ocr import reading_until

    if confinement:
        try:
            confine(Confinement.from_json(confinement))
        except SandboxFailed as exc:  # asked for, it is never skipped: the server says why
            sys.exit(f"the document reader could not confine itself: {exc}")

    jobs = Connection(jobs_fd, writable=False)
    results = Connection(results_fd, readable=False)
    logging.getLogger().addHandler(_ToParent(results))
    started_size = _address_space()
    _send(results, ["ready"])
    while True:
        try:
            job = _Job.from_messages(jobs.recv_bytes(), jobs.recv_bytes())
        except (EOFError, OSError):
            return
        reply: list[Any]
        try:
            with _limits(job), reading_until(*_ocr_deadline(job.cpu_seconds)):
                extracted = extract(
                    job.data,
                    job.filename,
                    max_bytes=job.max_bytes,
                    max_pages=job.max_pages,
                    max_text_chars=job.max_text_chars,
                    ocr=job.ocr,
                )
            reply = ["ok", _fields(extracted), _grown(started_size)]
        except MemoryError:
            reply = ["memory"]
        except ExtractionError as exc:
            if _caused_by_memory(exc):
                reply = ["memory"]
            else:
                reason = exc.reason[:_MOST_REASON_CHARS]
                name = type(exc).__name__ if type(exc).__name__ in _ERRORS else "ExtractionError"
                kind = (
                    exc.kind if exc.kind in _ERROR_KINDS[name] else next(iter(_ERROR_KINDS[name]))
                )
                reply = ["error", name, reason, kind, _grown(started_size)]
        except Exception as exc:  # a bug in an extractor: the parent logs it
            reply = ["crash", type(exc).__name__[:200], str(exc)[:500]]
        del job
        _send(results, reply)
        if reply[0] in ("memory", "crash"):
            return


def _send(results: Connection, message: list[Any]) -> None:
    # A PDF's broken character map can give a lone surrogate: kept as it is
    # (``json.loads`` of bytes decodes with ``surrogatepass``).
    results.send_bytes(json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _fields(extracted: Extracted) -> dict[str, object]:
    return {
        "text": extracted.text,
        "title": extracted.title,
        "kind": extracted.kind,
        "page_starts": list(extracted.page_starts) if extracted.page_starts is not None else None,
    }


def _ocr_deadline(seconds: float) -> tuple[float, float]:
    """When OCR stops for a document of ``seconds``: a little before the parent's clock
    runs out, so the reader says so itself."""
    margin = min(_OCR_MARGIN, seconds * _OCR_MARGIN_SHARE)
    return time.monotonic() + seconds - margin, seconds


class _ToParent(logging.Handler):
    """Sends the extractors' warnings to the parent, which logs them (``_relog``)."""

    def __init__(self, results: Connection) -> None:
        super().__init__(logging.WARNING)
        self.results = results

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = record.levelno if record.levelno in _LOG_LEVELS else logging.WARNING
            message = ["log", level, record.name[:200], record.getMessage()[:2000]]
            _send(self.results, message)
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
