"""Reading what every source sends alike: times, checkpoints, file names, a listing's pages.

A file a source holds is read when the product's extractor reads its name's
suffix, or else its media type (``readable_suffix``).

A source's answers are hostile input: a time that is not one reads as ``None``
(the caller decides what that means), a checkpoint that cannot be read fails
the run with what to do, a title becomes a file name that names no path, and
a listing that never ends (:class:`Listing`) fails the run.
"""

from __future__ import annotations

import hashlib
import json
import mimetypes
import re
from datetime import UTC, datetime

from index.ingest import SUPPORTED_SUFFIXES
from index.sources.contract import SourceFailed

__all__ = [
    "MAX_EMPTY_PAGES",
    "Listing",
    "checkpoint_of",
    "checkpoint_time",
    "expired",
    "expiry",
    "file_name",
    "media_type_of",
    "readable_name",
    "readable_suffix",
    "timestamp",
]

# Pages one listing follows at most (a million results at 50 a page, and more at larger pages).
MAX_PAGES = 20_000
# Empty pages in a row a listing may give, each pointing at another, before it counts as
# one that never ends: generous, as Google Drive may answer empty pages while it searches.
MAX_EMPTY_PAGES = 100
# Path separators and control characters: a title is never a path.
_NOT_IN_NAMES = re.compile(r"[\\/\x00-\x1f]+")
_MOST_NAME_CHARS = 120
# The earliest time a poll starts from: before any source's documents.
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
_PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
_DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
# The suffix a media type means, for a file whose name has none the extractor reads.
_SUFFIX_OF_TYPE = {
    "application/pdf": ".pdf",
    "text/plain": ".txt",
    "text/markdown": ".md",
    "text/html": ".html",
    "text/csv": ".csv",
    _DOCX: ".docx",
    _PPTX: ".pptx",
    _XLSX: ".xlsx",
}
_TYPE_OF_SUFFIX = {suffix: media for media, suffix in _SUFFIX_OF_TYPE.items()}


def timestamp(value: object) -> datetime | None:
    """An ISO 8601 time a source sent (``Z`` or an offset; none: UTC); ``None`` if it is not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def expired(value: object, now: float) -> bool:
    """Whether a permission's expiry time a source sent has passed at ``now`` (epoch
    seconds): none sent (``None``) never expires; one that is not a time has passed
    (what it allows is not known)."""
    if value is None:
        return False
    when = timestamp(value)
    return when is None or when.timestamp() <= now


def expiry(value: object) -> float | None:
    """When a permission a source sent an expiry time for stops admitting (epoch seconds);
    ``None``: none sent, or one that is not a time (:func:`expired` says it has passed)."""
    when = timestamp(value) if value is not None else None
    return None if when is None else when.timestamp()


def checkpoint_time(checkpoint: str) -> datetime:
    """The time a ``{"since": ...}`` checkpoint polls from, at most now and at least 1970.

    Raises:
        SourceFailed: the checkpoint cannot be read (``kb source sync --full`` reloads).
    """
    try:
        found = timestamp(json.loads(checkpoint).get("since"))
    except (ValueError, AttributeError):
        found = None
    if found is None:
        raise SourceFailed("The saved checkpoint cannot be read; kb source sync --full reloads.")
    return _within(found)


def checkpoint_of(latest: datetime | None) -> str:
    """The ``{"since": ...}`` checkpoint of a poll whose latest change is ``latest`` (none:
    now), read back by :func:`checkpoint_time`."""
    return json.dumps({"since": _within(latest or datetime.now(UTC)).isoformat()})


def _within(when: datetime) -> datetime:
    """``when``, at most now and at least 1970: a source's clock is its own, and a time it
    gave in the future would put every later edit before the checkpoint, one in the year 1
    leaves no room for a poll's overlap."""
    return min(max(when, _EARLIEST), datetime.now(UTC))


class Listing:
    """The pages of one listing followed so far, which tell a listing that never ends.

    A source's next page (a cursor, a token or a link) is hostile input: one it gave
    before would go round for ever, and a fresh one each time after an empty page would
    hold the run for every request the listing may make. Google Drive does answer some
    empty pages with a next page while it searches, so only :data:`MAX_EMPTY_PAGES` in
    a row end the listing.

    Args:
        source: what people call the source ("Google Drive"), for the message.
        first: the listing's first page, when it has one to be pointed back at.
    """

    def __init__(self, source: str, first: str | None = None) -> None:
        self.source = source
        # Each page's digest: a source's cursor may be of any length.
        self._seen = {_page_digest(first)} if first else set()
        self._empty = 0
        self._pages = 1

    def next_page(self, following: str, *, empty: bool) -> str:
        """``following``, the next page after one that held nothing when ``empty``.

        Raises:
            SourceFailed: the listing gave it before, or gave :data:`MAX_EMPTY_PAGES` empty
                pages in a row (following it would go on for ever), or it would be page
                :data:`MAX_PAGES` + 1.
        """
        self._pages += 1
        if self._pages > MAX_PAGES:
            raise SourceFailed(
                f"{self.source} gave more than {MAX_PAGES} pages of a listing; the run stopped."
            )
        digest = _page_digest(following)
        if digest in self._seen:
            raise SourceFailed(
                f"{self.source} pointed the next page of a listing at one it had given before "
                "(a listing that never ends); the run stopped."
            )
        self._empty = self._empty + 1 if empty else 0
        if self._empty >= MAX_EMPTY_PAGES:
            raise SourceFailed(
                f"{self.source} gave {self._empty} empty pages of a listing in a row, each "
                "pointing at another (a listing that never ends); the run stopped and removed "
                "nothing."
            )
        self._seen.add(digest)
        return following


def _page_digest(page: str) -> bytes:
    return hashlib.blake2b(page.encode(errors="surrogatepass"), digest_size=16).digest()


def file_name(title: str, fallback: str) -> str:
    """``title`` as a file name's stem: no separators or control characters, at most 120 characters."""
    return _NOT_IN_NAMES.sub(" ", title).strip()[:_MOST_NAME_CHARS] or fallback


def readable_suffix(name: str, media_type: str) -> str | None:
    """The suffix the extractor reads ``name`` by (its own, else its media type's); ``None``:
    a file the product does not read."""
    dot = name.rfind(".")
    suffix = name[dot:].lower() if dot > 0 else ""
    if suffix in SUPPORTED_SUFFIXES:
        return suffix
    return _SUFFIX_OF_TYPE.get(media_type)


def media_type_of(name: str) -> str:
    """The media type of a file the extractor reads by ``name``'s suffix."""
    suffix = readable_suffix(name, "") or ""
    return (
        _TYPE_OF_SUFFIX.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
    )


def readable_name(name: str, media_type: str) -> str:
    """``name`` as a safe file name ending with the suffix the extractor reads it by."""
    safe = file_name(name, "file")
    suffix = readable_suffix(name, media_type) or ""
    return safe if safe.lower().endswith(suffix) else f"{safe}{suffix}"
