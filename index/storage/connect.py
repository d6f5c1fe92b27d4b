"""The database a knowledge base's settings name: Postgres for a URL, else SQLite in the data dir."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from index.errors import DatabaseUnavailable
from index.storage.database import POSTGRES_SCHEMES, Database, masked_url
from index.storage.sqlite import SQLiteDatabase


def open_database(data_dir: Path, url: str = "") -> Database:
    """The database of a knowledge base: Postgres at ``url``, else SQLite in ``data_dir``.

    Raises:
        DatabaseUnavailable: ``url`` is not a ``postgresql://`` URL, or the
            database cannot be reached.
    """
    if not url:
        return SQLiteDatabase(data_dir)
    scheme = _checked_url(url)
    if scheme not in POSTGRES_SCHEMES:
        raise DatabaseUnavailable(
            f"KB_DATABASE_URL must be a postgresql:// URL (or empty for SQLite in the data "
            f"dir), not a {scheme or 'schemeless'} URL: {masked_url(url)}."
        )
    from index.storage.postgres import PostgresDatabase  # psycopg only where it is used

    return PostgresDatabase(url, data_dir)


def _checked_url(url: str) -> str:
    """The scheme of ``url``, once its address parses (host, port); its text is never repeated.

    Raises:
        DatabaseUnavailable: an unclosed ``[``, a port that is no number or out of range.
    """
    try:
        parts = urlsplit(url)
        _host, _port = parts.hostname, parts.port
    except ValueError as exc:
        # masked_url cannot parse it either: nothing of it is shown, the password included,
        # nor chained (from None): urllib's message can repeat a part of it.
        raise DatabaseUnavailable(
            f"KB_DATABASE_URL is not a valid URL: {_reason(exc)}. An IPv6 address goes in "
            "[ ], the port after it: postgresql://user:***@[::1]:5432/kb."
        ) from None
    return parts.scheme


def _reason(exc: ValueError) -> str:
    # Only what urllib found, in words of our own: its messages repeat parts of the URL
    # ("Port could not be cast to integer value as 'pa'" of "postgresql://u:pa/ss@h").
    text = str(exc)
    if text == "Invalid IPv6 URL":
        return "a [ without its ] (or a ] without its [)"
    if "out of range" in text:
        return "the port is out of range"
    if "integer" in text:
        return "the port is not a number (a '/' or ':' in the password must be %-encoded)"
    return "the host is not a valid name or address"
