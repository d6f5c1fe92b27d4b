"""Sign in with Slack for the document viewer (``KB_VIEWER_AUTH=slack``), by OpenID Connect.

1. The viewer sends a browser without a session to ``/auth/slack/login?next=<path>``.
2. That page carries the link's ``#char=``/``#page=`` fragment (it never reaches a
   server, and Slack's consent page would drop it) to ``/auth/slack/start``, which
   keeps ``next``, a ``state`` and a ``nonce`` in a short-lived signed cookie sent
   only to ``/auth/slack/`` and redirects to Slack's authorize page.
3. Slack sends the browser back to ``/auth/slack/callback`` with a ``code`` and the
   ``state``, which must be the cookie's and is accepted once. The code is
   exchanged with ``openid.connect.token``; the reader is whom
   ``openid.connect.userInfo`` names, provided the id_token carries this browser's
   nonce and both name this workspace. A session cookie is set
   (``bot.server.readers``) and the browser goes back to ``next``.
4. Signing out is a POST to ``/auth/logout`` carrying the session's form token
   (the viewer's Sign out button); a GET there only shows that button, so a
   link, an image or another site's form signs nobody out.

The id_token's signature (RS256, keys at slack.com/openid/connect/keys) is not
checked: the token comes straight from Slack's token endpoint over TLS, in
answer to a request authenticated with the client secret, which OpenID Connect
Core (3.1.3.7, item 6) accepts in place of the signature; checking it would add a
key fetch and cache and no assurance. The identity comes from
``openid.connect.userInfo``, asked with the access token of that same exchange;
the id_token adds its audience and nonce, which tie the answer to this app and to
the browser that started the sign-in. The access token is used once and dropped.

Who reads what (:class:`SlackReaders`) is the access rule's (``bot.access``):
anyone signed in to this workspace reads the documents for everyone; a
channel's documents need membership of that channel (``conversations.members``
with the bot token, remembered for a minute in the cache every surface shares).
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import html
import json
import logging
import math
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from aiohttp import web
from itsdangerous import BadData, URLSafeTimedSerializer
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import (
    SLACK_UNREACHABLE,
    Access,
    AccessCheckUnavailable,
    Memberships,
    Person,
    ask_slack,
    slack_error,
)
from bot.server import routes
from bot.server.readers import (
    FORM_PURPOSE,
    READER_GATE,
    SESSION_PURPOSE,
    SIGN_OUT_PATH,
    CookiePolicy,
    Reader,
    ReaderGate,
    Sessions,
    local_path,
)
from bot.slack.config import SignInConfig, SlackConfig
from core.links import LinkSigner
from index.errors import KBError
from index.storage import UsedStates

log = logging.getLogger(__name__)
# The SDK logs whole responses at DEBUG, and the token exchange's carries the
# reader's access token: these clients log at INFO at most, whatever the root says.
_api_log = logging.getLogger(f"{__name__}.api")
_api_log.setLevel(logging.INFO)

__all__ = [
    "CALLBACK_PATH",
    "LOGIN_PATH",
    "LOGOUT_PATH",
    "SCOPES",
    "START_PATH",
    "STATE_COOKIE",
    "SlackReaders",
    "attach",
    "authorize_url",
]

LOGIN_PATH = "/auth/slack/login"
START_PATH = "/auth/slack/start"
CALLBACK_PATH = "/auth/slack/callback"
LOGOUT_PATH = SIGN_OUT_PATH
STATE_COOKIE = "kb_signin"
STATE_PURPOSE = "kb-signin-state"
STATE_TTL_SECONDS = 600
SCOPES = "openid profile"
TEAM_CLAIM = "https://slack.com/team_id"
USER_CLAIM = "https://slack.com/user_id"
_STATE_COOKIE_PATH = "/auth/slack"
# What signin.js may carry over: RFC 5147 char ranges and PDF pages, nothing else.
_FRAGMENT_RE = re.compile(r"(char|page)=[0-9A-Za-z,;=.-]{0,200}")
_PAGE_CSP = (
    "default-src 'none'; script-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
# The sign-out page: its one form posts to this server; never in a frame (no clickjacking).
_SIGN_OUT_CSP = "default-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

SIGN_IN_TITLE = "Sign in with Slack to read this document"
SIGNED_IN = "You are signed in. Open the citation link again to read the document."
SIGNED_OUT = "You are signed out of the knowledge base."
SIGN_OUT_TITLE = "Sign out of the knowledge base?"
NOT_SIGNED_IN = "You are not signed in to the knowledge base."
FOREIGN_SIGN_OUT = (
    "This sign-out did not come from the knowledge base's own page, so nothing changed. "
    "To sign out, use the Sign out button on a document's page."
)
BAD_NEXT = "This sign-in link is not valid. Open the citation link again."
STALE_SIGN_IN = (
    "This sign-in expired or was started in another browser. Open the citation link again."
)
CANCELLED = "Sign-in was cancelled in Slack."
NOT_CONFIRMED = "Slack did not confirm your sign-in. Open the citation link again."
OTHER_WORKSPACE = "You signed in to another Slack workspace than this knowledge base's."


def authorize_url(api_url: str) -> str:
    """Slack's OpenID authorize page, on the host of the Web API (``SLACK_API_URL``)."""
    parts = urlsplit(api_url)
    return f"{parts.scheme}://{parts.netloc}/openid/connect/authorize"


