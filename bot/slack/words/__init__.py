"""The bot's own words in the asker's language: message catalogs, and which language is whose.

``sentences`` holds :class:`Words`, every sentence the bot shows a person (the
English text is each sentence's gettext id); ``catalogs`` reads the gettext
``.po`` file of each language in ``bot/locale/`` with Babel, once per process;
``choice`` picks a person's language: Slack locale, then the question's
language, then ``KB_DEFAULT_LANGUAGE``. A new language is one new ``.po`` file.
"""

from __future__ import annotations

from functools import cache

from bot.slack.words.catalogs import SOURCE_LANGUAGE, available_languages
from bot.slack.words.choice import Languages, choose_language, language_of_locale, words_for
from bot.slack.words.sentences import Words

# bolt context key: the words chosen for the person a listener serves (its error handler's too).
WORDS_KEY = "kb_words"

__all__ = [
    "Languages",
    "SOURCE_LANGUAGE",
    "WORDS_KEY",
    "Words",
    "available_languages",
    "choose_language",
    "language_of_locale",
    "translated_everywhere",
    "words_for",
]


@cache
def translated_everywhere(name: str) -> frozenset[str]:
    """A fixed sentence (``Words`` attribute ``name``) in every language the catalogs have."""
    return frozenset(str(getattr(words_for(code), name)) for code in available_languages())
