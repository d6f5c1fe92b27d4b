"""Confining a reader process, so that a parser exploit in it cannot reach the server's secrets.

A reader (``index.ingest.isolated``) parses untrusted bytes with pypdf, lxml,
openpyxl, Pillow and Tesseract, as the server's user. Before it reads any
document it calls ``confine``, and from then on, for the rest of its life and
its children's (Tesseract), the kernel lets it:

- read and execute only what reading needs: the interpreter's standard library
  and site-packages, the project's ``index`` package, the shared libraries,
  Tesseract and its data (``/usr/lib*``, ``/usr/share``, ``/etc/ld.so.cache``),
  ``/dev/null`` and its own ``/proc`` entry. Not the data dir (SQLite, the link
  secret, the originals), not ``.env``, not the rest of the checkout, not
  another process's ``/proc`` (the server's environment);
- write, create and remove files only in its own temporary directory, which the
  server makes for it, names in ``TMPDIR`` and removes when the reader stops;
- open no socket of any kind (a seccomp filter: no TCP, UDP, UNIX-path or
  abstract socket, no netlink) and, with Landlock ABI >= 4, bind or connect no
  TCP port; with ABI >= 6 signal no process and reach no abstract UNIX socket
  outside itself;
- gain no privilege (``PR_SET_NO_NEW_PRIVS``: a set-user-ID program runs as the
  reader's user), write no file over ``MAX_FILE_BYTES`` and no core dump.

Landlock is the kernel's own sandbox for unprivileged processes (Linux 5.13 and
later, when it is enabled): no user namespace, no helper binary, no root. Its
three system calls and the seccomp filter are called through ``ctypes``. Where
the kernel has no Landlock, ``KB_READER_SANDBOX`` decides (``ExtractLimits.sandbox``):
``auto`` reads unconfined and says so (``readers_status``: the server's log at start,
``/readyz``, ``kb status``), ``required`` refuses to read (``ReadersUnconfined``),
``off`` never confines.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import resource
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

from index.config import DEFAULT_READER_SANDBOX
from index.errors import ReadersUnconfined

__all__ = [
    "MAX_FILE_BYTES",
    "Confinement",
    "ReaderSandbox",
    "SandboxFailed",
    "Support",
    "confine",
    "kernel_support",
    "readers_status",
]

# Largest file a reader may write (RLIMIT_FSIZE): Tesseract's copy of one page
# image, which the reader's memory limit already bounds, fits many times over.
MAX_FILE_BYTES = 1024**3
# Files a reader may hold open: Python, its pipes and a Tesseract run need a few dozen.
_MAX_OPEN_FILES = 256

# ---------------------------------------------------------------- the kernel's interface
# <linux/landlock.h>: one system call number on every architecture.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_SECCOMP, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 21, 22, 2

# Filesystem rights, each with the ABI that brought it.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
_MAKE_REG, _MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
_MAKE_SYM, _REFER, _TRUNCATE, _IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: _REFER, 3: _TRUNCATE, 5: _IOCTL_DEV}
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_READ = _READ_FILE | _READ_DIR | _EXECUTE
_WORK = (
    _READ_FILE
    | _READ_DIR
    | _WRITE_FILE
    | _TRUNCATE
    | _REMOVE_DIR
    | _REMOVE_FILE
    | _MAKE_DIR
    | _MAKE_REG
    | _REFER
)
# ABI 4: TCP, no rule granting any port; ABI 6: abstract UNIX sockets and signals.
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1

# seccomp: the architectures whose ``socket`` system call the filter knows.
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYS_SOCKET = {"x86_64": 41, "aarch64": 198}
_SYS_IO_URING_SETUP = 425  # io_uring can open sockets without calling socket()
_X32_SYSCALL_BIT = 0x40000000


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


class SandboxFailed(OSError):
    """The kernel refused a step of confining this process."""


@cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _syscall(step: str, *args: object) -> int:
    # syscall(2) reads every argument as a long: pass them as such, not as C ints.
    longs = (ctypes.c_long(a) if isinstance(a, int) else a for a in args)
    result = int(_libc().syscall(*longs))
    if result == -1:
        code = ctypes.get_errno()
        raise SandboxFailed(code, f"{step}: {os.strerror(code)}")
    return result


def _prctl(step: str, *args: int) -> int:
    result = int(_libc().prctl(*(ctypes.c_ulong(a) for a in args)))
    if result == -1:
        code = ctypes.get_errno()
        raise SandboxFailed(code, f"{step}: {os.strerror(code)}")
    return result


# ---------------------------------------------------------------- what the kernel offers


@dataclass(frozen=True)
class Support:
    """What this kernel can confine a reader with.

    Attributes:
        landlock_abi: Landlock's ABI version; 0: none (``reason`` says why).
        seccomp: whether the socket filter can be installed (a known architecture).
        reason: why there is no Landlock, a sentence for the operator; "" when there is.
    """

    landlock_abi: int
    seccomp: bool
    reason: str


@cache
def kernel_support() -> Support:
    """What this kernel offers (asked once per process: the kernel does not change)."""
    if sys.platform != "linux":
        return Support(0, False, f"only Linux has Landlock, and this is {sys.platform}")
    seccomp = platform.machine() in _AUDIT_ARCH and _seccomp_available()
    try:
        abi = _syscall(
            "landlock_create_ruleset", _SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION
        )
    except SandboxFailed as exc:
        return Support(0, seccomp, _why_no_landlock(exc.errno))
    return Support(abi, seccomp, "")


def _why_no_landlock(code: int | None) -> str:
    kernel = platform.release()
    if code == errno.ENOSYS:
        return (
            f"this kernel ({kernel}) has no Landlock: it is older than Linux 5.13 or was "
            "built without CONFIG_SECURITY_LANDLOCK"
        )
    if code == errno.EOPNOTSUPP:
        return (
            f"Landlock is built into this kernel ({kernel}) but not enabled: add landlock "
            "to the lsm= list of the kernel's command line"
        )
    return (
        f"the Landlock system calls are refused here ({os.strerror(code or 0)}): a "
        "seccomp profile may block them (a container's, or a systemd unit's "
        "SystemCallFilter)"
    )


def _seccomp_available() -> bool:
    try:
        # 0: no filter yet; 2: filtered already (a container), more filters stack.
        return _prctl("prctl(PR_GET_SECCOMP)", _PR_GET_SECCOMP, 0, 0, 0, 0) in (0, 2)
    except SandboxFailed:
        return False


def readers_status(mode: str) -> dict[str, object]:
    """What readers are held to under ``mode`` on this kernel: facts for ``/readyz`` and
    ``kb status``, and ``summary``, the sentence the server logs at start."""
    support = kernel_support()
    confined = mode != "off" and support.landlock_abi > 0
    reason = "" if confined else "KB_READER_SANDBOX is off" if mode == "off" else support.reason
    sockets = "open"
    if confined and support.seccomp:
        sockets = "none"
    elif confined and support.landlock_abi >= 4:
        sockets = "no TCP"
    if confined:
        summary = (
            f"document readers are confined (Landlock ABI {support.landlock_abi}): they read "
            "only what reading needs, write only their own temporary directory, sockets: "
            f"{sockets}"
        )
    elif mode == "required":
        summary = f"documents are not read: KB_READER_SANDBOX is required and {reason}"
    else:
        summary = (
            f"document readers are not confined ({reason}): a parser exploit could reach "
            "the data dir, .env and the network"
        )
    return {
        "mode": mode,
        "confined": confined,
        "landlock_abi": support.landlock_abi,
        "sockets": sockets,
        "signals_scoped": confined and support.landlock_abi >= 6,
        "reason": reason,
        "summary": summary,
    }


# ---------------------------------------------------------------- the server's side


@dataclass(frozen=True)
class ReaderSandbox:
    """How the server confines its readers: the mode and the Tesseract they may run.

    Readers started for one ``ReaderSandbox`` serve only documents read with it.
    """

    mode: str = DEFAULT_READER_SANDBOX
    tesseract_cmd: str = "tesseract"

    def confinement(self, temp_dir: str) -> Confinement | None:
        """What a reader whose temporary directory is ``temp_dir`` may reach; None: unconfined.

        Raises:
            ReadersUnconfined: ``required`` on a kernel that cannot confine.
        """
        if self.mode == "off":
            return None
        support = kernel_support()
        if not support.landlock_abi:
            if self.mode == "required":
                raise ReadersUnconfined(
                    "Documents are not read: KB_READER_SANDBOX is required but the document "
                    f"readers cannot be confined ({support.reason}). Run the server on a "
                    "kernel with Landlock, or set KB_READER_SANDBOX=auto to read unconfined."
                )
            return None
        return Confinement(
            temp_dir=temp_dir,
            readable=tuple(sorted({*_python_paths(), *_reading_paths(self.tesseract_cmd)})),
            writable=_measurement_dirs(),
        )


@dataclass(frozen=True)
class Confinement:
    """What one reader may reach once confined (built by the server, applied by the reader).

    Attributes:
        temp_dir: the reader's own directory, where it may write.
        readable: files and directories it may read and execute (and list).
        writable: other directories it may write (``_measurement_dirs``).
    """

    temp_dir: str
    readable: tuple[str, ...]
    writable: tuple[str, ...] = ()

    def to_json(self) -> str:
        """The form passed on a reader's command line."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Confinement:
        """``to_json``'s text back."""
        fields = json.loads(text)
        return cls(
            temp_dir=str(fields["temp_dir"]),
            readable=tuple(map(str, fields["readable"])),
            writable=tuple(map(str, fields["writable"])),
        )


