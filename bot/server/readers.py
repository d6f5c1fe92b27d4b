"""Who reads: the signed-in readers of the viewer, when sign-in is required.

With sign-in on, a link alone opens nothing: the viewer asks a :class:`ReaderGate`,
registered by an identity surface (``bot.slack.people.signin``), who the browser's
session belongs to and whether that person may read the link's scope. This
module is the surface-neutral part: the session cookie, the gate's interface,
and the check that a destination after sign-in is a path on this server.

The session cookie is signed (a key derived from the link secret), holds the
reader's user and team ids and nothing secret, and expires after a few hours;
ending it in one browser does not revoke a copy of the cookie elsewhere, which
is why it is short-lived and HttpOnly.

Signing out is a form posted to :data:`SIGN_OUT_PATH` from the server's own
pages, never a plain link: the cookie is ``SameSite=Lax`` (a page of another
site posts without it), and the form carries a token tied to the session
(:meth:`Sessions.form_token`, signed with a key of its own), which a page of
another origin cannot read, so neither a link, an image nor a forged form on
any other page signs a reader out.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web
from itsdangerous import BadData, URLSafeTimedSerializer

# Who may read what is the access rule's: its "cannot say now" is the viewer's 503.
from bot.access import AccessCheckUnavailable

log = logging.getLogger(__name__)

__all__ = [
    "FORM_PURPOSE",
    "READER_GATE",
    "SESSION_COOKIE",
    "SESSION_PURPOSE",
    "SIGN_OUT_PATH",
    "AccessCheckUnavailable",
    "CookiePolicy",
    "Reader",
    "ReaderGate",
    "Sessions",
    "local_path",
]

SESSION_COOKIE = "kb_session"
# The salt of the session's signing key: a session never verifies as a link or a sign-in state.
SESSION_PURPOSE = "kb-viewer-session"
# The salt of the key that signs a session's form token (sign-out): it never verifies as a session.
FORM_PURPOSE = "kb-viewer-form"
# Where a signed-in reader posts to sign out (the identity surface serves it).
SIGN_OUT_PATH = "/auth/logout"
_MAX_LOCAL_PATH = 4096


@dataclass(frozen=True)
class Reader:
    """A signed-in person: their user id and the team they signed in to."""

    user_id: str
    team_id: str


@dataclass(frozen=True)
class CookiePolicy:
    """Where the viewer's cookies apply: ``Secure`` over https, scoped to the public URL's path."""

    secure: bool
    path: str

    @classmethod
    def for_public_url(cls, public_url: str) -> CookiePolicy:
        """The policy for a server people reach at ``public_url`` (``KB_PUBLIC_URL``)."""
        parts = urlsplit(public_url)
        return cls(secure=parts.scheme == "https", path=parts.path.rstrip("/") or "/")

    def set(
        self, response: web.StreamResponse, name: str, value: str, *, max_age: int, path: str = ""
    ) -> None:
        """Set a cookie scripts cannot read, sent on top-level navigations from other sites.

        ``SameSite=Lax`` rather than ``Strict``: the browser comes back from
        Slack's sign-in page (another site) and opens links clicked in Slack.
        """
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path=self.path.rstrip("/") + path if path else self.path,
            secure=self.secure,
            httponly=True,
            samesite="Lax",
        )

    def delete(self, response: web.StreamResponse, name: str, *, path: str = "") -> None:
        """Expire the cookie ``name`` (set with the same ``path``)."""
        response.del_cookie(
            name,
            path=self.path.rstrip("/") + path if path else self.path,
            secure=self.secure,
            httponly=True,
            samesite="Lax",
        )


class Sessions:
    """The viewer's session cookie: issue, read, end.

    Args:
        serializer: signs the cookie (see ``core.links.LinkSigner.derived``).
        forms: signs the session's form tokens (a key of another purpose, :data:`FORM_PURPOSE`).
        ttl_seconds: how long a session lasts after sign-in.
        cookies: the cookie attributes.
    """

    def __init__(
        self,
        serializer: URLSafeTimedSerializer,
        *,
        forms: URLSafeTimedSerializer,
        ttl_seconds: int,
        cookies: CookiePolicy,
    ) -> None:
        self._serializer = serializer
        self._forms = forms
        self.ttl_seconds = ttl_seconds
        self.cookies = cookies

    def start(self, response: web.StreamResponse, reader: Reader) -> None:
        """Sign ``reader`` in on ``response``'s browser."""
        value = self._serializer.dumps([reader.user_id, reader.team_id])
        self.cookies.set(response, SESSION_COOKIE, value, max_age=self.ttl_seconds)

    def reader(self, request: web.Request) -> Reader | None:
        """Who ``request``'s browser is signed in as; ``None`` without a valid, unexpired session."""
        raw = request.cookies.get(SESSION_COOKIE)
        if not raw:
            return None
        try:
            payload = self._serializer.loads(raw, max_age=self.ttl_seconds)
        except BadData as exc:
            # Expired, forged, or signed with a secret that has since changed.
            log.info("ignored a viewer session cookie: %s", type(exc).__name__)
            return None
        if (
            isinstance(payload, list)
            and len(payload) == 2
            and all(isinstance(x, str) and x for x in payload)
        ):
            return Reader(user_id=payload[0], team_id=payload[1])
        log.warning("ignored a correctly signed viewer session of an unexpected shape")
        return None

    def end(self, response: web.StreamResponse) -> None:
        """Sign the browser out."""
        self.cookies.delete(response, SESSION_COOKIE)

    def form_token(self, request: web.Request) -> str | None:
        """A token for a form of ``request``'s session (sign-out); ``None`` without a session.

        It is bound to this very session cookie (a digest of it, signed), so it
        is worth nothing with another session, and it lasts as long as one.
        """
        if self.reader(request) is None:
            return None
        return str(self._forms.dumps(_digest(request.cookies[SESSION_COOKIE])))

    def form_token_matches(self, request: web.Request, token: str) -> bool:
        """Whether ``token`` came from a form of ``request``'s own, valid session."""
        if self.reader(request) is None or not token:
            return False
        try:
            bound = self._forms.loads(token, max_age=self.ttl_seconds)
        except BadData:
            return False
        expected = _digest(request.cookies[SESSION_COOKIE])
        return isinstance(bound, str) and hmac.compare_digest(bound, expected)


