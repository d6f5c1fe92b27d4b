"""Reader programs that play a reader a parser exploit has taken over.

Each runs where ``index.ingest.isolated.serve`` would (``ReaderPool(serve_with=...)``),
says it is ready as a reader does, takes one document and answers it with what a
reader never sends. The file name the document was sent under is the path a
pickle's ``__reduce__`` would create if the server unpickled it.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
from multiprocessing.connection import Connection

__all__ = ["big", "held", "malformed", "pickled", "wrong_error", "wrong_shape"]


class _Creates:
    """Unpickled, creates the file at ``path``: code run by whoever unpickles it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def _answer(jobs_fd: int, results_fd: int, answer: object) -> None:
    jobs = Connection(jobs_fd, writable=False)
    results = Connection(results_fd, readable=False)
    results.send_bytes(b'["ready"]')
    head = json.loads(jobs.recv_bytes())
    jobs.recv_bytes()
    payload = answer(head["filename"]) if callable(answer) else answer
    results.send_bytes(payload)
    jobs.recv_bytes()  # until the server closes the pipe or kills this process


def pickled(jobs_fd: int, results_fd: int, confinement: str = "") -> None:
    """Answers with a pickle whose loading creates a file (as ``Connection.send`` would)."""
    _answer(jobs_fd, results_fd, lambda path: pickle.dumps(("ok", _Creates(path), False)))


def malformed(jobs_fd: int, results_fd: int, confinement: str = "") -> None:
    """Answers with bytes that are not JSON."""
    _answer(jobs_fd, results_fd, b'["ok", {"text": "unterminated')


def big(jobs_fd: int, results_fd: int, confinement: str = "") -> None:
    """Answers with a valid message of 8 MB, more than a small document's text can be."""
    text = "a" * (8 << 20)
    fields = {"text": text, "title": "t", "kind": "txt", "page_starts": None}
    _answer(jobs_fd, results_fd, json.dumps(["ok", fields, False]).encode())


def wrong_shape(jobs_fd: int, results_fd: int, confinement: str = "") -> None:
    """Answers with JSON of the wrong shape: a page map that is not one."""
    fields = {"text": "abc", "title": "t", "kind": "pdf", "page_starts": [0, 99]}
    _answer(jobs_fd, results_fd, json.dumps(["ok", fields, False]).encode())


def wrong_error(jobs_fd: int, results_fd: int, confinement: str = "") -> None:
    """Answers with an error no reader raises: a class of the server's choosing."""
    message = ["error", "SystemExit", "bye", "unreadable", False]
    _answer(jobs_fd, results_fd, json.dumps(message).encode())


def held(jobs_fd: int, results_fd: int, confinement: str = "") -> None:
    """An honest reader of plain text that, sent a document under the path of a FIFO,
    reads it only once the test has opened that FIFO and closed it again: a slow
    document whose reading the test ends, no clock involved."""
    jobs = Connection(jobs_fd, writable=False)
    results = Connection(results_fd, readable=False)
    results.send_bytes(b'["ready"]')
    while True:
        try:
            head = json.loads(jobs.recv_bytes())
            data = jobs.recv_bytes()
        except (EOFError, OSError):
            return
        path = head["filename"]
        if os.path.exists(path) and stat.S_ISFIFO(os.stat(path).st_mode):
            with open(path) as fifo:  # blocks until the test opens it; read until it closes
                fifo.read()
        fields = {"text": data.decode(), "title": "t", "kind": "txt", "page_starts": None}
        results.send_bytes(json.dumps(["ok", fields, False]).encode())
