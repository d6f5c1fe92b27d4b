"""A file's bytes as a source sends them: at most a document's size, within one deadline.

A source's server is hostile input. It may list a file as small and send
gigabytes, or send a byte every few seconds, each within the request's read
timeout, for hours. Every file a connector downloads is read here as its bytes
come (each read returns what has arrived: ``urllib3``'s ``read1``): once more
than ``max_bytes`` came, the rest is never read; once the download's
:class:`Deadline` has passed, counted from when the file was first asked for
(its retries included), it stops. Either way that file alone fails, with the
reason (``TooLarge``, ``ReadingLimit`` of kind ``time``); the run goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import requests
import urllib3

from index.config import DEFAULT_DOWNLOAD_TIMEOUT, DEFAULT_MAX_UPLOAD_BYTES
from index.errors import ReadingLimit, TooLarge

__all__ = ["PLAIN", "READ_BYTES", "Deadline", "DownloadLimits", "read_capped", "too_large"]

# The most one read takes from the connection; it returns sooner with what has arrived.
READ_BYTES = 1 << 16
# What a download asks for: the bytes as stored, so that the count is of what is kept.
PLAIN = {"Accept-Encoding": "identity"}


@dataclass(frozen=True)
class DownloadLimits:
    """What one file a source downloads may cost, as the product's settings say.

    Attributes:
        max_bytes: its size (``KB_MAX_UPLOAD_BYTES``, an upload's limit).
        seconds: its download's time in all (``KB_DOWNLOAD_TIMEOUT``, a Slack file's).
    """

    max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    seconds: float = DEFAULT_DOWNLOAD_TIMEOUT


@dataclass(frozen=True)
class Deadline:
    """When one file's download must have ended.

    Attributes:
        seconds: how long it may take.
        clock: the time now (seconds).
        started: when it was first asked for, on ``clock``.
    """

    seconds: float
    clock: Callable[[], float]
    started: float

    @classmethod
    def start(cls, seconds: float, clock: Callable[[], float]) -> Deadline:
        """A deadline ``seconds`` from now."""
        return cls(seconds, clock, clock())

    def check(self, name: str) -> None:
        """Raises ``ReadingLimit`` (``time``) once the deadline has passed."""
        if self.clock() - self.started > self.seconds:
            raise ReadingLimit(
                f"{name} took longer to download than the {self.seconds:g} s one file may "
                "take; skipped.",
                kind="time",
                limit=self.seconds,
                filename=name,
            )


def read_capped(
    response: requests.Response, name: str, *, max_bytes: int, deadline: Deadline
) -> bytes:
    """The body of ``response`` (asked for with ``stream=True``), read as it comes.

    Raises:
        TooLarge: more than ``max_bytes`` came (or were announced): the rest is never read.
        ReadingLimit: ``deadline`` passed first (``kind`` ``time``).
        requests.RequestException: the connection broke off (as ``iter_content`` says it).
    """
    declared = response.headers.get("Content-Length", "")
    data = bytearray()
    try:
        if declared.isdigit() and int(declared) > max_bytes:
            raise too_large(name, max_bytes)
        while True:
            deadline.check(name)
            chunk = response.raw.read1(READ_BYTES, decode_content=True)
            if not chunk:
                break
            data += chunk
            if len(data) > max_bytes:
                raise too_large(name, max_bytes)
    except urllib3.exceptions.ReadTimeoutError as exc:
        raise requests.ConnectionError(exc) from None
    except urllib3.exceptions.ProtocolError as exc:
        raise requests.exceptions.ChunkedEncodingError(exc) from None
    except urllib3.exceptions.DecodeError as exc:
        raise requests.exceptions.ContentDecodingError(exc) from None
    finally:
        response.close()
    deadline.check(name)
    return bytes(data)


def too_large(name: str, max_bytes: int) -> TooLarge:
    """Why file ``name`` is not taken: over ``max_bytes``."""
    limit = f"{max_bytes // 2**20} MB" if max_bytes >= 2**20 else f"{max_bytes} bytes"
    reason = f"{name} is over the {limit} a document may be; skipped."
    return TooLarge(reason, filename=name, limit=max_bytes)
