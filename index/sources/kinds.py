"""The kinds of source there are, and how a configured one is opened with its credential.

A source's settings are in the store (``store.sources``); its credential never
is. It is read when the source is opened: from the secret file the settings
name (``token_file``), else the environment variable ``KB_SOURCE_<NAME>_TOKEN``
(the name upper-cased, ``-`` and ``.`` as ``_``), else the kind's own
(``KB_CONFLUENCE_TOKEN``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from index.sources.contract import Connector, SourceError
from index.storage import SourceRow

__all__ = [
    "KINDS",
    "check_name",
    "open_connector",
    "settings_of",
    "token_variable",
]

KINDS = ("confluence",)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_KIND_TOKEN = {"confluence": "KB_CONFLUENCE_TOKEN"}


def check_name(name: str) -> str:
    """``name`` if it may name a source.

    Raises:
        SourceError: it may not.
    """
    if not _NAME.fullmatch(name):
        raise SourceError(
            f"{name!r} cannot name a source: letters, digits, '.', '_' and '-', at most 64."
        )
    return name


def token_variable(name: str) -> str:
    """The environment variable holding source ``name``'s own credential."""
    return "KB_SOURCE_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper() + "_TOKEN"


def settings_of(kind: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` checked for a source of ``kind``, as the store records them.

    Raises:
        SourceError: an unknown kind, or settings it cannot use.
    """
    if kind == "confluence":
        from index.sources.confluence import ConfluenceSettings  # its SDK loads when used

        checked = ConfluenceSettings.from_dict(settings).as_dict()
        if settings.get("token_file"):
            checked["token_file"] = str(settings["token_file"])
        return checked
    raise SourceError(f"There is no source kind {kind!r}; the kinds: {', '.join(KINDS)}.")


def open_connector(row: SourceRow, environ: Mapping[str, str], **options: Any) -> Connector:
    """The connector of the configured source ``row``, with its credential.

    ``options`` go to the connector (``sleep``, ``budget_seconds``).

    Raises:
        SourceError: no credential, or settings it cannot use.
    """
    token = _token(row, environ)
    if row.kind == "confluence":
        from index.sources.confluence import ConfluenceConnector, ConfluenceSettings

        return ConfluenceConnector(ConfluenceSettings.from_dict(row.settings), token, **options)
    raise SourceError(f"Source {row.name} is of kind {row.kind!r}, which this version cannot sync.")


def _token(row: SourceRow, environ: Mapping[str, str]) -> str:
    path = row.settings.get("token_file")
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SourceError(
                f"The secret file of source {row.name} cannot be read: {exc.strerror or exc}."
            ) from None
    token = environ.get(token_variable(row.name)) or environ.get(_KIND_TOKEN.get(row.kind, ""), "")
    if not token:
        raise SourceError(
            f"Source {row.name} has no credential: set {token_variable(row.name)} or "
            f"{_KIND_TOKEN.get(row.kind, 'its token variable')}, or give it a token file."
        )
    return token.strip()