class ReaderGate(ABC):
    """Decides who may read what when sign-in is required (registered under :data:`READER_GATE`)."""

    sessions: Sessions

    @abstractmethod
    def login_url(self, next_path: str) -> str:
        """Where to send a browser without a session, to come back to ``next_path`` afterwards."""

    @abstractmethod
    async def may_read(self, reader: Reader, scope: str) -> bool:
        """Whether ``reader`` may read documents of ``scope`` (``*`` or a channel id).

        Raises:
            AccessCheckUnavailable: the answer cannot be known right now.
        """


READER_GATE: web.AppKey[ReaderGate] = web.AppKey("reader_gate")


def _digest(cookie: str) -> str:
    """What a form token binds to: the session cookie, hashed (the token shows no part of it)."""
    return hashlib.sha256(cookie.encode()).hexdigest()


def local_path(value: str) -> str | None:
    """``value`` if it is a path on this server (``/d/7?t=...``), otherwise ``None``.

    Whatever a browser could resolve to another host is refused: absolute and
    scheme-relative URLs (``//evil.example``, and ``/\\evil.example``, since
    browsers read a backslash as a slash), whitespace and control characters.
    """
    if not value.startswith("/") or len(value) > _MAX_LOCAL_PATH:
        return None
    if "\\" in value or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in value):
        return None
    parts = urlsplit(value)
    if value.startswith("//") or parts.scheme or parts.netloc:
        return None
    return value