def _python_paths() -> set[str]:
    """What this interpreter imports from: its standard library and site-packages, and the
    project's ``index`` package. Not the checkout's root: ``.env`` and the default data dir
    (``kb-data``) sit there."""
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths = {
        Path(p) for name, p in sysconfig.get_paths().items() if name.endswith(("lib", "stdlib"))
    }
    # Directories a .pth file added inside the interpreter's prefixes (not the test runner's).
    paths |= {
        Path(p)
        for p in sys.path
        if p and any(Path(p).resolve().is_relative_to(prefix) for prefix in prefixes)
    }
    paths.add(Path(__file__).resolve().parents[1])  # index/
    return {str(p.resolve()) for p in paths if p.is_dir()}


def _measurement_dirs() -> tuple[str, ...]:
    """Where coverage.py, when it measures this process (the test suite, never a server),
    has its readers write their data: a directory of its own (``[tool.coverage.run]
    data_file``), made now so that it can be granted."""
    coverage = sys.modules.get("coverage")
    current = coverage.Coverage.current() if coverage is not None else None
    if current is None:
        return ()
    # Relative to where it was started, the configuration's directory (tests change theirs).
    config_file = current.config.config_file
    started_in = Path(config_file).resolve().parent if config_file else Path.cwd()
    directory = (started_in / current.config.data_file).parent
    directory.mkdir(parents=True, exist_ok=True)
    return (str(directory),)


