"""The kinds of source there are, and how a configured one is opened with its credential.

A source's settings are in the store (``store.sources``); its credential never
is. It is read when the source is opened: from the secret file the settings
name (``token_file``), else the kind's token from the product's settings
(``KB_CONFLUENCE_TOKEN``), which the entry point passes in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from index.sources.contract import Connector, SourceError
from index.storage import SourceRow

__all__ = ["KINDS", "TOKEN_SETTINGS", "check_name", "open_connector", "settings_of"]

KINDS = ("confluence",)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# The setting holding each kind's token.
TOKEN_SETTINGS = {"confluence": "KB_CONFLUENCE_TOKEN"}


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


def open_connector(row: SourceRow, tokens: Mapping[str, str], **options: Any) -> Connector:
    """The connector of the configured source ``row``, with its credential.

    ``tokens``: each kind's token from the settings (``{"confluence": ...}``); a
    source's own secret file comes first.

    ``options`` go to the connector (``sleep``, ``budget_seconds``).

    Raises:
        SourceError: no credential, or settings it cannot use.
    """
    token = _token(row, tokens)
    if row.kind == "confluence":
        from index.sources.confluence import ConfluenceConnector, ConfluenceSettings

        return ConfluenceConnector(ConfluenceSettings.from_dict(row.settings), token, **options)
    raise SourceError(f"Source {row.name} is of kind {row.kind!r}, which this version cannot sync.")


def _token(row: SourceRow, tokens: Mapping[str, str]) -> str:
    path = row.settings.get("token_file")
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SourceError(
                f"The secret file of source {row.name} cannot be read: {exc.strerror or exc}."
            ) from None
    token = tokens.get(row.kind, "")
    if not token:
        raise SourceError(
            f"Source {row.name} has no credential: set {TOKEN_SETTINGS.get(row.kind, 'its token')}, "
            "or give the source a --token-file."
        )
    return token.strip()