# ---------------------------------------------------------------- who reads what


class SlackReaders(ReaderGate):
    """People signed in with Slack read what the access rule lets them (``bot.access``)."""

    def __init__(self, sessions: Sessions, access: Access, public_url: str) -> None:
        if access.directory is None or access.members is None:
            raise ValueError("Sign in with Slack needs SLACK_BOT_TOKEN to check who reads what.")
        self.sessions = sessions
        self.access = access
        self._public_url = public_url.rstrip("/")

    @property
    def members(self) -> Memberships:
        """Who is in each channel: the cache every surface shares."""
        assert self.access.members is not None  # checked when built
        return self.access.members

    async def team_id(self) -> str:
        """The workspace the knowledge base serves (``auth.test``, asked once).

        Raises:
            AccessCheckUnavailable: Slack cannot be reached or refuses the bot token.
        """
        assert self.access.directory is not None  # checked when built
        return await self.access.directory.home_team()

    def login_url(self, next_path: str) -> str:
        """The sign-in page, absolute on the public URL (a path prefix keeps working)."""
        return f"{self._public_url}{LOGIN_PATH}?{urlencode({'next': next_path})}"

    async def may_read(self, reader: Reader, scope: str) -> bool:
        """Members of this workspace read ``*``; a channel's scope needs its membership too.

        Raises:
            AccessCheckUnavailable: who is in the channel cannot be known now.
        """
        decision = await self.access.may_read(Person(reader.user_id, reader.team_id), scope)
        if decision.unknown:
            raise AccessCheckUnavailable(SLACK_UNREACHABLE)
        if not decision.allowed:
            log.info("%s may not read scope %s: %s", reader.user_id, scope, decision.reason)
        return decision.allowed


# ---------------------------------------------------------------- the sign-in flow


@dataclass(frozen=True)
class _Pending:
    """A sign-in this browser started: what the signed state cookie holds."""

    state: str
    nonce: str
    next_path: str
    fragment: str


