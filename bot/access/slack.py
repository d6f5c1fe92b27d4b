"""Slack as the directory of people and places, asked with the bot token through the Web API.

``auth.test`` (the workspace served, asked once), ``users.info`` (a person's
workspace, whether they are deactivated, and their confirmed email; the whole
user object remembered five minutes, the one cache of it in the process:
the Slack surface reads its admins and locales there too, :meth:`SlackDirectory.user`) and
``conversations.members`` (page by page; remembered by
:class:`bot.access.members.Memberships`, not here) and ``users.list`` (the
workspace's guests, page by page; remembered by :class:`bot.access.guests.Guests`). A channel the bot cannot
see (a private one it is not in, a deleted one) has no known members. Slack out
of reach, or an error it should not give, is :class:`AccessCheckUnavailable`.

The Web API client every part of the bot uses is built here too
(:func:`web_client`; :func:`blocking_web_client` for a command), with what it
retries: slack_sdk's own retry handlers, which wait out a rate limit's
``Retry-After``. A caller that must not wait (an answer in flight) gives up at
once and asks :func:`retry_after` when Slack will take the call again.
"""

from __future__ import annotations

import logging
import math
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from cachetools import TTLCache
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.handler import RetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from bot.access.config import AccessConfig
from bot.access.directory import AccessCheckUnavailable, Profile
from bot.access.grants import SourceGrants
from bot.access.guests import is_guest
from bot.access.rule import Access
from index.storage import PeopleHeard

log = logging.getLogger(__name__)
T = TypeVar("T")
# The SDK logs each call's arguments and whole responses at DEBUG: the directory's
# client logs at INFO at most, whatever the root says.
_api_log = logging.getLogger(f"{__name__}.api")
_api_log.setLevel(logging.INFO)

__all__ = [
    "DEFAULT_RETRY_AFTER_SECONDS",
    "MAX_RETRY_AFTER_SECONDS",
    "RATE_LIMITED",
    "SLACK_UNREACHABLE",
    "SlackDirectory",
    "ask_slack",
    "blocking_web_client",
    "channel_member_ids",
    "retry_after",
    "retry_handlers",
    "slack_access",
    "slack_error",
    "verified_email",
    "web_client",
]

# Retries per kind of failure. Each backs off (0.5 s, 1 s) or waits Slack's Retry-After.
SLACK_RETRIES = 2
# The error codes of a rate limit: most methods say ``ratelimited``, some newer ones
# ``rate_limited``.
RATE_LIMITED = frozenset({"ratelimited", "rate_limited"})
# Slack's rate-limit windows are a minute: without a Retry-After, wait one.
DEFAULT_RETRY_AFTER_SECONDS = 60.0
# The longest a Retry-After pauses what it limits: one of years is an hour.
MAX_RETRY_AFTER_SECONDS = 3600.0
PROFILE_TTL_SECONDS = 300.0
MAX_PROFILES = 10_000
SLACK_UNREACHABLE = "Slack cannot be reached to check who you are. Try again in a minute."
MEMBERS_UNKNOWN = "Slack cannot say now who is in the channel ({why}). Try again in a minute."
GUESTS_UNKNOWN = "Slack cannot say now who is a guest of the workspace ({why})."
# users.list's page: Slack recommends no more than 200 people at a time.
USERS_PAGE = 200
# conversations.members' page: Slack's largest.
MEMBERS_PAGE = 1000
# A listing of people ends when Slack names no next_cursor. One that names a cursor it
# gave before, or lists more people than any workspace has (pages of this many at
# most), never would: it is given up, and nobody can say who is in it.
MAX_LISTED_PEOPLE = 1_000_000


def web_client(token: str, api_url: str, **kwargs: Any) -> AsyncWebClient:
    """A Web API client for ``token`` at ``api_url``, retrying what is worth retrying."""
    return AsyncWebClient(token=token, base_url=api_url, retry_handlers=retry_handlers(), **kwargs)


def retry_handlers() -> list[AsyncRetryHandler]:
    """What a Web API call is retried on: what Slack marks as transient.

    A dropped or refused connection, HTTP 429 (after its ``Retry-After``), and
    HTTP 500 or 503, Slack's own failures. Answers with ``"ok": false`` and HTTP
    200 (``message_not_found``, ``channel_not_found``...) are never retried: the
    same call would fail the same way. A retried 500 may post a message twice
    if Slack had posted it before failing; a question never answered is worse.
    """
    # The async client retries only connection errors unless told otherwise.
    return [
        AsyncConnectionErrorRetryHandler(max_retry_count=SLACK_RETRIES),
        AsyncRateLimitErrorRetryHandler(max_retry_count=SLACK_RETRIES),
        AsyncServerErrorRetryHandler(max_retry_count=SLACK_RETRIES),
    ]