def _reading_paths(tesseract_cmd: str) -> set[str]:
    """The shared libraries, Tesseract and its data, and the few files outside them they read."""
    paths = {
        "/usr/lib",
        "/usr/lib64",
        "/usr/share",  # tessdata, locales
        "/etc/ld.so.cache",  # the dynamic loader's index of libraries (Tesseract)
    }
    tesseract = shutil.which(tesseract_cmd)
    if tesseract:
        binary = Path(tesseract).resolve()
        paths.add(str(binary))
        prefix = binary.parent.parent  # a Tesseract of its own prefix: its lib/ and share/
        paths |= {str(prefix / "lib"), str(prefix / "share")}
    if tessdata := os.environ.get("TESSDATA_PREFIX"):
        paths.add(tessdata)
    return {str(Path(p).resolve()) for p in paths if os.path.exists(p)}


# ---------------------------------------------------------------- the reader's side


def confine(confinement: Confinement) -> None:
    """Confine this process and its future children for the rest of their lives.

    Called by a reader before it reads anything, while it has one thread (Landlock
    and the seccomp filter hold the calling thread and the threads and processes
    it starts afterwards).

    Raises:
        SandboxFailed: a step the kernel refused; the process may be partly confined.
    """
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise SandboxFailed(
            errno.EBUSY, f"a reader confines itself alone, not with {threads} threads"
        )
    support = kernel_support()
    # Where Tesseract and pytesseract write their files: the one place left writable.
    os.environ["TMPDIR"] = tempfile.tempdir = confinement.temp_dir
    _limit_resources()
    _prctl("prctl(PR_SET_NO_NEW_PRIVS)", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _restrict_self(confinement, support.landlock_abi)
    if support.seccomp:
        _deny_sockets()


def _limit_resources() -> None:
    for limit, value in (
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_FSIZE, MAX_FILE_BYTES),
        (resource.RLIMIT_NOFILE, _MAX_OPEN_FILES),
    ):
        _, hard = resource.getrlimit(limit)
        lower = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (lower, lower))


