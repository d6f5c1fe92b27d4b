"""The engine ``QDRANT_URL`` names, and this process's embedded engines (one per folder).

qdrant-client's local mode and Edge lock their folder, so the knowledge bases
of one data dir share one engine, closed when the process exits.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from index.search.qdrant.client import ClientEngine
from index.search.qdrant.engine import EDGE, QdrantEngine, SearchEngineUnavailable, public_location

if TYPE_CHECKING:
    pass


# Health asks the engine whether it answers within this many seconds (a server).
PROBE_TIMEOUT_SECONDS = 2
INSTALL_HINT = "pip install -e '.[scale]'"


# The embedded engines of this process by folder: qdrant-client's local mode
# and Edge lock their folder, so the knowledge bases of one data dir share one.
_EMBEDDED: dict[str, QdrantEngine] = {}
_EMBEDDED_LOCK = threading.Lock()


@atexit.register
def _close_embedded() -> None:
    # Closed here, not left to the client's __del__, which fails at interpreter exit.
    with _EMBEDDED_LOCK:
        for engine in _EMBEDDED.values():
            close = getattr(getattr(engine, "client", engine), "close", None)
            if close is not None:
                close()
        _EMBEDDED.clear()


def open_engine(url: str, api_key: str, data_dir: Path) -> QdrantEngine:
    """The engine ``QDRANT_URL`` names: a server, ``edge``, ``:memory:``, or empty (embedded).

    Raises:
        SearchEngineUnavailable: the package is missing or the engine cannot be opened.
    """
    where = public_location(url) if url else str(data_dir / "qdrant")
    try:
        if url == EDGE:
            from index.search.qdrant.edge import EdgeEngine

            return _embedded(str((data_dir / "qdrant-edge").resolve()), EdgeEngine)
        from qdrant_client import QdrantClient
    except ImportError as exc:
        raise SearchEngineUnavailable(
            f"KB_SEARCH_ENGINE=qdrant needs the Qdrant packages: {INSTALL_HINT} ({exc})."
        ) from exc
    try:
        if url == ":memory:":
            return ClientEngine(QdrantClient(location=":memory:"), indexed=False)
        if url:
            # No version probe at construction: the first real call reports an
            # unreachable server, as SearchEngineUnavailable.
            key = api_key or None
            client = QdrantClient(url=url, api_key=key, timeout=30, check_compatibility=False)
            probe = QdrantClient(
                url=url, api_key=key, timeout=PROBE_TIMEOUT_SECONDS, check_compatibility=False
            )
            return ClientEngine(client, indexed=True, probe=probe)
        return _embedded(
            str((data_dir / "qdrant").resolve()),
            lambda folder: ClientEngine(QdrantClient(path=folder), indexed=False),
        )
    except Exception as exc:
        reason = str(exc)[:200].replace(api_key, "***") if api_key else str(exc)[:200]
        raise SearchEngineUnavailable(
            f"The Qdrant engine at {where} cannot be opened ({type(exc).__name__}: "
            f"{reason}). An embedded engine "
            "(QDRANT_URL empty) serves one process at a time: stop the other one, or run a "
            "Qdrant server and set QDRANT_URL."
        ) from exc


def _embedded(folder: str, make: Callable[[str], QdrantEngine]) -> QdrantEngine:
    with _EMBEDDED_LOCK:
        if folder not in _EMBEDDED:
            _EMBEDDED[folder] = make(folder)
        return _EMBEDDED[folder]


def release_embedded(engine: QdrantEngine) -> None:
    """Close ``engine`` if it is one of this process's embedded engines, and forget it."""
    with _EMBEDDED_LOCK:
        for folder, held in list(_EMBEDDED.items()):
            if held is engine:
                del _EMBEDDED[folder]
                close = getattr(getattr(engine, "client", engine), "close", None)
                if close is not None:
                    close()
