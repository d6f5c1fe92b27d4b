"""Which language a person is spoken to in: their Slack locale, else their question's, else the default.

In order: the person's Slack locale (``users.info`` with ``include_locale``,
remembered with the rest of that answer by :class:`bot.slack.people.Directory`)
when a catalog has its language (``fr-FR`` -> ``fr``); else the language the
text they wrote is in (``index.languages.detect_language`` among the catalogs'
languages); else ``KB_DEFAULT_LANGUAGE``. Messages for several people (a
channel, the approvals channel) are in the default language.

An English locale says little: it is Slack's default, and what a person whose language
Slack's interface does not offer is left with. So for someone whose locale is English, a
question clearly in another catalog's language is answered in it ("Kolik dní…" gets
Czech words), and so is what they read next without writing (the Home tab, an upload's
status, a short "VPN?"), for as long as the server runs; a question too short to tell,
from someone never told, keeps English.

A question the detector reads as Norwegian is Danish when a catalog has Danish and
none has Norwegian: on a few words the two are told apart by little more than
chance (a Danish question holding English terms, "adgang til VPN og SSO", reads
as Norwegian), and a Norwegian reader reads Danish.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Collection
from typing import Any

from cachetools import LRUCache
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.people import Directory
from bot.slack.words.catalogs import available_languages, translations
from bot.slack.words.sentences import Words
from index.languages import detect_language

__all__ = [
    "LOCALE_TIMEOUT_SECONDS",
    "Languages",
    "TOLD_CAPACITY",
    "choose_language",
    "language_of_locale",
    "words_for",
]

# Slack slower than this to say who someone is: their words follow the next rule, so that
# a modal still opens within its trigger's 3 s and no answer waits on a locale.
LOCALE_TIMEOUT_SECONDS = 1.0
_USER_ID_RE = re.compile(r"[UW][A-Z0-9]{2,}")
# How many people's told languages are remembered (a few hundred kB at most).
TOLD_CAPACITY = 10_000
# Slack's default locale, and the one left to a person whose language its interface lacks.
_ENGLISH = "en"
# Languages written so alike that one's reader reads the other: the detector's reading
# (left) is answered in the catalog's language (right) when no catalog has the first.
_READ_AS = {"nb": "da", "nn": "da", "no": "da"}


def words_for(code: str, tz: str | None = None) -> Words:
    """The bot's words in ``code`` (a catalog's language), moments in time zone ``tz``
    (Slack's ``tz`` of the person, ``Europe/Prague``; ``None``: UTC).

    Raises:
        KeyError: no catalog has ``code``.
    """
    return Words(code, translations(code), tz)


def language_of_locale(locale: str | None, available: Collection[str]) -> str | None:
    """The catalog language of a Slack locale (``fr-FR``, ``cs_CZ``, ``da``), or ``None``."""
    code = (locale or "").replace("_", "-").split("-")[0].strip().lower()
    return code if code in available else None


def choose_language(
    *, locale: str | None, text: str, default: str, available: Collection[str]
) -> str:
    """The language for a person of Slack ``locale`` who wrote ``text``."""
    found = language_of_locale(locale, available)
    told = told_language(text, available) if _question_decides(found, text) else None
    return told or found or default


def told_language(text: str, available: Collection[str]) -> str | None:
    """The catalog language ``text`` is clearly written in, or ``None``."""
    detected = detect_language(text, among=sorted(available))
    if detected not in available:
        detected = _READ_AS.get(detected or "")
    return detected if detected is not None and detected in available else None


def _question_decides(locale_language: str | None, text: str) -> bool:
    """Whether the language ``text`` is written in is asked: the locale names no catalog's
    language, or names English, which says little (see the module)."""
    return locale_language in (None, _ENGLISH) and bool(text.strip())


class Languages:
    """The words each person is spoken to in.

    Args:
        directory: what Slack says about people (their locale among it).
        default: the language for messages to several people, and for a person
            whose locale and question tell nothing (``KB_DEFAULT_LANGUAGE``).
    """

    def __init__(self, directory: Directory, default: str) -> None:
        self.directory = directory
        self.available = available_languages()
        self.default = words_for(default)
        # The language each person's questions were last told in, for what they read
        # without writing (the Home tab, an upload's status) while their locale says no more
        # than English; the oldest forgotten first.
        self._told: LRUCache[str, str] = LRUCache(maxsize=TOLD_CAPACITY)

    async def of(self, client: AsyncWebClient, user_id: str | None, text: str = "") -> Words:
        """The words for ``user_id``, who wrote ``text`` (a question; empty when none), their
        moments in the person's Slack time zone."""
        person = await self.person(client, user_id)
        found = language_of_locale(_said(person, "locale"), self.available)
        told = None
        if _question_decides(found, text):
            # The detector is a small model: kept off the event loop.
            told = await asyncio.to_thread(told_language, text, self.available)
        if user_id and found in (None, _ENGLISH):
            told = self._remembered(user_id, told)
        return words_for(told or found or self.default.lang, _said(person, "tz"))

    def _remembered(self, user_id: str, told: str | None) -> str | None:
        """``told`` remembered as ``user_id``'s language; ``None``: the one remembered."""
        if told is None:
            return self._told.get(user_id)
        self._told[user_id] = told
        return told

    async def locale(self, client: AsyncWebClient, user_id: str | None) -> str | None:
        """The person's Slack locale, or ``None`` when Slack does not say."""
        return _said(await self.person(client, user_id), "locale")

    async def person(self, client: AsyncWebClient, user_id: str | None) -> dict[str, Any]:
        """What Slack says of the person (``users.info``); empty when it does not say in time."""
        if not user_id or not _USER_ID_RE.fullmatch(user_id):
            return {}  # nobody, or not a person of Slack (``cli``)
        try:
            async with asyncio.timeout(LOCALE_TIMEOUT_SECONDS):
                return await self.directory.user(client, user_id) or {}
        except TimeoutError:
            return {}


def _said(person: dict[str, Any], key: str) -> str | None:
    value = person.get(key)
    return str(value) if value else None