def blocking_web_client(token: str, api_url: str) -> WebClient:
    """A blocking Web API client (for a command), retrying what :func:`retry_handlers` retries."""
    handlers: list[RetryHandler] = [
        ConnectionErrorRetryHandler(max_retry_count=SLACK_RETRIES),
        RateLimitErrorRetryHandler(max_retry_count=SLACK_RETRIES),
        ServerErrorRetryHandler(max_retry_count=SLACK_RETRIES),
    ]
    return WebClient(token=token, base_url=api_url, retry_handlers=handlers)


def retry_after(exc: SlackApiError) -> float | None:
    """Seconds until Slack takes a call it rate-limited again (``Retry-After``); ``None``: it
    refused for another reason.

    For a caller that does not wait (the retry handlers wait for the others), or
    one the handlers' retries ran out for. Without a usable ``Retry-After``:
    :data:`DEFAULT_RETRY_AFTER_SECONDS`; at most :data:`MAX_RETRY_AFTER_SECONDS`.
    """
    if exc.response.status_code != 429 and slack_error(exc) not in RATE_LIMITED:
        return None
    headers = exc.response.headers or {}
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    try:
        seconds = float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return DEFAULT_RETRY_AFTER_SECONDS
    if not math.isfinite(seconds):  # none, "inf", "nan": no number of seconds
        return DEFAULT_RETRY_AFTER_SECONDS
    return min(max(1.0, seconds), MAX_RETRY_AFTER_SECONDS)


async def channel_member_ids(client: AsyncWebClient, channel: str) -> frozenset[str]:
    """Every member of ``channel``, from ``conversations.members`` page by page.

    Raises:
        SlackApiError: Slack refused (``channel_not_found`` when the bot cannot see it).
        AccessCheckUnavailable: the listing never ends (:func:`pages`).
    """
    members: set[str] = set()

    def page(cursor: str | None) -> Awaitable[Any]:
        return client.conversations_members(channel=channel, cursor=cursor, limit=MEMBERS_PAGE)

    async for listed in pages(page, MEMBERS_PAGE, MEMBERS_UNKNOWN):
        members.update(str(m) for m in listed.get("members") or [])
    return frozenset(members)


