"""Who is calling the MCP server: a bearer token an admin issued, or Slack's signed identity.

Two ways in, and no other:

* ``Authorization: Bearer kbmcp_...``: a token from ``kb mcp-token create``,
  checked against its stored hash (``index.storage.mcp_tokens``); the call runs
  as the token's person, with its scopes.
* Slack identity (``KB_MCP_SLACK_IDENTITY=on``): the Slackbot MCP client signs
  each request like its other requests (``X-Slack-Signature``: HMAC-SHA256 of
  ``v0:{timestamp}:{raw body}`` with the app's signing secret, timestamps over
  five minutes old refused), and puts the asking person in the tool call's
  ``params._meta.slack`` (``user_id``, ``team_id``). That identity is believed
  only in a request whose signature checks out; in a bearer-token request it is
  ignored, so a token holder cannot pose as someone else. A signature is
  accepted once: the endpoint records each one in the shared store until its
  window is over (``bot.mcp.server``), so a captured request replayed to any
  replica is refused.

Anything else is refused before the MCP SDK sees the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slack_sdk.signature import SignatureVerifier

from index.storage import McpToken

__all__ = [
    "SIGNATURE_WINDOW_SECONDS",
    "SLACK_CLIENT",
    "Caller",
    "SlackIdentity",
    "SlackSignatures",
    "bearer_token",
    "slack_identity",
]

# The client name the query log shows for calls Slack signed.
SLACK_CLIENT = "slack"
# Slack's window: a request whose timestamp is further than five minutes from
# now, either way, is refused (slack_sdk's SignatureVerifier checks it).
SIGNATURE_WINDOW_SECONDS = 5 * 60


@dataclass(frozen=True)
class SlackIdentity:
    """The person a Slack-signed tool call is for (``params._meta.slack``)."""

    user_id: str
    team_id: str


@dataclass(frozen=True)
class Caller:
    """A request to ``/mcp`` whose credentials checked out.

    Attributes:
        token: the bearer token it came with; ``None`` for a Slack-signed request.
        slack: the person a Slack-signed request names (``None`` when it names
            nobody, as Slack's tool discovery may not).
    """

    token: McpToken | None = None
    slack: SlackIdentity | None = None

    @property
    def key(self) -> str:
        """Who the rate limit counts the call against: the person, however they came in.

        Every token of one user id and the Slack-signed calls naming it share one
        count, so holding several tokens buys no more calls. Slack-signed
        requests that name nobody (tool discovery) share one count of their own.
        """
        if self.token is not None:
            return f"person:{self.token.user_id}"
        if self.slack is not None:
            return f"person:{self.slack.user_id}"
        return "slack:anonymous"

    @property
    def client(self) -> str:
        """The name the query log shows: the token's, or ``slack``."""
        return self.token.name if self.token is not None else SLACK_CLIENT


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; ``None`` without one."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class SlackSignatures:
    """Checks that Slack signed a request (its signing secret, its five-minute window).

    Args:
        signing_secret: the Slack app's signing secret (``SLACK_SIGNING_SECRET``).
    """

    def __init__(self, signing_secret: str) -> None:
        self._verifier = SignatureVerifier(signing_secret)

    def verified(self, body: bytes, headers: Any) -> str | None:
        """The Slack signature ``body`` carries in ``headers`` if it is valid and recent, else ``None``."""
        named = {str(k).lower(): str(v) for k, v in headers.items()}
        try:
            valid = self._verifier.is_valid_request(body, named)
        except ValueError:
            # A timestamp that is not a number, or a body that is not UTF-8: not Slack's.
            return None
        return named["x-slack-signature"] if valid else None


def slack_identity(body: bytes) -> SlackIdentity | None:
    """The person named in ``params._meta.slack`` of a JSON-RPC request; ``None`` if none."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict):
        return None
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    slack = meta.get("slack") if isinstance(meta, dict) else None
    if not isinstance(slack, dict):
        return None
    user, team = slack.get("user_id"), slack.get("team_id")
    if isinstance(user, str) and user and isinstance(team, str) and team:
        return SlackIdentity(user_id=user, team_id=team)
    return None
