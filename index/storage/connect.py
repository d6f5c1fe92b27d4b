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
    scheme = urlsplit(url).scheme
    if scheme not in POSTGRES_SCHEMES:
        raise DatabaseUnavailable(
            f"KB_DATABASE_URL must be a postgresql:// URL (or empty for SQLite in the data "
            f"dir), not a {scheme or 'schemeless'} URL: {masked_url(url)}."
        )
    from index.storage.postgres import PostgresDatabase  # psycopg only where it is used

    return PostgresDatabase(url, data_dir)