async def pages(
    call: Callable[[str | None], Awaitable[Any]], per_page: int, unknown: str
) -> AsyncIterator[Any]:
    """Each page of a listing of people (``call`` of a cursor), following ``next_cursor`` to its end.

    Raises:
        AccessCheckUnavailable: ``unknown``, when the listing names a cursor it named
            before, or runs past :data:`MAX_LISTED_PEOPLE` people in pages of
            ``per_page``: it would never end.
    """
    seen: set[str] = set()
    cursor: str | None = None
    for _ in range(MAX_LISTED_PEOPLE // per_page + 1):
        page = await call(cursor)
        yield page
        cursor = (page.get("response_metadata") or {}).get("next_cursor") or None
        if cursor is None:
            return
        if cursor in seen:
            break
        seen.add(cursor)
    log.warning("a listing of people never ended: Slack named cursors past its end")
    raise AccessCheckUnavailable(unknown.format(why="its listing never ended"))


async def ask_slack(call: Awaitable[T]) -> T:
    """Await a Web API call; Slack out of reach becomes :class:`AccessCheckUnavailable`."""
    try:
        return await call
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise AccessCheckUnavailable(SLACK_UNREACHABLE) from exc


def slack_error(exc: SlackApiError) -> str:
    """The error code Slack answered with (``channel_not_found``...)."""
    return str(exc.response.get("error", "unknown_error"))


class SlackDirectory:
    """The :class:`bot.access.directory.Directory` of one Slack workspace.

    Args:
        client: a Web API client with the bot token.
    """

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client
        self._team_id = ""
        self._users: TTLCache[str, dict[str, Any]] = TTLCache(
            maxsize=MAX_PROFILES, ttl=PROFILE_TTL_SECONDS
        )

    async def home_team(self) -> str:
        """The workspace's team id, from ``auth.test``: asked once, then remembered.

        Raises:
            AccessCheckUnavailable: Slack cannot be reached or refuses the bot token.
        """
        if not self._team_id:
            try:
                response = await ask_slack(self.client.auth_test())
            except SlackApiError as exc:
                log.error("auth.test failed (%s): check SLACK_BOT_TOKEN", slack_error(exc))
                raise AccessCheckUnavailable(SLACK_UNREACHABLE) from exc
            self._team_id = str(response.get("team_id") or "")
        return self._team_id

    async def user(self, user_id: str) -> dict[str, Any] | None:
        """``users.info``'s user object of ``user_id`` (with its ``locale``), remembered five
        minutes; ``None`` if Slack cannot say (nothing is remembered then).

        The one cache of ``users.info`` in the process: the access rule reads a
        :class:`Profile` from it, the Slack surface whether the person is an
        admin, their organisation and their locale (``bot.slack.people``).
        """
        cached = self._users.get(user_id)
        if cached is not None:
            return cached
        try:
            # The locale too: the Slack surface speaks to the person in it.
            response = await ask_slack(self.client.users_info(user=user_id, include_locale=True))
        except (SlackApiError, AccessCheckUnavailable) as exc:
            log.warning("Slack could not tell about %s: %s", user_id, type(exc).__name__)
            return None
        user = dict(response.get("user") or {})
        self._users[user_id] = user
        return user

    async def profile(self, user_id: str) -> Profile | None:
        """``users.info``'s workspace and deactivation of ``user_id``; ``None`` if Slack cannot say."""
        user = await self.user(user_id)
        if user is None:
            return None
        team = user.get("team_id") or (user.get("profile") or {}).get("team")
        return Profile(
            team_id=str(team) if team else None,
            deleted=bool(user.get("deleted")),
            email=verified_email(user),
            guest=is_guest(user),
        )

    def forget(self, user_id: str) -> None:
        """``users.info`` asked again for ``user_id`` next time (a ``user_change`` said it
        changed: a guest now, or deactivated, while five minutes would still serve the old)."""
        self._users.pop(user_id, None)

    async def channel_members(self, channel: str) -> frozenset[str]:
        """The user ids of ``channel``'s members (none when the bot cannot see the channel).

        Raises:
            AccessCheckUnavailable: Slack cannot be reached or answered an unexpected error.
        """
        try:
            return await channel_member_ids(self.client, channel)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AccessCheckUnavailable(MEMBERS_UNKNOWN.format(why="unreachable")) from exc
        except SlackApiError as exc:
            if slack_error(exc) == "channel_not_found":
                # A private channel the bot is not in, or a deleted one: nobody is known to be in it.
                log.info("conversations.members: channel %s not found by the bot", channel)
                return frozenset()
            log.warning(
                "conversations.members failed for %s (%s): the bot needs channels:read and "
                "groups:read to check who may read a channel's documents",
                channel,
                slack_error(exc),
            )
            raise AccessCheckUnavailable(MEMBERS_UNKNOWN.format(why=slack_error(exc))) from exc

    async def guest_ids(self) -> frozenset[str]:
        """The workspace's guests (``is_restricted``, ``is_ultra_restricted``), from
        ``users.list`` page by page; deactivated ones left out (they read nothing).

        Raises:
            AccessCheckUnavailable: Slack cannot be reached or refused (a rate limit its
                retries ran out for, ``missing_scope``...).
        """
        guests: set[str] = set()

        def page(cursor: str | None) -> Awaitable[Any]:
            return self.client.users_list(cursor=cursor, limit=USERS_PAGE)

        try:
            async for listed in pages(page, USERS_PAGE, GUESTS_UNKNOWN):
                for user in listed.get("members") or []:
                    if isinstance(user, dict) and is_guest(user) and not user.get("deleted"):
                        guests.add(str(user.get("id")))
            return frozenset(guests)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AccessCheckUnavailable(GUESTS_UNKNOWN.format(why="unreachable")) from exc
        except SlackApiError as exc:
            log.warning(
                "users.list failed (%s): the bot needs users:read to tell who is a guest; "
                "until it can, answers in channels hold what a guest may read there",
                slack_error(exc),
            )
            raise AccessCheckUnavailable(GUESTS_UNKNOWN.format(why=slack_error(exc))) from exc


def verified_email(user: dict[str, Any]) -> str | None:
    """The email ``users.info`` shows for ``user``, when Slack has it confirmed.

    ``profile.email`` needs the ``users:read.email`` scope; Slack marks an
    address not confirmed yet with ``is_email_confirmed: false``, and a bot or
    an unconfirmed address matches nobody. Nor does one with a letter Unicode
    counts as a compatibility form of another (NFKC changes it: the Kelvin sign,
    full-width letters, ligatures): lower-cased, ``\u212aate@`` would be
    ``kate@``, another person's address.
    """
    email = (user.get("profile") or {}).get("email")
    if not isinstance(email, str) or "@" not in email or user.get("is_bot"):
        return None
    if user.get("is_email_confirmed") is False:
        return None
    if unicodedata.normalize("NFKC", email) != email:
        return None
    return email.strip().lower()


def slack_access(
    config: AccessConfig,
    client: AsyncWebClient | None = None,
    grants: SourceGrants | None = None,
    heard: PeopleHeard | None = None,
) -> Access:
    """The rule over ``config``'s Slack workspace; without a bot token, over no directory.

    Args:
        config: the bot token, the Web API's address, whether other organisations are served.
        client: a Web API client with the bot token; one is built from ``config`` otherwise.
        grants: the synced documents' permissions; ``None``: nobody reads a synced document.
        heard: the store's record of what Slack said of people and channels, which the
            replicas share (``bot.access.news``); ``None``: this process's lists only.
    """
    if not config.bot_token:
        return Access(None, allow_external=config.allow_external, grants=grants)
    bot = client or web_client(config.bot_token, config.api_url, logger=_api_log)
    return Access(
        SlackDirectory(bot), allow_external=config.allow_external, grants=grants, heard=heard
    )