class _Refused(Exception):
    """A sign-in that must not succeed: ``message`` for the person, ``reason`` for the log."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.message = message


class SignIn:
    """The routes: the sign-in page, the redirect to Slack, Slack's callback, sign-out."""

    def __init__(
        self,
        config: SignInConfig,
        *,
        api_url: str,
        readers: SlackReaders,
        states: URLSafeTimedSerializer,
        client: AsyncWebClient,
        used_states: UsedStates,
    ) -> None:
        self._config = config
        self._authorize_url = authorize_url(api_url)
        self._redirect_uri = config.public_url.rstrip("/") + CALLBACK_PATH
        self._readers = readers
        self._states = states
        self._client = client
        self._cookies = readers.sessions.cookies
        # In the shared store: a callback replayed to another replica is refused there too.
        self._used_states = used_states

    async def login(self, request: web.Request) -> web.Response:
        """``GET /auth/slack/login?next=<path>``: a page that goes on to Slack at once."""
        next_path = self._next(request)
        if next_path is None:
            return routes.simple_page(400, BAD_NEXT)
        href = "start?" + urlencode({"next": next_path})
        body = (
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="referrer" content="no-referrer"><title>Knowledge base</title></head>'
            f"<body><main><h1>{html.escape(SIGN_IN_TITLE)}</h1>"
            f'<p><a id="signin" href="{html.escape(href)}">Sign in with Slack</a></p></main>'
            # Relative, like the viewer's assets, so a path prefix keeps working.
            '<script src="../../static/signin.js"></script></body></html>'
        )
        return web.Response(
            text=body, content_type="text/html", headers={"Content-Security-Policy": _PAGE_CSP}
        )

    async def start(self, request: web.Request) -> web.Response:
        """``GET /auth/slack/start?next=...&fragment=...``: remember the sign-in, go to Slack."""
        next_path = self._next(request)
        if next_path is None:
            return routes.simple_page(400, BAD_NEXT)
        fragment = request.query.get("fragment", "")
        pending = _Pending(
            state=secrets.token_urlsafe(32),
            nonce=secrets.token_urlsafe(32),
            next_path=next_path,
            fragment=fragment if _FRAGMENT_RE.fullmatch(fragment) else "",
        )
        params = {
            "response_type": "code",
            "scope": SCOPES,
            "client_id": self._config.client_id,
            "state": pending.state,
            "nonce": pending.nonce,
            "redirect_uri": self._redirect_uri,
            # Skips Slack's workspace picker: only this workspace's people may read.
            "team": await self._readers.team_id(),
        }
        response = web.Response(
            status=302, headers={"Location": f"{self._authorize_url}?{urlencode(params)}"}
        )
        value = self._states.dumps(
            [pending.state, pending.nonce, pending.next_path, pending.fragment]
        )
        self._cookies.set(
            response, STATE_COOKIE, value, max_age=STATE_TTL_SECONDS, path=_STATE_COOKIE_PATH
        )
        return response

    async def callback(self, request: web.Request) -> web.Response:
        """``GET /auth/slack/callback?code=...&state=...``: Slack's answer; sign the reader in."""
        try:
            pending = await self._pending(request)
            reader = await self._identify(request.query.get("code", ""), pending.nonce)
        except _Refused as exc:
            log.info("refused a Slack sign-in: %s", exc)
            response = routes.simple_page(exc.status, exc.message)
            self._cookies.delete(response, STATE_COOKIE, path=_STATE_COOKIE_PATH)
            return response
        log.info("%s signed in to the viewer", reader.user_id)
        response = self._landing(pending)
        self._readers.sessions.start(response, reader)
        self._cookies.delete(response, STATE_COOKIE, path=_STATE_COOKIE_PATH)
        return response

    async def sign_out_page(self, request: web.Request) -> web.Response:
        """``GET /auth/logout``: the Sign out button (a GET signs nobody out)."""
        token = self._readers.sessions.form_token(request)
        if token is None:
            return routes.simple_page(200, NOT_SIGNED_IN)
        body = (
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            '<meta name="referrer" content="no-referrer"><title>Knowledge base</title></head>'
            f"<body><main><h1>{html.escape(SIGN_OUT_TITLE)}</h1>"
            # Relative to /auth/logout: a path prefix keeps working.
            f"{routes.sign_out_form('logout', token)}</main></body></html>"
        )
        return web.Response(
            text=body,
            content_type="text/html",
            # Cache-Control: private, no-store comes with every /auth/ page (bot.server.routes).
            headers={"Content-Security-Policy": _SIGN_OUT_CSP},
        )

    async def sign_out(self, request: web.Request) -> web.Response:
        """``POST /auth/logout``: end this browser's session, if the form carries its token.

        Only a valid token touches the cookie: a post without one changes nothing,
        not even a cookie the browser did not send.
        """
        sessions = self._readers.sessions
        reader = sessions.reader(request)
        if reader is None:
            return routes.simple_page(200, NOT_SIGNED_IN)
        form = await request.post()
        token = form.get("token")
        if not (isinstance(token, str) and sessions.form_token_matches(request, token)):
            log.warning("refused a sign-out of %s without its session's token", reader.user_id)
            return routes.simple_page(403, FOREIGN_SIGN_OUT)
        log.info("%s signed out of the viewer", reader.user_id)
        response = routes.simple_page(200, SIGNED_OUT)
        sessions.end(response)
        return response

    # ------------------------------------------------------------ the steps

    @staticmethod
    def _next(request: web.Request) -> str | None:
        """The local path to come back to; ``""`` when none was given; ``None`` when refused."""
        value = request.query.get("next", "")
        return local_path(value) if value else ""

    async def _pending(self, request: web.Request) -> _Pending:
        """The sign-in this browser started, if ``state`` is its own and used for the first time."""
        raw = request.cookies.get(STATE_COOKIE, "")
        try:
            payload = self._states.loads(raw, max_age=STATE_TTL_SECONDS)
        except BadData as exc:
            raise _Refused(400, STALE_SIGN_IN, "no valid sign-in state cookie") from exc
        if not (isinstance(payload, list) and len(payload) == 4):
            raise _Refused(400, STALE_SIGN_IN, "a sign-in state cookie of an unexpected shape")
        pending = _Pending(*(str(x) for x in payload))
        state = request.query.get("state", "")
        if not hmac.compare_digest(state.encode(), pending.state.encode()):
            raise _Refused(400, STALE_SIGN_IN, "the state does not match this browser's")
        if not await self._first_use(pending.state):
            raise _Refused(400, STALE_SIGN_IN, "the state was used before")
        if "error" in request.query:
            raise _Refused(403, CANCELLED, f"Slack answered {request.query['error'][:60]!r}")
        return pending

    async def _first_use(self, state: str) -> bool:
        """Remember ``state`` until it would have expired anyway; false if any replica saw it.

        Only a state whose signed cookie matched gets here, so what is kept is
        bounded by the sign-ins started in the last ``STATE_TTL_SECONDS``.
        """
        try:
            return await asyncio.to_thread(
                self._used_states.claim, state, ttl_seconds=STATE_TTL_SECONDS
            )
        except KBError as exc:  # not known to be unused: refused, never let through
            raise _Refused(
                503, routes.PAGE_ERROR, f"the used states cannot be checked: {exc}"
            ) from exc

    async def _identify(self, code: str, nonce: str) -> Reader:
        """Exchange ``code``, check the answer belongs to this sign-in and workspace."""
        try:
            # The credentials as form fields, which Slack documents for this method:
            # the SDK's openid_connect_token sends them with aiohttp's deprecated BasicAuth.
            tokens = await ask_slack(
                self._client.api_call(
                    "openid.connect.token",
                    data={
                        "client_id": self._config.client_id,
                        "client_secret": self._config.client_secret,
                        "code": code,
                        "redirect_uri": self._redirect_uri,
                        "grant_type": "authorization_code",
                    },
                )
            )
            claims = _claims(str(tokens.get("id_token") or ""))
            info = await ask_slack(
                self._client.openid_connect_userInfo(token=str(tokens.get("access_token") or ""))
            )
        except SlackApiError as exc:
            raise _Refused(403, NOT_CONFIRMED, f"Slack answered {slack_error(exc)}") from exc
        self._check_claims(claims, nonce)
        reader = Reader(user_id=_user(info), team_id=str(info.get(TEAM_CLAIM) or ""))
        if (_user(claims), str(claims.get(TEAM_CLAIM) or "")) != (reader.user_id, reader.team_id):
            raise _Refused(403, NOT_CONFIRMED, "the id_token and userInfo name different people")
        if not reader.user_id or reader.team_id != await self._readers.team_id():
            raise _Refused(403, OTHER_WORKSPACE, f"{reader.user_id} of team {reader.team_id!r}")
        return reader

    def _check_claims(self, claims: dict[str, Any], nonce: str) -> None:
        audience = claims.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self._config.client_id not in audiences:
            raise _Refused(403, NOT_CONFIRMED, "the id_token is for another app")
        if not hmac.compare_digest(str(claims.get("nonce") or "").encode(), nonce.encode()):
            raise _Refused(403, NOT_CONFIRMED, "the id_token's nonce is not this sign-in's")
        expires = claims.get("exp")
        # A time, not true (1), NaN (never <= now) or Infinity: JSON's parser reads both.
        if (
            isinstance(expires, bool)
            or not isinstance(expires, int | float)
            or not math.isfinite(expires)
            or expires <= time.time()
        ):
            raise _Refused(403, NOT_CONFIRMED, "the id_token has expired")

    def _landing(self, pending: _Pending) -> web.Response:
        """Back to the document (with its fragment), or a page saying the person is signed in."""
        if not pending.next_path:
            return routes.simple_page(200, SIGNED_IN)
        fragment = f"#{pending.fragment}" if pending.fragment else ""
        location = self._config.public_url.rstrip("/") + pending.next_path + fragment
        return web.Response(status=302, headers={"Location": location})


