"""The message catalogs: one gettext ``.po`` file per language, read with Babel at run time.

``bot/locale/<code>/LC_MESSAGES/messages.po`` holds a language's translations;
``en`` is the source catalog (its ``msgstr`` are empty: the English text is
the ``msgid``). Nothing is compiled ahead: the first time a language is asked
for, Babel reads its ``.po`` (``read_po``) and writes the compiled ``.mo`` into
memory (``write_mo``), which :class:`gettext.GNUTranslations` loads; the
result is kept for the life of the process. Adding a language is adding its
one ``.po`` file; it is available as soon as it exists.
"""

from __future__ import annotations

import gettext
import io
from functools import cache
from pathlib import Path

from babel.messages.catalog import Catalog
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po

__all__ = ["LOCALE_DIR", "SOURCE_LANGUAGE", "available_languages", "catalog", "translations"]

LOCALE_DIR = Path(__file__).resolve().parents[2] / "locale"
SOURCE_LANGUAGE = "en"
DOMAIN = "messages"


def catalog_path(code: str) -> Path:
    """Where the catalog of ``code`` is (whether or not it exists)."""
    return LOCALE_DIR / code / "LC_MESSAGES" / f"{DOMAIN}.po"


@cache
def available_languages() -> frozenset[str]:
    """The language codes that have a catalog (the source language always among them)."""
    found = {p.parent.parent.name for p in LOCALE_DIR.glob(f"*/LC_MESSAGES/{DOMAIN}.po")}
    return frozenset(found | {SOURCE_LANGUAGE})


def catalog(code: str) -> Catalog:
    """The catalog of ``code`` as Babel reads it."""
    with catalog_path(code).open("rb") as fp:
        return read_po(fp, locale=code, domain=DOMAIN)


@cache
def translations(code: str) -> gettext.NullTranslations:
    """The translations of ``code``, compiled in memory once (an empty ``msgstr``: the ``msgid``).

    Raises:
        KeyError: ``code`` has no catalog.
    """
    if code not in available_languages():
        raise KeyError(code)
    if not catalog_path(code).exists():
        return gettext.NullTranslations()  # the source language, its catalog not written yet
    compiled = io.BytesIO()
    write_mo(compiled, catalog(code))
    compiled.seek(0)
    return gettext.GNUTranslations(compiled)