def _restrict_self(confinement: Confinement, abi: int) -> None:
    handled_fs = sum(rights for since, rights in _FS_BY_ABI.items() if abi >= since)
    attr = _RulesetAttr(
        handled_access_fs=handled_fs,
        handled_access_net=_NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0,
        scoped=_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0,
    )
    # Each ABI's struct is a prefix of the next: older kernels take a shorter one.
    size = 8 if abi < 4 else 16 if abi < 6 else ctypes.sizeof(attr)
    ruleset = _syscall("landlock_create_ruleset", _SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    try:
        for path in confinement.readable:
            _allow(ruleset, path, _READ & handled_fs)
        _allow(ruleset, "/dev/null", (_READ_FILE | _WRITE_FILE) & handled_fs)
        # Opened here, /proc/self is this reader's own entry (its memory: /proc/self/statm).
        _allow(ruleset, "/proc/self", (_READ_FILE | _READ_DIR) & handled_fs)
        for path in (confinement.temp_dir, *confinement.writable):
            _allow(ruleset, path, _WORK & handled_fs)
        _syscall("landlock_restrict_self", _SYS_RESTRICT_SELF, ruleset, 0)
    finally:
        os.close(ruleset)


def _allow(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # gone since the server listed it: nothing to grant
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        _syscall(
            f"landlock_add_rule({path})",
            _SYS_ADD_RULE,
            ruleset,
            _RULE_PATH_BENEATH,
            ctypes.byref(rule),
            0,
        )
    finally:
        os.close(fd)


def _deny_sockets() -> None:
    """Opening a socket of any kind fails with EPERM (``io_uring_setup`` too: io_uring
    opens sockets without calling ``socket``)."""
    _filter_out((_SYS_SOCKET[platform.machine()], _SYS_IO_URING_SETUP), errno.EPERM)


def _filter_out(syscalls: tuple[int, ...], error: int) -> None:
    """A seccomp filter on this process and its future children: each of ``syscalls``
    fails with ``error``, and so does every system call made through another ABI
    (x32, or i386's ``int 0x80``), whose numbers differ."""
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    n = len(syscalls)  # the program: 0 arch, 1 check, 2 nr, 3 x32, 4.. each, allow, deny
    program = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 0, n + 3, _AUDIT_ARCH[platform.machine()]),
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
        (jge, n + 1, 0, _X32_SYSCALL_BIT),
        *((jeq, n - i, 0, nr) for i, nr in enumerate(syscalls)),
        (ret, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
        (ret, 0, 0, 0x00050000 | error),  # SECCOMP_RET_ERRNO
    ]
    filters = (_SockFilter * len(program))(*(_SockFilter(*op) for op in program))
    fprog = _SockFprog(len(program), filters)
    mode = (ctypes.c_ulong(_PR_SET_SECCOMP), ctypes.c_ulong(_SECCOMP_MODE_FILTER))
    if int(_libc().prctl(*mode, ctypes.byref(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0))) == -1:
        code = ctypes.get_errno()
        raise SandboxFailed(code, f"prctl(PR_SET_SECCOMP): {os.strerror(code)}")
