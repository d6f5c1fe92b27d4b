"""A process that confines itself as a document reader does, then tries what an exploit would.

Test-only (``tests/test_reader_sandbox.py`` starts it the way the server starts a
reader: the same interpreter, working directory, environment and confinement);
nothing a document holds can reach it. Its two arguments: the confinement
(``Confinement.to_json``, empty: none) and the attempts, a JSON list of
``[kind, argument]``. It prints one JSON object: each attempt's outcome in order,
``{"ok": ...}`` or ``{"errno": "EACCES"}``.

With ``--without-landlock`` first, it makes the Landlock system calls fail as on a
kernel without Landlock (a seccomp filter answering ENOSYS, which its readers
inherit), and prints what the server does there: ``readers_status`` and a real
read through the reader pool in each mode.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

# As in a reader (index.ingest.isolated.serve): the reading package and its parsers are
# imported before it confines itself.
import index.ingest.extract  # noqa: F401
import index.ingest.isolated  # noqa: F401
import index.ingest.ocr  # noqa: F401
from index.ingest import sandbox


def main(confinement: str, attempts: str) -> None:
    """Confine this process to ``confinement`` and run ``attempts``."""
    tries = json.loads(attempts)
    # Sockets made before confinement: only Landlock's rules (TCP, the abstract UNIX
    # scope) stand in their way, not the seccomp filter on making one.
    early = {"tcp_early": socket.socket(), "abstract_early": socket.socket(socket.AF_UNIX)}
    if confinement:
        sandbox.confine(sandbox.Confinement.from_json(confinement))
    print(json.dumps([_outcome(kind, arg, early) for kind, arg in tries]))


def _outcome(kind: str, arg: Any, early: dict[str, socket.socket]) -> dict[str, Any]:
    try:
        return {"ok": _attempt(kind, arg, early)}
    except OSError as exc:
        return {"errno": errno.errorcode.get(exc.errno or 0, str(exc.errno))}


def _attempt(kind: str, arg: Any, early: dict[str, socket.socket]) -> Any:
    match kind:
        case "read":
            return Path(arg).read_text(errors="replace")
        case "list":
            return sorted(os.listdir(arg))
        case "write":
            Path(arg).write_text("written by a reader")
            return arg
        case "exec":
            run = subprocess.run([arg, "-c", "true"], stdin=subprocess.DEVNULL, check=False)
            return run.returncode
        case "write_and_exec":
            Path(arg).write_text("#!/bin/sh\necho escaped\n")
            os.chmod(arg, stat.S_IRWXU)
            run = subprocess.run([arg], stdin=subprocess.DEVNULL, capture_output=True, check=False)
            return run.returncode
        case "tcp":
            with socket.create_connection(("127.0.0.1", arg), timeout=5):
                return True
        case "tcp_early":
            early[kind].settimeout(5)
            early[kind].connect(("127.0.0.1", arg))
            return True
        case "abstract_early":
            early[kind].connect("\0" + arg)
            return True
        case "udp":
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                return udp.sendto(b"from a reader", ("127.0.0.1", arg))
        case "unix":
            with socket.socket(socket.AF_UNIX) as unix:
                unix.connect(arg)
                return True
        case "signal":
            os.kill(arg, signal.SIGCONT)  # harmless to the target, yet a signal sent
            return True
        case "extract":
            return _extract(*arg)
    raise ValueError(kind)


def _extract(path: str, name: str) -> str:
    from index.config import OcrConfig
    from index.ingest.extract import extract

    data = Path(path).read_bytes()
    return extract(
        data, name, max_bytes=10**8, max_pages=100, max_text_chars=10**7, ocr=OcrConfig()
    ).text


def without_landlock(document: str) -> None:
    """What the server does on a kernel without Landlock, in each mode."""
    sandbox._prctl("no new privileges", sandbox._PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    sandbox._filter_out(
        (sandbox._SYS_CREATE_RULESET, sandbox._SYS_ADD_RULE, sandbox._SYS_RESTRICT_SELF),
        errno.ENOSYS,
    )
    from index.config import ExtractLimits
    from index.errors import KBError
    from index.ingest.isolated import read_isolated

    data = base64.b64decode(document)
    out: dict[str, Any] = {}
    for mode in ("auto", "required", "off"):
        limits = ExtractLimits(sandbox=mode)
        try:
            text = read_isolated(data, "notes.md", limits=limits, max_bytes=10**6, max_pages=1).text
            read: dict[str, str] = {"text": text}
        except KBError as exc:
            read = {"error": type(exc).__name__, "reason": str(exc)}
        out[mode] = {"status": sandbox.readers_status(mode), "read": read}
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--without-landlock":
        without_landlock(sys.argv[2])
    else:
        main(sys.argv[1], sys.argv[2])