def _claims(id_token: str) -> dict[str, Any]:
    """The claims of a JWT, unverified: see the module's docstring for why that is sound here."""
    parts = id_token.split(".")
    if len(parts) != 3:
        raise _Refused(403, NOT_CONFIRMED, "the id_token is not a JWT")
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError as exc:
        raise _Refused(403, NOT_CONFIRMED, "the id_token's claims cannot be read") from exc
    if not isinstance(claims, dict):
        raise _Refused(403, NOT_CONFIRMED, "the id_token's claims are not an object")
    return claims


def _user(claims: Any) -> str:
    return str(claims.get(USER_CLAIM) or claims.get("sub") or "")


def attach(
    app: web.Application,
    config: SignInConfig,
    slack: SlackConfig,
    signer: LinkSigner,
    access: Access,
) -> SlackReaders:
    """Require Slack sign-in for the viewer of ``app``: register the gate and ``/auth/`` routes.

    Args:
        app: the web application (``bot.server.routes`` already set up).
        config: the app's OAuth credentials, the public URL, the session's lifetime.
        slack: the Web API's address (Slack's authorize page is on its host).
        signer: the link signer, whose secret keys the session and sign-in cookies.
        access: who reads what (over Slack, with the bot token).
    """
    sessions = Sessions(
        signer.derived(SESSION_PURPOSE),
        forms=signer.derived(FORM_PURPOSE),
        ttl_seconds=config.session_seconds,
        cookies=CookiePolicy.for_public_url(config.public_url),
    )
    readers = SlackReaders(sessions, access, config.public_url)
    flow = SignIn(
        config,
        api_url=slack.api_url,
        readers=readers,
        states=signer.derived(STATE_PURPOSE),
        # No token: the exchange authenticates with the client id and secret.
        client=AsyncWebClient(base_url=slack.api_url, logger=_api_log),
        used_states=app[routes.KB].used_states,
    )
    app[READER_GATE] = readers
    app.router.add_get(LOGIN_PATH, flow.login)
    app.router.add_get(START_PATH, flow.start)
    app.router.add_get(CALLBACK_PATH, flow.callback)
    app.router.add_get(LOGOUT_PATH, flow.sign_out_page)
    app.router.add_post(LOGOUT_PATH, flow.sign_out)
    return readers
