"""Slack's own messages as a source: Real-time Search as the person asking (``KB_SLACK_SEARCH=on``).

Each question also calls ``assistant.search.context`` with the event's
top-level ``action_token``: Slack then searches, as that person, the public
and private channels, group DMs and DMs they can read (``search:read.public``,
``.private``, ``.mpim``, ``.im``; DMs and group DMs only where each person has
consented). An event without one (an app Slack does not treat as an agent)
searches with the bot token alone, public channels only; the group says which
(:data:`AS_ASKER`, :data:`PUBLIC_ONLY`). Slack stores nothing of the search,
and neither does the bot (``core.outside``).

Slack allows about 10 of these searches a minute per person (its reference
for ``assistant.search.context``: "10+ requests per minute"). A search Slack
refuses (``ratelimited``, ``not_allowed_token_type``, ``missing_scope``,
``invalid_action_token``...), one it does not answer within
:data:`SEARCH_TIMEOUT_SECONDS`, costs only the group, with a note
(``Found.failure``); after ``ratelimited`` that person's searches (or, for a
search with the bot token alone, every such search: the limit is the token's)
wait out Slack's ``Retry-After`` (``bot.access.retry_after``, the bot's one
reading of it) without asking again. The search has a client of its own that never
retries a rate limit: the answer must not wait a minute for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import retry_after
from bot.slack.config import SlackConfig
from core.outside import Found, OutsidePassage

log = logging.getLogger(__name__)

__all__ = [
    "AS_ASKER",
    "PUBLIC_ONLY",
    "SEARCH_TIMEOUT_SECONDS",
    "UNREACHABLE",
    "SlackSearch",
    "SlackSearcher",
]

AS_ASKER = "as_asker"  # with the event's action_token: what the asker can read
PUBLIC_ONLY = "public_only"  # the bot token alone: public channels only
UNREACHABLE = "unreachable"  # no answer from Slack in time (not an error code of Slack's)
# Every kind of conversation a person reads; Slack returns only what the token may search.
ASKERS_CHANNELS = ("public_channel", "private_channel", "mpim", "im")
PUBLIC_CHANNELS = ("public_channel",)
# Slack returns about 20 results a page; one page is all a question uses (the next
# would spend one of the person's 10 searches a minute).
RESULTS = 20
# The answer waits this long for Slack's search at most, then goes on without it.
SEARCH_TIMEOUT_SECONDS = 5.0
# A message's text quoted to the model at most this long (a pasted log is not a source).
MAX_TEXT_CHARS = 2000


class SlackSearcher:
    """Real-time Search for this process: its client, and whose searches wait out a rate limit.

    Args:
        config: the bot token and the API's address.
        clock: seconds, monotonic (tests pass their own).
        timeout: seconds a search may take before the answer goes on without it.
    """

    def __init__(
        self,
        config: SlackConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        timeout: float = SEARCH_TIMEOUT_SECONDS,
    ) -> None:
        # Connection errors only: a rate-limited search is given up at once (the group
        # says so), never retried after Slack's Retry-After while the answer waits.
        self.client = AsyncWebClient(
            token=config.bot_token,
            base_url=config.api_url,
            retry_handlers=[AsyncConnectionErrorRetryHandler(max_retry_count=1)],
        )
        self.timeout = timeout
        self._clock = clock
        self._paused_until: dict[str, float] = {}

    def for_event(self, event: Mapping[str, Any], *, bot_user_id: str | None = None) -> SlackSearch:
        """The search of one question: as its asker when the event carries an ``action_token``.

        ``bot_user_id``: the bot's own user, whose messages (its answers) are no source.
        """
        token = event.get("action_token")
        return SlackSearch(
            self,
            user=str(event.get("user") or ""),
            action_token=token if isinstance(token, str) and token else None,
            bot_user_id=bot_user_id,
        )

    def paused(self, limited: str) -> bool:
        """Whether the searches of ``limited`` (:attr:`SlackSearch.limited`) wait out a rate limit."""
        return self._clock() < self._paused_until.get(limited, 0.0)

    def pause(self, limited: str, seconds: float) -> None:
        """Ask nothing for ``limited`` for ``seconds`` (Slack's ``Retry-After``)."""
        self._paused_until[limited] = self._clock() + seconds


class SlackSearch:
    """One question's search of Slack (``core.outside.OutsideSearch``)."""

    def __init__(
        self,
        searcher: SlackSearcher,
        *,
        user: str,
        action_token: str | None,
        bot_user_id: str | None = None,
    ) -> None:
        self.searcher = searcher
        self.user = user
        self.action_token = action_token
        self.bot_user_id = bot_user_id

    @property
    def limited(self) -> str:
        """Whose rate limit this search spends: the asker's (their ``action_token``), or the
        bot token's, shared by every search without one (``""``)."""
        return self.user if self.action_token else ""

    @property
    def reach(self) -> str:
        """How far this search reaches: :data:`AS_ASKER` or :data:`PUBLIC_ONLY`."""
        return AS_ASKER if self.action_token else PUBLIC_ONLY

    async def search(self, query: str) -> Found:
        """The messages ``query`` finds in Slack; a failure is ``Found.failure``, never raised."""
        if self.searcher.paused(self.limited):
            return Found(reach=self.reach, failure="ratelimited")
        try:
            async with asyncio.timeout(self.searcher.timeout):
                page = await self.searcher.client.assistant_search_context(
                    query=query,
                    action_token=self.action_token,
                    channel_types=list(ASKERS_CHANNELS if self.action_token else PUBLIC_CHANNELS),
                    content_types=["messages"],
                    limit=RESULTS,
                )
        except SlackApiError as exc:
            return self._refused(exc)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("Slack search unreachable: %s", type(exc).__name__)
            return Found(reach=self.reach, failure=UNREACHABLE)
        return Found(messages(page.data, bot_user_id=self.bot_user_id), reach=self.reach)

    def _refused(self, exc: SlackApiError) -> Found:
        error = str(exc.response.get("error") or exc.response.status_code)
        wait = retry_after(exc)
        if wait is not None:
            self.searcher.pause(self.limited, wait)
        log.warning("Slack search refused (%s, %s): only that group is lost", error, self.reach)
        return Found(reach=self.reach, failure=error)


def messages(data: Any, *, bot_user_id: str | None = None) -> list[OutsidePassage]:
    """The messages of an ``assistant.search.context`` answer, in Slack's order.

    The first :data:`RESULTS` entries at most (what was asked for). An entry
    without text, a permalink that is not https, an author or a channel is left
    out: what cannot be opened or attributed is not shown. So is one written by
    ``bot_user_id`` (the bot itself): its earlier answers are its own past output,
    written from documents that may have changed since (or from a message that
    steered the model), never evidence of their own. A message listed again (its
    permalink) is shown once.
    """
    results = data.get("results") if isinstance(data, Mapping) else None
    found = results.get("messages") if isinstance(results, Mapping) else None
    if not isinstance(found, list):
        return []
    # Slack sends at most the RESULTS asked for; more are not read (each is embedded
    # while the answer waits).
    passages = (_passage(m) for m in found[:RESULTS])
    kept: dict[str, OutsidePassage] = {}  # by permalink: a message listed twice is one
    for p in passages:
        if p is not None and not (bot_user_id and p.author == bot_user_id):
            kept.setdefault(p.url, p)
    return list(kept.values())


# The first second no date can show (time.gmtime's years end at 9999).
_YEAR_10000 = 253_402_300_800.0


def _passage(message: Any) -> OutsidePassage | None:
    if not isinstance(message, Mapping):
        return None
    text, url = message.get("content"), message.get("permalink")
    author, place = message.get("author_user_id"), message.get("channel_id")
    if not all(isinstance(v, str) and v for v in (text, url, author, place)):
        return None
    if not str(url).startswith("https://"):
        return None
    ts = message.get("message_ts")
    try:
        # Slack's ts is a string; a number will do, a boolean is no time (True is 1.0).
        posted = (
            float(ts) if isinstance(ts, str | int | float) and not isinstance(ts, bool) else 0.0
        )
    except (ValueError, OverflowError):  # OverflowError: an integer of 400 digits
        posted = 0.0
    if not 0.0 < posted < _YEAR_10000:  # nan, inf, 1e300: no time a date can show (0: none)
        posted = 0.0
    return OutsidePassage(
        text=str(text)[:MAX_TEXT_CHARS],
        author=str(author),
        posted=posted,
        url=str(url),
        place=str(place),
    )
