"""Who may read what: one room every surface asks, whatever the surface.

``rule`` is the rule (:class:`Access`: who is served, ``may_read``, the
scopes a search is filtered by; :class:`Person`, who reads), ``members`` the
one cache of who is in each channel, ``guests`` the one cache of who is a
guest of the workspace, ``news`` what Slack told another replica of them
(shared through the store), ``grants`` the synced documents'
permissions as the store keeps them, ``directory`` the contract a directory of
people and places fulfils, ``slack`` Slack as that directory (and the Web API
client), ``config`` what the room needs. Slack answers and related passages,
the Home tab, Work Objects, the viewer, MCP tools, feedback clicks and
``kb ask --as`` all ask it; ``kb access explain`` says what it decided and why.
It imports no surface: neither ``bot.slack``, ``bot.server``, ``bot.mcp`` nor
the command line.
"""

from __future__ import annotations

from bot.access.config import AccessConfig
from bot.access.directory import AccessCheckUnavailable, Directory, Profile
from bot.access.grants import SourceGrants
from bot.access.guests import GUESTS_TTL_SECONDS, Guests
from bot.access.members import MEMBERS_TTL_SECONDS, Memberships
from bot.access.rule import (
    Access,
    Decision,
    NotServed,
    Person,
    Readable,
    Rule,
    Where,
    admitted,
    only_its_own,
    shown_at,
    visible,
)
from bot.access.slack import (
    DEFAULT_RETRY_AFTER_SECONDS,
    MAX_RETRY_AFTER_SECONDS,
    RATE_LIMITED,
    SLACK_UNREACHABLE,
    SlackDirectory,
    ask_slack,
    blocking_web_client,
    channel_member_ids,
    retry_after,
    retry_handlers,
    slack_access,
    slack_error,
    verified_email,
    web_client,
)

__all__ = [
    "Access",
    "AccessCheckUnavailable",
    "AccessConfig",
    "DEFAULT_RETRY_AFTER_SECONDS",
    "MAX_RETRY_AFTER_SECONDS",
    "Decision",
    "Directory",
    "GUESTS_TTL_SECONDS",
    "Guests",
    "MEMBERS_TTL_SECONDS",
    "Memberships",
    "NotServed",
    "Person",
    "Profile",
    "RATE_LIMITED",
    "Readable",
    "Rule",
    "SLACK_UNREACHABLE",
    "SlackDirectory",
    "SourceGrants",
    "Where",
    "admitted",
    "ask_slack",
    "blocking_web_client",
    "channel_member_ids",
    "only_its_own",
    "retry_after",
    "retry_handlers",
    "shown_at",
    "slack_access",
    "slack_error",
    "verified_email",
    "visible",
    "web_client",
]
