"""The kinds of source there are, and how a configured one is opened with its credential.

A kind is one line of ``_KINDS``: its connector's module and classes, the
setting holding its token, and whether it downloads files (which the
product's limits then bound: ``index.sources.downloads``). Its settings class
also names the settings that say who reads a source (``READERS``) and what a
synced document's permissions become when they change (``acl_now``:
``index.sources.readers``).

A source's settings are in the store (``store.sources``); its credential never
is. It is read when the source is opened: from the secret file the settings
name (``token_file``), else the kind's token from the product's settings
(``KB_CONFLUENCE_TOKEN``), which the entry point passes in.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from index.sources.contract import Connector, SourceError
from index.sources.downloads import DownloadLimits
from index.storage import SourceRow

__all__ = [
    "KINDS",
    "TOKEN_SETTINGS",
    "Kind",
    "check_name",
    "kind_of",
    "open_connector",
    "opened_with",
    "settings_of",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class Kind:
    """One kind of source: where its connector lives and which setting holds its token.

    The module is imported only when a source of this kind is used, so that a
    source's SDK loads only where it is configured.

    Attributes:
        name: what ``kb source add`` calls it.
        token_setting: the setting holding the kind's credential (``KB_..._TOKEN``).
        module: the module of its connector.
        settings_class: in ``module``: what a source records, with ``from_dict``/``as_dict``.
        connector_class: in ``module``: ``Connector(settings, token, **options)``.
        downloads: its connector downloads files, and takes ``max_bytes`` and
            ``download_seconds`` (:class:`index.sources.downloads.DownloadLimits`).
    """

    name: str
    token_setting: str
    module: str
    settings_class: str
    connector_class: str
    downloads: bool = False

    def load(self, attribute: str) -> Any:
        """The class ``attribute`` names, from this kind's module."""
        return getattr(importlib.import_module(self.module), attribute)


# Every kind there is; a new source adds its line here.
_KINDS: dict[str, Kind] = {
    kind.name: kind
    for kind in (
        Kind(
            "confluence",
            "KB_CONFLUENCE_TOKEN",
            "index.sources.confluence",
            "ConfluenceSettings",
            "ConfluenceConnector",
            downloads=True,
        ),
        Kind(
            "sharepoint",
            "KB_SHAREPOINT_CLIENT_SECRET",
            "index.sources.sharepoint",
            "SharePointSettings",
            "SharePointConnector",
            downloads=True,
        ),
        Kind(
            "notion",
            "KB_NOTION_TOKEN",
            "index.sources.notion",
            "NotionSettings",
            "NotionConnector",
        ),
        Kind(
            "gdrive",
            "KB_GDRIVE_CREDENTIALS",
            "index.sources.gdrive",
            "GDriveSettings",
            "GDriveConnector",
            downloads=True,
        ),
    )
}
KINDS = tuple(_KINDS)
# The setting holding each kind's token.
TOKEN_SETTINGS = {name: kind.token_setting for name, kind in _KINDS.items()}


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


def kind_of(kind: str) -> Kind:
    """The kind named ``kind``.

    Raises:
        SourceError: there is none.
    """
    found = _KINDS.get(kind)
    if found is None:
        raise SourceError(f"There is no source kind {kind!r}; the kinds: {', '.join(KINDS)}.")
    return found


def settings_of(kind: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` checked for a source of ``kind``, as the store records them.

    Raises:
        SourceError: an unknown kind, or settings it cannot use.
    """
    found = kind_of(kind)
    checked: dict[str, Any] = found.load(found.settings_class).from_dict(settings).as_dict()
    if settings.get("token_file"):
        checked["token_file"] = str(settings["token_file"])
    return checked


def opened_with(connector: Connector, row: SourceRow) -> bool:
    """Whether ``connector`` was opened with the settings ``row`` records now (those it records)."""
    found = kind_of(row.kind)
    recorded = found.load(found.settings_class).from_dict(row.settings).as_dict()
    opened = connector.settings.as_dict()
    return all(recorded[k] == opened.get(k) for k in row.settings if k in recorded)


def open_connector(
    row: SourceRow,
    tokens: Mapping[str, str],
    limits: DownloadLimits | None = None,
    **options: Any,
) -> Connector:
    """The connector of the configured source ``row``, with its credential.

    ``tokens``: each kind's token from the settings (``{"confluence": ...}``); a
    source's own secret file comes first. ``limits``: what one file it downloads
    may cost (none: the defaults).

    ``options`` go to the connector (``sleep``, ``budget_seconds``).

    Raises:
        SourceError: no credential, or settings it cannot use.
    """
    found = _KINDS.get(row.kind)
    if found is None:
        raise SourceError(
            f"Source {row.name} is of kind {row.kind!r}, which this version cannot sync."
        )
    token = _token(row, tokens)
    settings = found.load(found.settings_class).from_dict(row.settings)
    if found.downloads and limits is not None:
        options = {"max_bytes": limits.max_bytes, "download_seconds": limits.seconds, **options}
    connector: Connector = found.load(found.connector_class)(settings, token, **options)
    return connector


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
