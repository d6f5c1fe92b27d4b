"""The bearer tokens an admin issues for MCP clients: each runs its calls as one person.

``store.mcp_tokens`` holds them (table ``mcp_tokens``, ``index.storage.schema``).
Only a token's SHA-256 is stored: the token itself is shown once, when it is
issued, and a copy of the database lets nobody call the server. A token is
high-entropy (``secrets.token_urlsafe``), so a plain hash is enough (no salt or
slow hash: there is nothing to guess). A presented token is found by its hash
and the hashes are compared in constant time; one that is revoked, expired or
unknown is refused the same way. A revoked token stays listed (who had it,
until when); its name is never reused, so the query log's name keeps meaning one
token.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import secrets
from dataclasses import dataclass
from typing import Any

from index.errors import KBError
from index.models import EVERYONE
from index.storage.part import StorePart

__all__ = ["TOKEN_PREFIX", "McpToken", "McpTokenError", "McpTokens", "token_hash"]

# Says what the secret is when it turns up in a file or a paste (and lets scanners find it).
TOKEN_PREFIX = "kbmcp_"
# 32 random bytes: 256 bits, far beyond guessing.
_TOKEN_BYTES = 32
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Slack ids: users U.../W..., channels C.../G...
_USER = re.compile(r"[UW][A-Z0-9]{2,30}")
_CHANNEL = re.compile(r"[CG][A-Z0-9]{2,30}")
_COLUMNS = ("name", "token_sha256", "user_id", "scopes", "created_at", "expires_at", "revoked_at")


class McpTokenError(KBError):
    """An MCP token cannot be issued or revoked as asked (name taken, no such token, bad id)."""


@dataclass(frozen=True)
class McpToken:
    """One issued token, as the store keeps it (never the token itself).

    Attributes:
        name: what the admin called it; the query log names calls by it.
        user_id: the Slack user the calls run as.
        scopes: the channels it is narrowed to: of the channels its person is
            a member of, only these (``bot.mcp.people``); empty: all of them.
        expires_at: seconds since the epoch after which it is refused; ``None``: never.
        revoked_at: when it was revoked; ``None``: it is not.
    """

    name: str
    user_id: str
    scopes: tuple[str, ...]
    created_at: float
    expires_at: float | None
    revoked_at: float | None

    def state(self, now: float) -> str:
        """``active``, ``expired`` or ``revoked`` at ``now``."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def to_dict(self, now: float) -> dict[str, Any]:
        """JSON-ready form, with the state at ``now``."""
        return {
            "name": self.name,
            "user": self.user_id,
            "scopes": list(self.scopes),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "state": self.state(now),
        }

    @classmethod
    def from_row(cls, row: Any) -> McpToken:
        """The token of a row selected with every column."""
        return cls(
            name=row["name"],
            user_id=row["user_id"],
            scopes=tuple(json.loads(row["scopes"])),
            created_at=float(row["created_at"]),
            expires_at=None if row["expires_at"] is None else float(row["expires_at"]),
            revoked_at=None if row["revoked_at"] is None else float(row["revoked_at"]),
        )


def token_hash(token: str) -> str:
    """The hex SHA-256 of ``token``: what the store keeps and looks tokens up by."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class McpTokens(StorePart):
    """Issuing, checking, listing and revoking MCP tokens (``store.mcp_tokens``)."""

    def issue(
        self,
        name: str,
        *,
        user_id: str,
        scopes: tuple[str, ...] = (),
        expires_in_days: float | None = None,
    ) -> tuple[str, McpToken]:
        """A new token for ``user_id``, and its record; the token is not kept anywhere.

        Raises:
            McpTokenError: the name is taken (by a revoked token too), or the
                user or a channel id is not a Slack id.
        """
        _check(name, user_id, scopes, expires_in_days)
        token = TOKEN_PREFIX + secrets.token_urlsafe(_TOKEN_BYTES)
        now = self.clock()
        expires = None if expires_in_days is None else now + expires_in_days * 86400
        channels = tuple(dict.fromkeys(scopes))
        with self.transaction() as db:
            taken = db.execute("SELECT 1 FROM mcp_tokens WHERE name = ?", [name]).fetchone()
            if taken:
                raise McpTokenError(
                    f"A token named {name!r} exists already (names are never reused, "
                    "revoked ones included): choose another name."
                )
            db.execute(
                f"INSERT INTO mcp_tokens ({', '.join(_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, NULL)",
                [name, token_hash(token), user_id, json.dumps(list(channels)), now, expires],
            )
        return token, McpToken(name, user_id, channels, now, expires, None)

    def verify(self, token: str) -> McpToken | None:
        """The active token ``token`` is; ``None`` for one unknown, revoked or expired."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
            return None
        digest = token_hash(token)
        rows = list(
            self.db.query(
                f"SELECT {', '.join(_COLUMNS)} FROM mcp_tokens WHERE token_sha256 = ?", [digest]
            )
        )
        if not rows or not hmac.compare_digest(str(rows[0]["token_sha256"]), digest):
            return None
        found = McpToken.from_row(rows[0])
        return found if found.state(self.clock()) == "active" else None

    def tokens(self) -> list[McpToken]:
        """Every token issued, oldest first (revoked and expired ones included)."""
        rows = self.db.query(
            f"SELECT {', '.join(_COLUMNS)} FROM mcp_tokens ORDER BY created_at, name"
        )
        return [McpToken.from_row(r) for r in rows]

    def revoke(self, name: str) -> McpToken:
        """Revoke the token ``name`` from now on (again: no change); its record.

        Raises:
            McpTokenError: no token has that name.
        """
        with self.transaction() as db:
            db.execute(
                "UPDATE mcp_tokens SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
                [self.clock(), name],
            )
            rows = list(
                db.query(f"SELECT {', '.join(_COLUMNS)} FROM mcp_tokens WHERE name = ?", [name])
            )
        if not rows:
            raise McpTokenError(f"No MCP token is named {name!r} (kb mcp-token list shows them).")
        return McpToken.from_row(rows[0])


def _check(name: str, user_id: str, scopes: tuple[str, ...], expires_in_days: float | None) -> None:
    if not _NAME.fullmatch(name):
        raise McpTokenError(
            f"Token name {name[:80]!r} is not usable: 1 to 64 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit."
        )
    if not _USER.fullmatch(user_id):
        raise McpTokenError(
            f"{user_id[:80]!r} is not a Slack user id (U... or W..., as in the person's "
            "profile: Copy member ID)."
        )
    for scope in scopes:
        if scope == EVERYONE:
            raise McpTokenError(
                "Documents for everyone are always searchable: give only channel ids with --scope."
            )
        if not _CHANNEL.fullmatch(scope):
            raise McpTokenError(f"{scope[:80]!r} is not a Slack channel id (C... or G...).")
    if expires_in_days is not None and not (expires_in_days > 0 and math.isfinite(expires_in_days)):
        # inf would be stored, and written to --json as Infinity, which is not JSON.
        raise McpTokenError("--expires-days must be a positive number of days.")
