"""Local servers that speak real protocols, so tests exercise real clients offline.

* :class:`MockSlackAPI` answers the Slack Web API (``/api/<method>``), serves
  private file downloads the way Slack does, records ``response_url`` posts, is
  a Socket Mode server (``apps.connections.open`` hands out its websocket), and
  plays Sign in with Slack (``/openid/connect/authorize`` and ``openid.connect.*``).
* :class:`OpenAICompatServer` answers ``/v1/chat/completions`` (plain and
  streamed), ``/v1/embeddings`` (deterministic hashed bag-of-words vectors) and
  ``/v1/models`` like an OpenAI-compatible endpoint.
* :func:`sign_slack_request` and the payload builders produce signed requests in
  Slack's documented shapes, to drive the real bolt app over HTTP.

Both servers bind 127.0.0.1 on a random free port and are async context managers::

    async with MockSlackAPI() as slack, OpenAICompatServer() as llm:
        client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
        openai_client = AsyncOpenAI(base_url=llm.url, api_key="x")

Nothing here reaches the internet: every URL a helper hands out points at one of
these servers or at a local port that refuses connections.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import html
import itertools
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import PurePosixPath
from typing import Any, Protocol, Self
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.test_utils import TestServer
from slack_sdk.errors import SlackObjectFormationError
from slack_sdk.models.blocks import Block
from slack_sdk.models.messages.chunk import Chunk
from slack_sdk.models.metadata import (
    EntityActionButton,
    EntityActions,
    EntityAttributes,
    EntityCustomField,
    EntityMetadata,
    EntityPayload,
    EntityTitle,
)
from slack_sdk.models.views import View

__all__ = [
    "APP_ID",
    "BOT_ID",
    "BOT_USER_ID",
    "CHANNEL_ID",
    "CLIENT_ID",
    "DEFAULT_APP_TOKEN",
    "DEFAULT_BOT_TOKEN",
    "DEFAULT_CLIENT_SECRET",
    "DEFAULT_OPENAI_API_KEY",
    "DEFAULT_SIGNING_SECRET",
    "DM_CHANNEL_ID",
    "ENTERPRISE_ID",
    "SHUTDOWN_POLL_S",
    "TEAM_ID",
    "UNREACHABLE_RESPONSE_URL",
    "USER_ID",
    "MockSlackAPI",
    "OpenAICompatServer",
    "agent_session_stopped_event",
    "app_mention_event",
    "block_actions_body",
    "button_action",
    "closed_port_url",
    "event_body",
    "event_payload",
    "feedback_action",
    "file_input_state",
    "file_share_event",
    "message_im_event",
    "sign_slack_request",
    "slack_headers",
    "slack_ts",
    "slash_command_body",
    "slash_command_payload",
    "socket_envelope",
    "url_verification_body",
    "view_submission_body",
]

# Identifiers shared by the mock API and the payload builders, so that an event
# built with the defaults mentions the same bot the mock's auth.test reports.
TEAM_ID = "T0TEAM0001"
ENTERPRISE_ID = None
APP_ID = "A0APP00001"
BOT_USER_ID = "U0BOT00001"
BOT_ID = "B0BOT00001"
USER_ID = "U0USER0001"
CHANNEL_ID = "C0CHAN0001"
DM_CHANNEL_ID = "D0DM000001"
# Every secret default here is a canary, a distinctive value holding "canary": the
# test session fails if one shows up in a log record or a data file (tests/canaries.py).
DEFAULT_BOT_TOKEN = "xoxb-canary-bot-0c1d3a7e5f"
DEFAULT_APP_TOKEN = "xapp-1-canary-app-9b2e4d6f81"
DEFAULT_SIGNING_SECRET = "canary-signing-secret-5e8a1f03"
DEFAULT_OPENAI_API_KEY = "sk-canary-openai-3d7c9e21"
DEFAULT_EMBEDDING_API_KEY = "sk-canary-embeddings-6a2f90c4"
# The Slack app's OAuth credentials, for Sign in with Slack.
CLIENT_ID = "1111111111.2222222222"
DEFAULT_CLIENT_SECRET = "canary-client-secret-7d1e9b44"
# A user token of the person who owns the organisation's Slackbot skill.
DEFAULT_SKILL_TOKEN = "xoxp-canary-skill-owner-4f2b7c90"
# The MCP server the app declares (its key under mcp_servers in the manifest).
MCP_SERVER_ID = "knowledge-base"
# The API token of the mock Confluence (tests/confluence_server.py).
DEFAULT_CONFLUENCE_TOKEN = "atl-canary-confluence-4f8b2c61"
# The client secret of the app registration the mock Microsoft sign-in knows (tests/sharepoint_server.py).
DEFAULT_SHAREPOINT_CLIENT_SECRET = "Xq8~canary-sharepoint-secret-2d9a61"
# The internal integration secret of the mock Notion (tests/notion_server.py).
DEFAULT_NOTION_TOKEN = "ntn_canary-notion-2b9d7e15"
# What every access token the mock Google token endpoint gives begins with (tests/gdrive_server.py).
DEFAULT_GDRIVE_TOKEN = "ya29.canary-gdrive-7e2a91c5"
# Port 1 (tcpmux) is never served on a test machine: a response_url left at its
# default makes the bot fail fast and locally instead of calling hooks.slack.com.
UNREACHABLE_RESPONSE_URL = "http://127.0.0.1:1/response-url-not-set"
# How long a test waits for a call it expects: a ceiling, not an expectation, generous so
# that a loaded 2-core machine does not turn a slow call into a failure.
WAIT_SECONDS = 15.0

JSONDict = dict[str, Any]

_ids = itertools.count(1)


def _next_id(prefix: str) -> str:
    """A fresh Slack-looking id (``F0000000003``) unique within the test session."""
    return f"{prefix}{next(_ids):010d}"


class _TsClock:
    """Message timestamps as Slack writes them: ``"<seconds>.<6 digits>"``, strictly increasing."""

    def __init__(self) -> None:
        self._micros = int(time.time()) * 1_000_000

    def next(self) -> str:
        # Step by 100 us so that two calls never collide, even in the same microsecond.
        self._micros = max(self._micros + 100, int(time.time() * 1_000_000))
        seconds, micros = divmod(self._micros, 1_000_000)
        return f"{seconds}.{micros:06d}"


_clock = _TsClock()


def slack_ts() -> str:
    """A new, strictly increasing Slack message timestamp (``"1767225600.000100"``)."""
    return _clock.next()


def closed_port_url(path: str = "/v1") -> str:
    """A ``http://127.0.0.1:<port><path>`` URL on which nothing listens.

    The port is free at the time of the call (the OS handed it out and it was
    released), so connecting to it is refused immediately: the way to test
    "the model endpoint is down" without waiting for a timeout.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"


# How often a threaded server's loop looks for shutdown(): shutdown() waits for it,
# so at the default 0.5 s every test would wait out half a second at its end.
SHUTDOWN_POLL_S = 0.02


@contextlib.contextmanager
def threaded_http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """``handler`` served on 127.0.0.1 and a random port, in a thread; yields the port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S}, daemon=True
    )
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


class _LocalServer:
    """An aiohttp application on 127.0.0.1 and a random port, as an async context manager."""

    def __init__(self) -> None:
        self._server: TestServer | None = None
        self._base_url = ""
        self._closing = asyncio.Event()

    def _build_app(self) -> web.Application:  # pragma: no cover - abstract
        raise NotImplementedError

    async def start(self) -> None:
        """Start listening; :attr:`base_url` is valid afterwards (and stays so after close)."""
        if self._server is not None:
            return
        self._closing = asyncio.Event()
        self._server = TestServer(self._build_app(), host="127.0.0.1", port=0)
        await self._server.start_server()
        self._base_url = f"http://127.0.0.1:{self._server.port}"

    async def close(self) -> None:
        """Stop listening. Connections to :attr:`base_url` are refused afterwards."""
        # Wake handlers sleeping in a simulated delay so shutdown is immediate.
        self._closing.set()
        if self._server is not None:
            await self._server.close()
            self._server = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` without a trailing slash."""
        if not self._base_url:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._base_url

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but return at once when the server is closing."""
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), timeout=seconds)


async def _until_set(gate: asyncio.Event, closing: asyncio.Event) -> None:
    """Wait until ``gate`` is set, or the server is closing."""
    waits = [asyncio.create_task(gate.wait()), asyncio.create_task(closing.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _wait_until(
    predicate: Callable[[], bool], cond: asyncio.Condition, timeout: float, what: Callable[[], str]
) -> None:
    """Wait until ``predicate()`` holds, re-checking whenever ``cond`` is notified."""

    async def _wait() -> None:
        async with cond:
            await cond.wait_for(predicate)

    try:
        await asyncio.wait_for(_wait(), timeout=timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s: {what()}") from None


# --------------------------------------------------------------------------- Slack


# Methods that take the app-level token (``xapp-...``) instead of the bot token.
_APP_TOKEN_METHODS = frozenset({"apps.connections.open"})
# Sign in with Slack: the code exchange authenticates the app by its client id and
# secret, and userInfo takes the access token that exchange returned.
_CLIENT_METHODS = frozenset({"openid.connect.token"})
_USER_TOKEN_METHODS = frozenset({"openid.connect.userInfo"})
# Slackbot skills: a user token only (docs.slack.dev/reference/methods/slackbot.skills.create).
_SKILL_METHODS = frozenset(
    {"slackbot.skills.create", "slackbot.skills.update", "slackbot.skills.list"}
)
# Its limits on a skill's fields, in characters.
_SKILL_LIMITS = {"display_name": 255, "description": 400, "example_prompt": 200}
_TEAM_CLAIM = "https://slack.com/team_id"
_USER_CLAIM = "https://slack.com/user_id"
# What the browser sees after clicking "Allow" on Slack's consent page: a new
# navigation to the app's redirect URI (so the page's #fragment is not carried
# along, as it would be through a 302).
_CONSENT_PAGE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><meta http-equiv="refresh" content="0; url={url}"><title>Slack</title></head>
<body><p>Signing you in... <a href="{url}">Continue</a></p></body>
</html>
"""

# Form fields the Slack SDKs JSON-encode when they send form data; decoded so
# that a recorded call looks the same whichever encoding the client chose.
_JSON_FIELDS = frozenset(
    {
        "attachments",
        "blocks",
        "chunks",
        "error",
        "loading_messages",
        "mcp_servers",
        "metadata",
        "prompts",
        "unfurls",
        "user_auth_blocks",
        "view",
    }
)

_FILETYPES = {
    "md": "markdown",
    "markdown": "markdown",
    "txt": "text",
    "text": "text",
    "html": "html",
    "htm": "html",
    "pdf": "pdf",
    "docx": "docx",
    "csv": "csv",
    "json": "json",
    "png": "png",
    "jpg": "jpg",
    "jpeg": "jpg",
}

# What Slack answers for a private file URL fetched without a valid token: the
# sign-in page, with status 200. A client that only checks the status ingests it.
_LOGIN_PAGE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>Slack</title></head>
<body>
<h1>Sign in to your workspace</h1>
<form action="/signin" method="post"><input name="email" type="email"></form>
</body>
</html>
"""


def _text_length(obj: Any) -> int:
    """Length of a text object's ``text`` (0 when absent)."""
    if isinstance(obj, Mapping):
        return len(str(obj.get("text", "")))
    return 0


def _sdk_error(build: Callable[[], object]) -> str | None:
    """What ``slack_sdk.models`` says is wrong with a model built from JSON, or ``None``."""
    try:
        build()
    except SlackObjectFormationError as exc:
        return str(exc)
    except (TypeError, KeyError, AttributeError, ValueError) as exc:  # no model has that shape
        return f"invalid shape: {exc}"
    return None


def _block_model(block: Mapping[str, Any]) -> None:
    """Build ``block`` as its SDK model and back to JSON, which checks it whole."""
    model = Block.parse(dict(block))
    if model is not None:  # None: a type the SDK does not know, let through as before
        model.to_dict()


def _block_errors(blocks: Any, *, max_blocks: int | None) -> list[str]:
    """Check the Block Kit limits Slack enforces; return its style of error strings.

    Each block is built as its ``slack_sdk.models`` class and turned back into JSON:
    the SDK checks every limit it knows, in the block and in each element in it (a
    section's 3000 characters and 10 fields, a header's 150, 10 context elements,
    25 actions, 5 context actions, a button's 75 characters, a block_id's 255...).
    What the SDK does not check is asserted here, as Slack's documented numbers.
    ``max_blocks``: 50 for a message; ``None`` for a view, whose 100 the SDK checks.
    """
    if not isinstance(blocks, list):
        return ["blocks must be an array [json-pointer:/blocks]"]
    errors: list[str] = []
    # "up to 50 blocks in each message" (https://docs.slack.dev/reference/block-kit/blocks)
    if max_blocks is not None and len(blocks) > max_blocks:
        errors.append(f"must contain at most {max_blocks} items [json-pointer:/blocks]")
    seen_ids: set[str] = set()
    markdown_total = 0
    for i, block in enumerate(blocks):
        where = f"[json-pointer:/blocks/{i}"
        if not isinstance(block, Mapping) or "type" not in block:
            errors.append(f"missing required field: type {where}]")
            continue
        error = _sdk_error(lambda block=block: _block_model(block))
        if error:
            errors.append(f"{error} {where}]")
        block_id = block.get("block_id")
        if block_id is not None:
            # "block_id should be unique for each message"
            # (https://docs.slack.dev/reference/block-kit/blocks/section-block, and every block's page)
            if block_id in seen_ids:
                errors.append(f"duplicate block_id {where}/block_id]")
            seen_ids.add(str(block_id))
        kind = block["type"]
        if kind == "section":
            # A section's text is 1 to 3000 characters, each of its fields at most 2000
            # (https://docs.slack.dev/reference/block-kit/blocks/section-block): the SDK
            # checks the 3000 but neither the empty text nor the fields' 2000.
            text = block.get("text")
            if text is not None and _text_length(text) == 0:
                errors.append(f"must be more than 0 characters {where}/text/text]")
            for j, fld in enumerate(block.get("fields") or []):
                if _text_length(fld) > 2000:
                    errors.append(f"must be less than 2001 characters {where}/fields/{j}/text]")
        elif kind == "markdown":
            markdown_total += len(str(block.get("text", "")))
    # "The cumulative limit for all markdown blocks in a single payload is 12,000 characters"
    # (https://docs.slack.dev/reference/block-kit/blocks/markdown-block): the SDK checks one block's.
    if markdown_total > 12000:
        errors.append("markdown blocks must total at most 12000 characters [json-pointer:/blocks]")
    return errors


def _view_errors(view: Any) -> list[str]:
    """Check a modal's or a Home tab's limits, then each of its blocks (:func:`_block_errors`).

    ``slack_sdk.models.views.View`` checks the view's own: title, submit and close
    within 24 characters, private_metadata within 3000, callback_id within 255,
    1 to 100 blocks, no submit or close on a Home tab.
    """
    if not isinstance(view, Mapping):
        return ["view must be an object [json-pointer:/view]"]
    errors: list[str] = []
    # views.open takes a modal, views.publish a Home tab (https://docs.slack.dev/reference/views/);
    # the SDK also lets the retired workflow_step through.
    if view.get("type") not in {"modal", "home"}:
        errors.append("must be one of modal, home [json-pointer:/view/type]")
    # A modal's title is required (https://docs.slack.dev/reference/views/modal-views); the SDK
    # checks its length only.
    if view.get("type") == "modal" and "title" not in view:
        errors.append("missing required field: title [json-pointer:/view]")
    error = _sdk_error(lambda: View(**view).validate_json())
    if error:
        errors.append(f"{error} [json-pointer:/view]")
    errors.extend(
        e.replace("/blocks", "/view/blocks")
        for e in _block_errors(view.get("blocks", []), max_blocks=None)
    )
    return errors


@dataclass
class _Override:
    """A scripted answer for some calls of one method."""

    remaining: int | None  # None: every call
    status: int = 200
    body: JSONDict = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds before answering
    passthrough: bool = False  # after the delay, answer as usual
    late: float = 0.0  # passthrough: seconds between doing what the call asks and answering


class _Searchable(Protocol):
    """What Real-time Search searches: ``(body, HTTP status, Retry-After)`` for a call at ``now``."""

    def search(self, params: JSONDict, now: float) -> tuple[JSONDict, int, float]: ...


@dataclass(frozen=True)
class _Grant:
    """Who approved a sign-in, for which nonce and redirect URI."""

    user_id: str
    team_id: str
    nonce: str
    redirect_uri: str


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt_hs256(claims: JSONDict, key: str) -> str:
    """A compact JWT signed with HMAC-SHA256 (Slack signs RS256; nothing here checks either)."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64url(json.dumps(claims).encode())
    mac = hmac.new(key.encode(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64url(mac)}"


class MockSlackAPI(_LocalServer):
    """A local Slack Web API: records every call and answers in Slack's shapes.

    Args:
        bot_token: the token clients must send (``Authorization: Bearer ...`` or a
            ``token`` parameter); anything else gets ``invalid_auth`` /
            ``not_authed``, and private file URLs return the sign-in page.
        app_token: the app-level token ``apps.connections.open`` requires (the
            bot token gets ``not_allowed_token_type``, as from Slack).
        team_id, bot_user_id, bot_id, app_id: identities reported by ``auth.test``.
        admins: user ids that ``users.info`` reports as workspace admins.
        validate: enforce Block Kit and modal limits like Slack (``invalid_blocks``,
            ``invalid_arguments``); switch off to record anything.
        client_id, client_secret: the app's OAuth credentials ``openid.connect.token``
            requires (HTTP Basic or form fields).

    Start it with ``async with MockSlackAPI() as slack:`` (or :meth:`start` /
    :meth:`close`); point a client at :attr:`api_url`. Read what was called with
    :meth:`calls` and :meth:`wait_for`; ``response_url`` posts with :meth:`responses`.

    Socket Mode: ``apps.connections.open`` returns ``ws://.../socket``; a client
    connecting there gets Slack's ``hello``. Push envelopes (:func:`socket_envelope`)
    with :meth:`socket_send` and read the client's acknowledgements with
    :meth:`wait_for_socket_ack` / :attr:`socket_acks`.

    Sign in with Slack: ``GET /openid/connect/authorize`` (on :attr:`url`) approves
    at once for :attr:`signin_user` (see :meth:`sign_in_as`; :meth:`approve` does
    the same without a browser) and sends the browser back to the redirect URI
    with a one-time ``code``; ``openid.connect.token`` exchanges it for an access
    token and an id_token (a JWT signed HS256 with the client secret; tamper with
    its claims through :attr:`id_token_overrides`); ``openid.connect.userInfo``
    answers for that access token. ``conversations.members`` pages through the
    members set with :meth:`set_members`.

    Real-time Search: ``assistant.search.context`` searches :attr:`workspace`
    (``tests/slack_workspace.py``: as the ``action_token``'s person, or public
    channels only, per person rate-limited on :attr:`search_clock`).
    """

    def __init__(
        self,
        *,
        bot_token: str = DEFAULT_BOT_TOKEN,
        app_token: str = DEFAULT_APP_TOKEN,
        team_id: str = TEAM_ID,
        bot_user_id: str = BOT_USER_ID,
        bot_id: str = BOT_ID,
        app_id: str = APP_ID,
        admins: Iterable[str] = (),
        validate: bool = True,
        client_id: str = CLIENT_ID,
        client_secret: str = DEFAULT_CLIENT_SECRET,
    ) -> None:
        super().__init__()
        self.client_id = client_id
        self.client_secret = client_secret
        self.signin_user: str | None = USER_ID
        """Who clicks "Allow" on the authorize page; ``None``: the person cancels."""
        self.signin_team: str = team_id
        """The team the person signs in to."""
        self.authorizations: list[dict[str, str]] = []
        """Query parameters of every request to the authorize page."""
        self.id_token_overrides: JSONDict = {}
        """Claims to replace in the id_tokens issued from now on."""
        self._codes: dict[str, _Grant] = {}
        self._user_tokens: dict[str, _Grant] = {}
        self._caller_token = ""
        self._members: dict[str, list[str]] = {}
        self.ext_shared: set[str] = set()
        """Channels ``conversations.info`` says people of other organisations are in."""
        self._shared_links: dict[tuple[str, str], set[str]] = {}
        self._entity_triggers: dict[str, str] = {}
        self.unfurls: dict[tuple[str, str], list[JSONDict]] = {}
        """Work Object entities ``chat.unfurl`` attached, by ``(channel, ts)`` or ``("unfurl_id", id)``."""
        self.bot_token = bot_token
        self.app_token = app_token
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.bot_id = bot_id
        self.app_id = app_id
        self.validate = validate
        self.agent_app = False
        """Whether the app is declared as an agent in Slack's app settings: only then do
        ``agents.sessions.*`` work (otherwise ``not_allowed``)."""
        self.stop_subscribed = True
        """Whether the app subscribes to ``agent_session_stopped`` (else sessions warn)."""
        self.sessions: dict[tuple[str, str], JSONDict] = {}
        """Agent sessions by ``(channel, thread_ts)``: ``status``, ``title``, ``initiator_user_id``."""
        self._session_log: list[tuple[tuple[str, str], str]] = []
        self.log: list[tuple[str, JSONDict]] = []
        """Every accepted call, in order, as ``(method, params)``."""
        self.rejected: list[tuple[str, JSONDict, str]] = []
        """Calls answered with an error, as ``(method, params, error)`` (auth, limits, scripted)."""
        self.downloads: list[tuple[str, bool]] = []
        """File fetches as ``(file_id, authorised)``."""
        self.messages: dict[tuple[str, str], JSONDict] = {}
        """Messages the bot posted (and updated), by ``(channel, ts)``."""
        self.people_messages: dict[tuple[str, str], JSONDict] = {}
        """Messages people posted (see :meth:`add_person_message`), by ``(channel, ts)``."""
        self.views: dict[str, JSONDict] = {}
        """Views opened, by view id."""
        self.home_views: dict[str, JSONDict] = {}
        """The Home tab last published for each user (``views.publish``), by user id."""
        self.socket_connections = 0
        """How many Socket Mode websockets were opened (reconnections count again)."""
        self.socket_acks: list[JSONDict] = []
        """Messages the Socket Mode client sent back (``{"envelope_id": ..., "payload"?: ...}``)."""
        self._sockets: list[web.WebSocketResponse] = []
        self._response_posts: list[tuple[str, JSONDict]] = []
        self._users: dict[str, JSONDict] = {}
        self._usergroups: dict[str, list[str]] = {}
        self._files: dict[str, tuple[JSONDict, bytes]] = {}
        self._canvases: dict[str, str] = {}
        self._channel_canvases: dict[str, str] = {}
        self._overrides: dict[str, list[_Override]] = {}
        self._trickles: dict[str, tuple[float, int]] = {}
        self._download_holds: dict[str, asyncio.Event] = {}
        self.held_downloads: list[str] = []
        """Files whose download was held open (:meth:`hold_download`), in order."""
        self._handlers: dict[str, Callable[[JSONDict], JSONDict]] = {}
        self.skill_token = DEFAULT_SKILL_TOKEN
        """The user token of the Slackbot skills' owner (the skill methods take no other)."""
        self.mcp_server_ids = {MCP_SERVER_ID}
        """The MCP servers the app declares: a skill may bind only these, of this app."""
        self.skills: dict[str, JSONDict] = {}
        """Slackbot skills by id, with their instructions."""
        self.workspace: _Searchable | None = None
        """What ``assistant.search.context`` searches (``tests/slack_workspace.py``); ``None``:
        a workspace with no messages."""
        self.search_clock: Callable[[], float] = time.monotonic
        """Seconds for Real-time Search's per-person rate limit (tests pass a fake clock)."""
        self._cond = asyncio.Condition()
        for user_id in admins:
            self.set_user(user_id, is_admin=True)

    # ------------------------------------------------------------- public API

    @property
    def url(self) -> str:
        """Root URL of the server, ``http://127.0.0.1:<port>``."""
        return self.base_url

    @property
    def api_url(self) -> str:
        """The ``base_url`` for ``AsyncWebClient`` (ends with ``/api/``)."""
        return f"{self.base_url}/api/"

    def calls(self, method: str | None = None, *, include_rejected: bool = False) -> list[JSONDict]:
        """Parameters of every call to ``method`` (all methods when ``None``), oldest first."""
        out = [p for m, p in self.log if method is None or m == method]
        if include_rejected:
            out += [p for m, p, _ in self.rejected if method is None or m == method]
        return out

    def session_statuses(self, channel: str, thread_ts: str) -> list[str]:
        """The statuses the app set for the agent session of ``thread_ts``, in order.

        Slack documents two ways: ``agents.sessions.setStatus``, and the
        ``session_status`` of the ``chat.stopStream`` ending a stream in the thread.
        """
        key = (self._channel_for(channel), thread_ts)
        return [status for where, status in self._session_log if where == key]

    def methods(self) -> list[str]:
        """Names of the accepted calls in order, e.g. to check a status came before the answer."""
        return [m for m, _ in self.log]

    async def wait_for(
        self, method: str, count: int = 1, timeout: float = WAIT_SECONDS
    ) -> list[JSONDict]:
        """Wait until ``method`` has been called ``count`` times; return all its calls.

        Raises ``AssertionError`` (a test failure, with what was called) on timeout.
        """
        await _wait_until(
            lambda: len(self.calls(method)) >= count,
            self._cond,
            timeout,
            lambda: (
                f"expected {count} call(s) to {method}, got {len(self.calls(method))}; "
                f"calls so far: {self.methods()}; rejected: {[(m, e) for m, _, e in self.rejected]}"
            ),
        )
        return self.calls(method)

    def response_url(self, response_id: str = "R1") -> str:
        """A ``response_url`` on this server; what is posted to it shows in :meth:`responses`."""
        return f"{self.base_url}/response/{quote(response_id, safe='')}"

    def responses(self, response_id: str | None = None) -> list[JSONDict]:
        """JSON bodies posted to :meth:`response_url` (all ids when ``None``)."""
        return [
            body for rid, body in self._response_posts if response_id is None or rid == response_id
        ]

    async def wait_for_responses(
        self, count: int = 1, response_id: str | None = None, timeout: float = WAIT_SECONDS
    ) -> list[JSONDict]:
        """Wait until ``count`` bodies were posted to response URLs; return them."""
        await _wait_until(
            lambda: len(self.responses(response_id)) >= count,
            self._cond,
            timeout,
            lambda: (
                f"expected {count} response_url post(s), got {len(self.responses(response_id))}"
            ),
        )
        return self.responses(response_id)

    @property
    def open_sockets(self) -> int:
        """How many Socket Mode websockets are connected now."""
        return len([ws for ws in self._sockets if not ws.closed])

    async def wait_for_socket(self, timeout: float = WAIT_SECONDS) -> web.WebSocketResponse:
        """Wait until a Socket Mode client is connected; return the newest open websocket."""
        await _wait_until(
            lambda: self._open_socket() is not None,
            self._cond,
            timeout,
            lambda: (
                f"no open Socket Mode connection ({self.socket_connections} opened so far); "
                f"apps.connections.open calls: {len(self.calls('apps.connections.open'))}, "
                f"rejected: {[(m, e) for m, _, e in self.rejected]}"
            ),
        )
        socket = self._open_socket()
        assert socket is not None
        return socket

    async def socket_send(self, envelope: JSONDict, timeout: float = WAIT_SECONDS) -> None:
        """Deliver ``envelope`` (see :func:`socket_envelope`) to the connected Socket Mode client."""
        socket = await self.wait_for_socket(timeout)
        await socket.send_json(envelope)

    async def wait_for_socket_ack(
        self, envelope_id: str, timeout: float = WAIT_SECONDS
    ) -> JSONDict:
        """Wait until the client acknowledged ``envelope_id``; return its acknowledgement."""
        await _wait_until(
            lambda: self._ack_for(envelope_id) is not None,
            self._cond,
            timeout,
            lambda: (
                f"no acknowledgement for envelope {envelope_id}; acks so far: {self.socket_acks}"
            ),
        )
        ack = self._ack_for(envelope_id)
        assert ack is not None
        return ack

    def set_user(
        self,
        user_id: str,
        *,
        is_admin: bool = False,
        is_owner: bool = False,
        name: str | None = None,
        deleted: bool = False,
        is_bot: bool = False,
        locale: str | None = "en-US",
        tz: str | None = "Europe/Berlin",
    ) -> JSONDict:
        """Define what ``users.info`` says about ``user_id``; returns the user object.

        Users not defined here exist as ordinary members (not admin, not owner) of
        locale ``en-US`` in ``Europe/Berlin``. ``locale`` is in the answer only when the
        caller asks with ``include_locale`` (as in Slack); ``None``: Slack knows none for
        this person. ``tz``: the person's time zone (``None``: Slack gives none, as for a bot).
        """
        user = self._user_object(user_id, name=name)
        user.update(is_admin=is_admin, is_owner=is_owner, deleted=deleted, is_bot=is_bot)
        user.pop("locale", None)
        if locale is not None:
            user["locale"] = locale
        if tz is None:
            for key in ("tz", "tz_label", "tz_offset"):
                user.pop(key, None)
        else:
            user["tz"] = tz
        self._users[user_id] = user
        return user

    def set_usergroup(self, group_id: str, users: Iterable[str]) -> None:
        """Define the members ``usergroups.users.list`` reports for ``group_id`` (``S...``).

        Groups not defined here do not exist (``no_such_subteam``).
        """
        self._usergroups[group_id] = list(users)

    def add_file(
        self,
        file_id: str,
        name: str,
        data: bytes,
        mimetype: str,
        *,
        filetype: str | None = None,
        user: str = USER_ID,
    ) -> JSONDict:
        """Store a file and return its Slack file object (as in ``files.info`` and events).

        ``url_private`` / ``url_private_download`` point at this server and serve
        ``data`` only with ``Authorization: Bearer <bot_token>``; otherwise they
        answer 200 with Slack's HTML sign-in page.
        """
        suffix = PurePosixPath(name).suffix.lstrip(".").lower()
        kind = filetype or _FILETYPES.get(suffix, suffix or "binary")
        now = int(time.time())
        slug = f"{self.team_id}-{file_id}"
        quoted = quote(name, safe="")
        obj: JSONDict = {
            "id": file_id,
            "created": now,
            "timestamp": now,
            "name": name,
            "title": PurePosixPath(name).stem or name,
            "mimetype": mimetype,
            "filetype": kind,
            "pretty_type": kind.upper() if len(kind) <= 4 else kind.capitalize(),
            "user": user,
            "user_team": self.team_id,
            "editable": False,
            "size": len(data),
            "mode": "hosted",
            "is_external": False,
            "external_type": "",
            "is_public": False,
            "public_url_shared": False,
            "display_as_bot": False,
            "username": "",
            "url_private": f"{self.base_url}/files-pri/{slug}/{quoted}",
            "url_private_download": f"{self.base_url}/files-pri/{slug}/download/{quoted}",
            "permalink": f"https://example.slack.com/files/{user}/{file_id}/{quoted}",
            "permalink_public": f"https://slack-files.com/{slug}-0000000000",
            "file_access": "visible",
            "has_rich_preview": False,
        }
        self._files[file_id] = (obj, data)
        return dict(obj)

    def add_canvas(
        self,
        channel: str,
        title: str,
        markdown: str,
        *,
        file_id: str | None = None,
        channel_canvas: bool = False,
        user: str = USER_ID,
    ) -> JSONDict:
        """Create a canvas shared in ``channel`` and return its file object.

        ``files.list`` lists it for the channel (``types=canvas``), ``files.info``
        describes it, ``canvases.getContent`` returns ``markdown``; the channel
        canvas (``channel_canvas``) is also ``conversations.info``'s
        ``properties.canvas.file_id`` and is left out of ``files.list``, so that
        only that property finds it.
        """
        file_id = file_id or _next_id("F")
        now = int(time.time())
        quoted = quote(title, safe="")
        private = not channel.startswith("C")
        obj: JSONDict = {
            "id": file_id,
            "created": now,
            "timestamp": now,
            "updated": now,
            "name": title,
            "title": title,
            "mimetype": "application/vnd.slack-docs",
            "filetype": "quip",
            "pretty_type": "Canvas",
            "user": user,
            "user_team": self.team_id,
            "editable": True,
            "size": len(markdown.encode()),
            "mode": "quip",
            "is_external": False,
            "is_public": not private,
            "channels": [] if private else [channel],
            "groups": [channel] if private else [],
            "ims": [],
            "url_private": f"https://example.slack.com/docs/{self.team_id}/{file_id}",
            "permalink": f"https://example.slack.com/docs/{self.team_id}/{file_id}?title={quoted}",
        }
        self._files[file_id] = (obj, markdown.encode())
        self._canvases[file_id] = markdown
        if channel_canvas:
            self._channel_canvases[channel] = file_id
        return dict(obj)

    def edit_canvas(self, file_id: str, markdown: str, *, title: str | None = None) -> None:
        """Change a canvas's text (and title), as a person editing it in Slack does."""
        obj, _ = self._files[file_id]
        obj["updated"] = int(time.time())
        if title is not None:
            obj["title"] = obj["name"] = title
        self._files[file_id] = (obj, markdown.encode())
        self._canvases[file_id] = markdown

    def share_canvas(self, file_id: str, channel: str, *, shared: bool = True) -> None:
        """Share a canvas into ``channel`` (``shared=False``: take it out), as a person does:
        ``files.list`` and ``files.info`` list it there from then on (or no longer)."""
        obj, _ = self._files[file_id]
        key = "channels" if channel.startswith("C") else "groups"
        places = [c for c in obj[key] if c != channel]
        obj[key] = [*places, channel] if shared else places

    def delete_canvas(self, file_id: str) -> None:
        """Delete a canvas: ``canvas_not_found`` from then on, listed nowhere."""
        self._files.pop(file_id, None)
        self._canvases.pop(file_id, None)
        for channel, canvas in list(self._channel_canvases.items()):
            if canvas == file_id:
                del self._channel_canvases[channel]

    def sign_in_as(self, user_id: str | None, *, team_id: str | None = None) -> None:
        """Who signs in on the authorize page next (``None``: cancel), and to which team."""
        self.signin_user = user_id
        self.signin_team = team_id or self.team_id

    def approve(self, authorize_url: str) -> str:
        """What the authorize page does: the redirect URI with a ``code`` (or ``error``) and ``state``.

        Raises ``ValueError`` (Slack's error code) for a request Slack would refuse.
        """
        query = dict(parse_qsl(urlsplit(authorize_url).query))
        self.authorizations.append(query)
        if query.get("client_id") != self.client_id:
            raise ValueError("invalid_client_id")
        if query.get("response_type") != "code":
            raise ValueError("unsupported_response_type")
        if "openid" not in query.get("scope", "").split():
            raise ValueError("invalid_scope")
        redirect_uri = query.get("redirect_uri", "")
        if not redirect_uri:
            raise ValueError("bad_redirect_uri")
        back: dict[str, str] = {"state": query.get("state", "")}
        if self.signin_user is None:
            back["error"] = "access_denied"
        else:
            code = _next_id("code.")
            self._codes[code] = _Grant(
                self.signin_user, self.signin_team, query.get("nonce", ""), redirect_uri
            )
            back["code"] = code
        return f"{redirect_uri}?{urlencode(back)}"

    def set_members(self, channel: str, user_ids: Iterable[str]) -> None:
        """Define who ``conversations.members`` lists for ``channel`` (unknown channels: ``channel_not_found``)."""
        self._members[channel] = list(user_ids)

    def share_links(self, event: JSONDict) -> None:
        """Remember that Slack sent ``event`` (a ``link_shared``): ``chat.unfurl`` may unfurl its links.

        As in Slack, ``chat.unfurl`` answers ``cannot_unfurl_url`` for a URL that
        was not in a ``link_shared`` event for that message (or composer ``unfurl_id``).
        """
        urls = {
            str(link.get("url", "")) for link in event.get("links") or [] if isinstance(link, dict)
        }
        # chat.unfurl names the message by unfurl_id and source, or by channel and ts.
        self._shared_links.setdefault(("unfurl_id", str(event.get("unfurl_id", ""))), set()).update(
            urls
        )
        if event.get("source") != "composer":
            key = (str(event.get("channel", "")), str(event.get("message_ts", "")))
            self._shared_links.setdefault(key, set()).update(urls)

    def entity_trigger(self, external_ref_id: str) -> str:
        """A ``trigger_id`` as in an ``entity_details_requested`` event for the entity ``external_ref_id``.

        ``entity.presentDetails`` accepts it only with metadata for that entity
        (``entity_metadata_does_not_match_trigger`` otherwise) or an ``error``.
        """
        trigger = _trigger_id()
        self._entity_triggers[trigger] = external_ref_id
        return trigger

    def rate_limit(self, method: str, retry_after: int | str = 1, times: int = 1) -> None:
        """Answer the next ``times`` calls to ``method`` with 429 and ``Retry-After``."""
        self._overrides.setdefault(method, []).append(
            _Override(
                remaining=times,
                status=429,
                body={"ok": False, "error": "ratelimited"},
                headers={"Retry-After": str(retry_after)},
            )
        )

    def fail(
        self,
        method: str,
        error: str = "internal_error",
        times: int | None = None,
        *,
        status: int = 200,
    ) -> None:
        """Answer calls to ``method`` with ``{"ok": false, "error": error}`` (``times`` None: always).

        ``status`` 500 or 503 is how Slack reports its own failures (the HTTP status of
        every other error is 200).
        """
        self._overrides.setdefault(method, []).append(
            _Override(remaining=times, status=status, body={"ok": False, "error": error})
        )

    def stall(self, method: str, seconds: float, times: int | None = 1) -> None:
        """Hold the next ``times`` calls to ``method`` for ``seconds``, then answer them as usual."""
        self._overrides.setdefault(method, []).append(
            _Override(remaining=times, delay=seconds, passthrough=True)
        )

    def answer_late(self, method: str, seconds: float, times: int | None = 1) -> None:
        """Do what the next ``times`` calls to ``method`` ask at once, but answer them
        ``seconds`` later (Slack acted on a request whose answer the client gave up on)."""
        self._overrides.setdefault(method, []).append(
            _Override(remaining=times, passthrough=True, late=seconds)
        )

    def trickle(self, file_id: str, seconds: float, piece: int = 64) -> None:
        """Serve the file ``file_id`` ``piece`` bytes at a time, ``seconds`` apart (a slow link)."""
        self._trickles[file_id] = (seconds, piece)

    def hold_download(self, file_id: str) -> None:
        """Hold the downloads of ``file_id`` open, nothing sent, until :meth:`release_downloads`.

        A process downloading it is then stopped at a known point (to be killed there).
        """
        self._download_holds[file_id] = asyncio.Event()

    def release_downloads(self) -> None:
        """Let every held download go on (and forget the holds not reached yet)."""
        for gate in self._download_holds.values():
            gate.set()
        self._download_holds.clear()

    async def wait_for_held_download(self, file_id: str, timeout: float = WAIT_SECONDS) -> None:
        """Wait until a download of ``file_id`` is being held (:meth:`hold_download`)."""
        await _wait_until(
            lambda: file_id in self.held_downloads,
            self._cond,
            timeout,
            lambda: f"no download of {file_id} was held; downloads so far: {self.downloads}",
        )

    def add_person_message(self, event: JSONDict) -> None:
        """Keep a person's message (a ``message`` or ``app_mention`` event) as Slack would.

        ``conversations.replies`` then returns it in its thread, beside the bot's own messages.
        """
        if (
            event.get("subtype")
            or event.get("bot_id")
            or not (event.get("ts") and event.get("channel"))
        ):
            return
        msg: JSONDict = {
            k: event[k] for k in ("text", "user", "ts", "thread_ts", "team") if k in event
        }
        self.people_messages[(str(event["channel"]), str(event["ts"]))] = {"type": "message", **msg}

    def press_stop(self, channel: str, thread_ts: str) -> list[str]:
        """What Slack does when a person clicks an agent session's Stop: the app's streams
        in progress in that thread are stopped; their ``ts``, for the ``agent_session_stopped``
        event's ``streaming_message_ts`` (:func:`agent_session_stopped_event`)."""
        channel = self._channel_for(channel)
        stopped = []
        for (c, ts), msg in self.messages.items():
            in_thread = c == channel and msg.get("thread_ts") == thread_ts
            if in_thread and msg.get("streaming_state") == "in_progress":
                msg["streaming_state"] = "completed"
                stopped.append(ts)
        return stopped

    def on(self, method: str, handler: Callable[[JSONDict], JSONDict]) -> None:
        """Answer ``method`` with ``handler(params)`` instead of the built-in shape."""
        self._handlers[method] = handler

    def reset(self) -> None:
        """Forget recorded calls and responses (stored files, users and threads stay)."""
        self.log.clear()
        self.rejected.clear()
        self.downloads.clear()
        self._response_posts.clear()
        self.socket_acks.clear()
        self._session_log.clear()

    # ------------------------------------------------------------ the server

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/files-pri/{slug}/download/{name}", self._file)
        app.router.add_get("/files-pri/{slug}/{name}", self._file)
        app.router.add_post("/response/{rid}", self._response)
        app.router.add_get("/socket", self._socket)
        app.router.add_get("/openid/connect/authorize", self._authorize)
        app.on_shutdown.append(self._close_sockets)
        return app

    async def _record(self, method: str, params: JSONDict, error: str | None) -> None:
        if error is None:
            self.log.append((method, params))
        else:
            self.rejected.append((method, params, error))
        async with self._cond:
            self._cond.notify_all()

    @staticmethod
    async def _params(request: web.Request) -> JSONDict:
        """Query string + body (JSON, form or multipart), JSON fields decoded."""
        params: JSONDict = dict(request.query)
        if request.method == "POST" and request.can_read_body:
            if request.content_type == "application/json":
                body = await request.json()
                if isinstance(body, dict):
                    params.update(body)
            else:
                form = await request.post()
                for key, value in form.items():
                    params[key] = value.file.read() if isinstance(value, web.FileField) else value
        for key in _JSON_FIELDS & params.keys():
            value = params[key]
            if isinstance(value, str) and value[:1] in "[{":
                # Invalid JSON stays a raw string, so the assertion message shows it.
                with contextlib.suppress(ValueError):
                    params[key] = json.loads(value)
        return params

    def _token(self, request: web.Request, params: JSONDict) -> str | None:
        # The token is a credential, not a parameter: keep it out of the recorded call.
        body_token = params.pop("token", None)
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[len("Bearer ") :].strip()
        return str(body_token) if body_token else None

    @staticmethod
    def _json(
        body: JSONDict, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> web.Response:
        return web.json_response(body, status=status, headers=headers)

    def _auth_error(self, method: str, request: web.Request, params: JSONDict) -> str | None:
        """Slack's error for a call without the credentials ``method`` needs, else ``None``."""
        if method in _CLIENT_METHODS:
            return self._client_error(request, params)
        token = self._token(request, params)
        if token is None:
            return "not_authed"
        if method in _USER_TOKEN_METHODS:
            self._caller_token = token
            return None if token in self._user_tokens else "invalid_auth"
        if method in _SKILL_METHODS:
            if token == self.skill_token:
                return None
            return "not_allowed_token_type" if token == self.bot_token else "invalid_auth"
        expected = self.app_token if method in _APP_TOKEN_METHODS else self.bot_token
        if token == expected:
            return None
        # Slack tells a valid token of the wrong kind from an unknown one.
        if method in _APP_TOKEN_METHODS and token == self.bot_token:
            return "not_allowed_token_type"
        return "invalid_auth"

    def _client_error(self, request: web.Request, params: JSONDict) -> str | None:
        """Check the app's client id and secret: HTTP Basic, or form fields (kept out of the log)."""
        client_id, secret = params.pop("client_id", None), params.pop("client_secret", None)
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            with contextlib.suppress(ValueError):
                client_id, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
        if client_id != self.client_id:
            return "invalid_client_id"
        return None if secret == self.client_secret else "bad_client_secret"

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params = await self._params(request)
        auth_error = self._auth_error(method, request, params)
        if auth_error is not None:
            await self._record(method, params, auth_error)
            return self._json({"ok": False, "error": auth_error})

        late = 0.0
        for override in self._overrides.get(method, []):
            if override.remaining is None or override.remaining > 0:
                if override.remaining is not None:
                    override.remaining -= 1
                await self._sleep(override.delay)
                if override.passthrough:
                    late = override.late
                    break
                await self._record(method, params, str(override.body.get("error", override.status)))
                return self._json(override.body, status=override.status, headers=override.headers)

        if method in self._handlers:
            body = self._handlers[method](params)
        else:
            answer = getattr(self, "_m_" + method.replace(".", "_"), None)
            body = answer(params) if answer else {"ok": True}
        # A method's answer with an HTTP status of its own (a rate limit): (status, headers).
        status, extra = body.pop("_http", (200, {}))
        error = None if body.get("ok") else str(body.get("error", "error"))
        await self._record(method, params, error)
        await self._sleep(late)
        headers = {"X-Slack-Req-Id": _next_id("req"), **extra}
        if "warning" in body:
            headers["X-Slack-Warning"] = str(body["warning"])
        return self._json(body, status=status, headers=headers)

    async def _file(self, request: web.Request) -> web.StreamResponse:
        slug = request.match_info["slug"]
        file_id = slug.split("-", 1)[-1]
        stored = self._files.get(file_id)
        authorised = request.headers.get("Authorization", "") == f"Bearer {self.bot_token}"
        self.downloads.append((file_id, authorised))
        if not authorised:
            return web.Response(text=_LOGIN_PAGE, content_type="text/html", charset="utf-8")
        if stored is None:
            return web.Response(status=404, text="file not found")
        obj, data = stored
        gate = self._download_holds.get(file_id)
        if gate is not None:
            self.held_downloads.append(file_id)
            async with self._cond:
                self._cond.notify_all()
            await _until_set(gate, self._closing)
        headers = {}
        if "/download/" in request.path:
            headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(obj['name'])}"
        if file_id in self._trickles:
            return await self._trickle_file(request, data, obj["mimetype"], headers)
        return web.Response(body=data, content_type=obj["mimetype"], headers=headers)

    async def _trickle_file(
        self, request: web.Request, data: bytes, content_type: str, headers: dict[str, str]
    ) -> web.StreamResponse:
        seconds, piece = self._trickles[request.match_info["slug"].split("-", 1)[-1]]
        resp = web.StreamResponse(headers={**headers, "Content-Type": content_type})
        await resp.prepare(request)
        for start in range(0, len(data), piece):
            if self._closing.is_set():
                break
            await resp.write(data[start : start + piece])
            await self._sleep(seconds)
        await resp.write_eof()
        return resp

    async def _response(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        self._response_posts.append((request.match_info["rid"], body))
        async with self._cond:
            self._cond.notify_all()
        return self._json({"ok": True})

    def _open_socket(self) -> web.WebSocketResponse | None:
        open_sockets = [ws for ws in self._sockets if not ws.closed]
        return open_sockets[-1] if open_sockets else None

    def _ack_for(self, envelope_id: str) -> JSONDict | None:
        return next((a for a in self.socket_acks if a.get("envelope_id") == envelope_id), None)

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        # autoping answers the SDK's keep-alive pings, as Slack's server does.
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self.socket_connections += 1
        self._sockets.append(ws)
        await ws.send_json(
            {
                "type": "hello",
                "num_connections": self.open_sockets,
                "debug_info": {
                    "host": "applink-mock",
                    "build_number": 1,
                    "approximate_connection_time": 18060,
                },
                "connection_info": {"app_id": self.app_id},
            }
        )
        async with self._cond:
            self._cond.notify_all()
        try:
            async for message in ws:
                if message.type != WSMsgType.TEXT:
                    continue
                try:
                    data = json.loads(message.data)
                except ValueError:
                    continue
                if isinstance(data, dict) and "envelope_id" in data:
                    self.socket_acks.append(data)
                    async with self._cond:
                        self._cond.notify_all()
        finally:
            self._sockets.remove(ws)
            async with self._cond:
                self._cond.notify_all()
        return ws

    async def _close_sockets(self, app: web.Application) -> None:
        # Without this, shutdown waits for clients that never hang up on their own.
        for ws in list(self._sockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"server shutdown")

    # ------------------------------------------------------ method answers

    def _user_object(self, user_id: str, *, name: str | None = None) -> JSONDict:
        name = name or user_id.lower()
        return {
            "id": user_id,
            "team_id": self.team_id,
            "name": name,
            "deleted": False,
            "real_name": name.title(),
            "tz": "Europe/Berlin",
            "tz_label": "Central European Time",
            "tz_offset": 3600,
            "locale": "en-US",
            "profile": {
                "real_name": name.title(),
                "display_name": name,
                "email": f"{name}@example.com",
                "team": self.team_id,
            },
            "is_admin": False,
            "is_owner": False,
            "is_primary_owner": False,
            "is_restricted": False,
            "is_ultra_restricted": False,
            "is_bot": False,
            "is_app_user": False,
            "updated": int(time.time()),
        }

    def _message(self, params: JSONDict, ts: str) -> JSONDict:
        msg: JSONDict = {
            "type": "message",
            "text": params.get("text", ""),
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "app_id": self.app_id,
            "team": self.team_id,
            "ts": ts,
        }
        for key in ("blocks", "attachments", "metadata", "thread_ts"):
            if key in params:
                msg[key] = params[key]
        return msg

    def _channel_for(self, channel: str) -> str:
        # Posting to a user id lands in the app's DM with that user, as in Slack.
        if channel[:1] in {"U", "W"}:
            return "D" + channel[1:]
        return channel

    def _message_errors(self, params: JSONDict) -> JSONDict | None:
        if not params.get("channel"):
            return {"ok": False, "error": "channel_not_found"}
        if not params.get("text") and not params.get("blocks") and not params.get("attachments"):
            return {"ok": False, "error": "no_text"}
        # Slack takes at most 40,000 characters of a message's text
        # (https://docs.slack.dev/reference/methods/chat.postMessage).
        if len(str(params.get("text", ""))) > 40000:
            return {"ok": False, "error": "msg_too_long"}
        if self.validate and "blocks" in params:
            errors = _block_errors(params["blocks"], max_blocks=50)
            if errors:
                return {
                    "ok": False,
                    "error": "invalid_blocks",
                    "errors": errors,
                    "response_metadata": {"messages": [f"[ERROR] {e}" for e in errors]},
                }
        return None

    def _m_auth_test(self, params: JSONDict) -> JSONDict:
        return {
            "ok": True,
            "url": "https://example.slack.com/",
            "team": "Example",
            "user": "kb",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _m_chat_postMessage(self, params: JSONDict) -> JSONDict:
        error = self._message_errors(params)
        if error:
            return error
        channel = self._channel_for(str(params["channel"]))
        ts = slack_ts()
        msg = self._message(params, ts)
        self.messages[(channel, ts)] = msg
        return {"ok": True, "channel": channel, "ts": ts, "message": msg}

    def _m_chat_update(self, params: JSONDict) -> JSONDict:
        channel, ts = str(params.get("channel", "")), str(params.get("ts", ""))
        if (channel, ts) not in self.messages:
            return {"ok": False, "error": "message_not_found"}
        if self.messages[(channel, ts)].get("streaming_state") == "in_progress":
            # As Slack is reported to answer (not documented): a stream is stopped before an edit.
            return {"ok": False, "error": "streaming_state_conflict"}
        error = self._message_errors(params)
        if error:
            return error
        msg = self.messages[(channel, ts)]
        msg.update(
            {k: params[k] for k in ("text", "blocks", "attachments", "metadata") if k in params}
        )
        msg["edited"] = {"user": self.bot_user_id, "ts": slack_ts()}
        return {
            "ok": True,
            "channel": channel,
            "ts": ts,
            "text": msg.get("text", ""),
            "message": msg,
        }

    def _m_chat_delete(self, params: JSONDict) -> JSONDict:
        channel, ts = str(params.get("channel", "")), str(params.get("ts", ""))
        msg = self.messages.get((channel, ts))
        if msg is None:
            return {"ok": False, "error": "message_not_found"}
        if msg.get("streaming_state") == "in_progress":
            return {"ok": False, "error": "cant_delete_message"}  # a stream is stopped first
        del self.messages[(channel, ts)]
        return {"ok": True, "channel": channel, "ts": ts}

    def _stream_text_errors(self, params: JSONDict, *, required: bool) -> JSONDict | None:
        """Slack's checks of a streaming call's ``markdown_text`` (at most 12,000 characters)."""
        text = params.get("markdown_text")
        if text is None:
            return {"ok": False, "error": "no_text"} if required else None
        if not isinstance(text, str) or (required and not text):
            return {"ok": False, "error": "no_text"}
        if len(text) > 12000:
            return {"ok": False, "error": "msg_too_long"}
        return None

    def _chunks_error(self, params: JSONDict) -> JSONDict | None:
        """Slack's check of a streaming call's ``chunks`` (:func:`_chunk_errors`), or ``None``."""
        if "chunks" not in params:
            return None
        errors = _chunk_errors(params["chunks"])
        if not errors:
            return None
        return {
            "ok": False,
            "error": "invalid_arguments",
            "response_metadata": {"messages": [f"[ERROR] {e}" for e in errors]},
        }

    @staticmethod
    def _add_chunks(msg: JSONDict, params: JSONDict) -> None:
        """Keep a stream's chunks on its message; their markdown text joins the message's text."""
        for chunk in params.get("chunks") or []:
            msg.setdefault("chunks", []).append(chunk)
            if chunk.get("type") == "markdown_text":
                msg["text"] = str(msg.get("text", "")) + str(chunk.get("text", ""))

    def _streaming_message(self, params: JSONDict) -> tuple[JSONDict | None, JSONDict | None]:
        """The message a streaming call names and still streams, or Slack's error for it."""
        channel, ts = str(params.get("channel", "")), str(params.get("ts", ""))
        if not channel:
            return None, {"ok": False, "error": "channel_not_found"}
        if not ts:
            return None, {"ok": False, "error": "invalid_arguments"}
        msg = self.messages.get((self._channel_for(channel), ts))
        if msg is None:
            return None, {"ok": False, "error": "message_not_found"}
        if msg.get("streaming_state") != "in_progress":
            return None, {"ok": False, "error": "message_not_in_streaming_state"}
        return msg, None

    def _m_chat_startStream(self, params: JSONDict) -> JSONDict:
        """A streamed reply in a thread: a message (``streaming_state`` in progress) others can read."""
        channel = self._channel_for(str(params.get("channel", "")))
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not params.get("thread_ts"):
            return {"ok": False, "error": "invalid_arguments"}
        if not channel.startswith("D"):
            # Outside a DM Slack must know who the stream is for.
            for field_name in ("recipient_user_id", "recipient_team_id"):
                if not params.get(field_name):
                    return {"ok": False, "error": f"missing_{field_name}"}
        error = self._stream_text_errors(params, required=False) or self._chunks_error(params)
        if error:
            return error
        if params.get("task_display_mode", "timeline") not in ("timeline", "plan"):
            return {"ok": False, "error": "invalid_arguments"}
        ts = slack_ts()
        msg = self._message({"text": params.get("markdown_text", ""), **params}, ts)
        msg["streaming_state"] = "in_progress"
        self._add_chunks(msg, params)
        self.messages[(channel, ts)] = msg
        return {"ok": True, "channel": channel, "ts": ts}

    def _m_chat_appendStream(self, params: JSONDict) -> JSONDict:
        """Text, or chunks (as the SDK's stream helper sends them), added to a stream."""
        msg, error = self._streaming_message(params)
        required = "chunks" not in params
        error = error or self._stream_text_errors(params, required=required)
        error = error or self._chunks_error(params)
        if error or msg is None:
            return error or {"ok": False, "error": "message_not_found"}
        msg["text"] = str(msg.get("text", "")) + str(params.get("markdown_text", ""))
        self._add_chunks(msg, params)
        return {"ok": True, "channel": params["channel"], "ts": msg["ts"]}

    def _m_chat_stopStream(self, params: JSONDict) -> JSONDict:
        """Ends the stream; ``markdown_text`` is appended, ``blocks`` go below the streamed text."""
        msg, error = self._streaming_message(params)
        error = error or self._stream_text_errors(params, required=False)
        error = error or self._chunks_error(params)
        status = params.get("session_status")
        if not error and status is not None and status not in _SESSION_STATUSES:
            error = {"ok": False, "error": "invalid_arguments"}
        if not error and self.validate and "blocks" in params:
            errors = _block_errors(params["blocks"], max_blocks=50)
            if errors:
                error = {"ok": False, "error": "invalid_blocks", "errors": errors}
        if error or msg is None:
            return error or {"ok": False, "error": "message_not_found"}
        msg["text"] = str(msg.get("text", "")) + str(params.get("markdown_text", ""))
        if "blocks" in params:
            msg["blocks"] = [*msg.get("blocks", []), *params["blocks"]]
        self._add_chunks(msg, params)
        msg["streaming_state"] = "completed"
        key = (self._channel_for(str(params["channel"])), str(msg.get("thread_ts", "")))
        if status is not None:
            self._session_log.append((key, str(status)))
        session = self.sessions.get(key)
        if session is not None:
            # Without session_status: as if Slack's default were active (unverified).
            session["status"] = status or "active"
        return {"ok": True, "channel": params["channel"], "ts": msg["ts"], "message": dict(msg)}

    def _m_chat_postEphemeral(self, params: JSONDict) -> JSONDict:
        if not params.get("user"):
            return {"ok": False, "error": "user_not_in_channel"}
        error = self._message_errors(params)
        return error or {"ok": True, "message_ts": slack_ts()}

    def _m_assistant_search_context(self, params: JSONDict) -> JSONDict:
        """Real-time Search of :attr:`workspace`, as the ``action_token``'s person (or public only)."""
        if self.workspace is None:
            return {
                "ok": True,
                "results": {"messages": []},
                "response_metadata": {"next_cursor": ""},
            }
        body, status, retry_after = self.workspace.search(params, self.search_clock())
        if status != 200:
            body["_http"] = (status, {"Retry-After": str(int(retry_after))})
        return body

    def _m_chat_getPermalink(self, params: JSONDict) -> JSONDict:
        channel, ts = str(params.get("channel", "")), str(params.get("message_ts", ""))
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if (channel, ts) not in self.messages and (channel, ts) not in self.people_messages:
            return {"ok": False, "error": "message_not_found"}
        link = f"https://example.slack.com/archives/{channel}/p{ts.replace('.', '')}"
        return {"ok": True, "channel": channel, "permalink": link}

    def _view_object(self, view: JSONDict, view_id: str) -> JSONDict:
        out: JSONDict = {
            "id": view_id,
            "team_id": self.team_id,
            "type": "modal",
            "blocks": [],
            "private_metadata": "",
            "callback_id": "",
            "state": {"values": {}},
            "hash": _next_id("hash."),
            "clear_on_close": False,
            "notify_on_close": False,
            "close": None,
            "submit": None,
            "previous_view_id": None,
            "root_view_id": view_id,
            "app_id": self.app_id,
            "external_id": "",
            "app_installed_team_id": self.team_id,
            "bot_id": self.bot_id,
        }
        out.update(view)
        out["id"] = view_id
        return out

    def _m_views_open(self, params: JSONDict) -> JSONDict:
        if not params.get("trigger_id"):
            return {"ok": False, "error": "invalid_trigger_id"}
        view = params.get("view")
        if self.validate:
            errors = _view_errors(view)
            if errors:
                return {
                    "ok": False,
                    "error": "invalid_arguments",
                    "response_metadata": {"messages": errors},
                }
        view_id = _next_id("V")
        self.views[view_id] = self._view_object(dict(view or {}), view_id)
        return {"ok": True, "view": self.views[view_id]}

    def _m_views_publish(self, params: JSONDict) -> JSONDict:
        """A Home tab for one user: the same Block Kit checks as a modal (100 blocks)."""
        user = str(params.get("user_id", ""))
        if not user:
            return {"ok": False, "error": "invalid_arguments"}
        view = params.get("view")
        if isinstance(view, str):  # form-encoded calls send the view as JSON text
            view = json.loads(view)
        if not isinstance(view, Mapping) or view.get("type") != "home":
            return {"ok": False, "error": "invalid_arguments"}
        if self.validate:
            errors = _view_errors(view)
            if errors:
                return {
                    "ok": False,
                    "error": "invalid_arguments",
                    "response_metadata": {"messages": errors},
                }
        view_id = self.home_views.get(user, {}).get("id") or _next_id("V")
        self.home_views[user] = {**self._view_object(dict(view), view_id), "type": "home"}
        return {"ok": True, "view": self.home_views[user]}

    def _m_apps_connections_open(self, params: JSONDict) -> JSONDict:
        return {"ok": True, "url": self.base_url.replace("http://", "ws://", 1) + "/socket"}

    def _m_users_info(self, params: JSONDict) -> JSONDict:
        user_id = str(params.get("user", ""))
        if not user_id:
            return {"ok": False, "error": "user_not_found"}
        user = dict(self._users.get(user_id) or self._user_object(user_id))
        # Slack sends ``user.locale`` only to callers that ask (include_locale=true).
        if str(params.get("include_locale", "")).lower() not in ("1", "true"):
            user.pop("locale", None)
        return {"ok": True, "user": user}

    def _m_users_list(self, params: JSONDict) -> JSONDict:
        """The people defined with :meth:`set_user` (others are ordinary members, as in
        ``users.info``), a page of ``limit`` at a time with Slack's cursor."""
        people = list(self._users.values())
        cursor = str(params.get("cursor") or "")
        start = int(base64.b64decode(cursor).decode().split(":")[1]) if cursor else 0
        end = start + min(int(params.get("limit") or 1000), 1000)
        next_cursor = base64.b64encode(f"user:{end}".encode()).decode() if end < len(people) else ""
        members = [{k: v for k, v in p.items() if k != "locale"} for p in people[start:end]]
        return {"ok": True, "members": members, "response_metadata": {"next_cursor": next_cursor}}

    def _m_usergroups_users_list(self, params: JSONDict) -> JSONDict:
        members = self._usergroups.get(str(params.get("usergroup", "")))
        if members is None:
            return {"ok": False, "error": "no_such_subteam"}
        return {"ok": True, "users": list(members)}

    def _m_assistant_threads_setStatus(self, params: JSONDict) -> JSONDict:
        """The thread's status: ``channel_id``, ``thread_ts`` and ``status`` required (an empty
        status clears it), at most 10 ``loading_messages``. Slack removes the method in
        February 2027 (then ``unknown_method``: :meth:`fail`)."""
        if not params.get("channel_id") or not params.get("thread_ts"):
            return {"ok": False, "error": "invalid_arguments"}
        if not isinstance(params.get("status"), str):
            return {"ok": False, "error": "invalid_arguments"}
        loading = params.get("loading_messages", [])
        if not isinstance(loading, list) or len(loading) > 10:
            return {"ok": False, "error": "invalid_arguments"}
        return {"ok": True}

    def _m_assistant_threads_setSuggestedPrompts(self, params: JSONDict) -> JSONDict:
        prompts = params.get("prompts")
        if not params.get("channel_id") or not isinstance(prompts, list) or not prompts:
            return {"ok": False, "error": "invalid_arguments"}
        # Slack shows at most four, each a title and the message it sends.
        if len(prompts) > 4 or not all(_is_prompt(p) for p in prompts):
            return {"ok": False, "error": "invalid_arguments"}
        return {"ok": True}

    def _session_key(self, params: JSONDict) -> tuple[tuple[str, str] | None, str | None]:
        """The agent session a call names, or Slack's error: sessions are an agent app's, by thread."""
        if not self.agent_app:
            # The app is not declared as an agent (Slack's error for it is unverified).
            return None, "not_allowed"
        channel, thread_ts = str(params.get("channel_id") or ""), str(params.get("thread_ts") or "")
        if not channel:
            return None, "channel_not_found"
        if not thread_ts:
            return None, "invalid_arguments"  # thread-based sessions need their thread
        return (self._channel_for(channel), thread_ts), None

    def _m_agents_sessions_setStatus(self, params: JSONDict) -> JSONDict:
        """Set a session's status, creating it (with its title and initiator) if needed.

        As Slack's reference says: ``status`` one of ``active``, ``processing``,
        ``suspended``, ``closed`` (anything else: ``invalid_arguments``); ``title`` at
        most 200 characters and ``initiator_user_id`` used only when the session is
        created; an app not subscribed to ``agent_session_stopped`` (see
        :attr:`stop_subscribed`) gets the warning
        ``missing_agent_session_stopped_event_subscription``.
        """
        key, error = self._session_key(params)
        if error or key is None:
            return {"ok": False, "error": error}
        status, title = params.get("status"), params.get("title")
        if status not in _SESSION_STATUSES:
            return {"ok": False, "error": "invalid_arguments"}
        if title is not None and (not isinstance(title, str) or len(title) > 200):
            return {"ok": False, "error": "invalid_arguments"}
        session = self.sessions.setdefault(
            key, {"title": title or "", "initiator_user_id": params.get("initiator_user_id")}
        )
        session["status"] = status
        self._session_log.append((key, str(status)))
        answer: JSONDict = {"ok": True, "status": status, "title": session["title"]}
        if not self.stop_subscribed:
            answer["warning"] = "missing_agent_session_stopped_event_subscription"
        return answer

    def _m_agents_sessions_rename(self, params: JSONDict) -> JSONDict:
        key, error = self._session_key(params)
        if error or key is None:
            return {"ok": False, "error": error}
        title = params.get("title")
        if not isinstance(title, str) or not 1 <= len(title) <= 200:
            return {"ok": False, "error": "invalid_arguments"}
        if key not in self.sessions:
            return {"ok": False, "error": "session_not_found"}  # (unverified name)
        self.sessions[key]["title"] = title
        return {"ok": True, "title": title}

    def _m_canvases_getContent(self, params: JSONDict) -> JSONDict:
        """The whole canvas in one string (docs.slack.dev/reference/methods/canvases.getContent)."""
        if params.get("content_type") not in (None, "", "markdown"):
            return {"ok": False, "error": "invalid_arguments"}
        markdown = self._canvases.get(str(params.get("canvas_id", "")))
        if markdown is None:
            return {"ok": False, "error": "canvas_not_found"}
        return {"ok": True, "content": markdown}

    def _m_conversations_info(self, params: JSONDict) -> JSONDict:
        """A channel object; ``properties.canvas`` names its channel canvas, if it has one."""
        channel = str(params.get("channel", ""))
        properties: JSONDict = {}
        if channel in self._channel_canvases:
            properties["canvas"] = {
                "file_id": self._channel_canvases[channel],
                "is_empty": False,
                "quip_thread_id": "ABC123",
            }
        return {
            "ok": True,
            "channel": {
                "id": channel,
                "name": channel.lower(),
                "is_channel": channel.startswith("C"),
                "is_private": not channel.startswith("C"),
                "is_ext_shared": channel in self.ext_shared,
                "properties": properties,
            },
        }

    def _m_files_list(self, params: JSONDict) -> JSONDict:
        """Files shared in ``channel`` of the ``types`` asked, paged by ``page`` and ``count``."""
        channel = str(params.get("channel") or "")
        types = {t for t in str(params.get("types") or "all").split(",") if t}
        known = {"all", "spaces", "snippets", "images", "gdocs", "zips", "pdfs", "canvas"}
        if types - known:
            return {"ok": False, "error": "unknown_type"}
        listed = [
            dict(obj)
            for file_id, (obj, _) in self._files.items()
            if (not channel or channel in [*obj.get("channels", []), *obj.get("groups", [])])
            and ("all" in types or ("canvas" in types and file_id in self._canvases))
            and file_id not in self._channel_canvases.values()
        ]
        count = min(int(params.get("count") or 100), 1000)
        page = max(int(params.get("page") or 1), 1)
        pages = max((len(listed) + count - 1) // count, 1)
        return {
            "ok": True,
            "files": listed[(page - 1) * count : page * count],
            "paging": {"count": count, "total": len(listed), "page": page, "pages": pages},
        }

    def _m_conversations_history(self, params: JSONDict) -> JSONDict:
        """The channel's top-level messages the bot posted, newest first."""
        channel = self._channel_for(str(params.get("channel", "")))
        found = [
            m
            for (c, ts), m in self.messages.items()
            if c == channel and m.get("thread_ts") in (None, ts)
        ]
        found.sort(key=lambda m: str(m["ts"]), reverse=True)
        limit = int(params.get("limit") or 100)
        return {"ok": True, "messages": found[:limit], "has_more": len(found) > limit}

    async def _authorize(self, request: web.Request) -> web.Response:
        try:
            location = self.approve(str(request.url))
        except ValueError as exc:
            return web.Response(status=400, text=f"Slack refused the sign-in: {exc}")
        return web.Response(
            text=_CONSENT_PAGE.format(url=html.escape(location, quote=True)),
            content_type="text/html",
        )

    def _m_openid_connect_token(self, params: JSONDict) -> JSONDict:
        # A code works once, as in Slack.
        grant = self._codes.pop(str(params.get("code", "")), None)
        if grant is None:
            return {"ok": False, "error": "invalid_code"}
        if params.get("redirect_uri") != grant.redirect_uri:
            return {"ok": False, "error": "bad_redirect_uri"}
        token = _next_id("xoxp-signin-")
        self._user_tokens[token] = grant
        return {
            "ok": True,
            "access_token": token,
            "token_type": "Bearer",
            "id_token": self._id_token(grant),
        }

    def _id_token(self, grant: _Grant) -> str:
        now = int(time.time())
        claims: JSONDict = {
            "iss": "https://slack.com",
            "sub": grant.user_id,
            "aud": self.client_id,
            "exp": now + 3600,
            "iat": now,
            "auth_time": now,
            "nonce": grant.nonce,
            _USER_CLAIM: grant.user_id,
            _TEAM_CLAIM: grant.team_id,
            "name": grant.user_id.lower(),
            "locale": "en-US",
        }
        claims.update(self.id_token_overrides)
        return _jwt_hs256(claims, self.client_secret)

    def _m_openid_connect_userInfo(self, params: JSONDict) -> JSONDict:
        grant = self._user_tokens[self._caller_token]
        return {
            "ok": True,
            "sub": grant.user_id,
            _USER_CLAIM: grant.user_id,
            _TEAM_CLAIM: grant.team_id,
            "name": grant.user_id.lower(),
            "given_name": grant.user_id.title(),
            "locale": "en-US",
            "https://slack.com/team_name": "Example",
            "https://slack.com/team_domain": "example",
        }

    def _m_conversations_members(self, params: JSONDict) -> JSONDict:
        members = self._members.get(str(params.get("channel", "")))
        if members is None:
            return {"ok": False, "error": "channel_not_found"}
        cursor = str(params.get("cursor") or "")
        start = int(base64.b64decode(cursor).decode().split(":")[1]) if cursor else 0
        end = start + min(int(params.get("limit") or 100), 1000)
        more = end < len(members)
        next_cursor = base64.b64encode(f"offset:{end}".encode()).decode() if more else ""
        return {
            "ok": True,
            "members": members[start:end],
            "response_metadata": {"next_cursor": next_cursor},
        }

    def _m_conversations_replies(self, params: JSONDict) -> JSONDict:
        channel, parent = str(params.get("channel", "")), str(params.get("ts", ""))
        if not channel or not parent:
            return {"ok": False, "error": "invalid_arguments"}
        everything = {**self.people_messages, **self.messages}
        thread = [
            m
            for (c, ts), m in everything.items()
            if c == channel and (ts == parent or m.get("thread_ts") == parent)
        ]
        if not any(m["ts"] == parent for m in thread):
            return {"ok": False, "error": "thread_not_found"}
        thread.sort(key=lambda m: _ts_key(m["ts"]))
        inclusive = str(params.get("inclusive", "")).lower() in {"1", "true"}
        if params.get("latest"):
            latest = _ts_key(str(params["latest"]))
            thread = [
                m
                for m in thread
                if _ts_key(m["ts"]) < latest or (inclusive and _ts_key(m["ts"]) == latest)
            ]
        if params.get("oldest"):
            oldest = _ts_key(str(params["oldest"]))
            thread = [
                m
                for m in thread
                if _ts_key(m["ts"]) > oldest or (inclusive and _ts_key(m["ts"]) == oldest)
            ]
        cursor = str(params.get("cursor") or "")
        start = int(base64.b64decode(cursor).decode().split(":")[1]) if cursor else 0
        end = start + min(int(params.get("limit") or 1000), 1000)
        more = end < len(thread)
        next_cursor = base64.b64encode(f"offset:{end}".encode()).decode() if more else ""
        return {
            "ok": True,
            "messages": [dict(m) for m in thread[start:end]],
            "has_more": more,
            "response_metadata": {"next_cursor": next_cursor},
        }

    def _m_chat_unfurl(self, params: JSONDict) -> JSONDict:
        error = self._unfurl_target_error(params)
        if error:
            return {"ok": False, "error": error}
        if "unfurls" not in params and "metadata" not in params:
            return {"ok": False, "error": "missing_unfurls"}
        metadata = params.get("metadata", {"entities": []})
        entities = metadata.get("entities") if isinstance(metadata, dict) else None
        if not isinstance(entities, list):
            return {"ok": False, "error": "invalid_metadata_format"}
        errors = [e for entity in entities for e in _entity_errors(entity, unfurl=True)]
        if errors:
            return {"ok": False, "error": "error_processing_metadata", "errors": errors}
        key = _unfurl_key(params)
        shared = self._shared_links.get(key)
        if shared is None:
            return {
                "ok": False,
                "error": "invalid_unfurl_id" if key[0] == "unfurl_id" else "cannot_find_message",
            }
        urls = [str(e["app_unfurl_url"]) for e in entities] + list(params.get("unfurls") or {})
        if not urls or any(url not in shared for url in urls):
            return {"ok": False, "error": "cannot_unfurl_url"}
        self.unfurls.setdefault(key, []).extend(entities)
        return {"ok": True}

    @staticmethod
    def _unfurl_target_error(params: JSONDict) -> str | None:
        """Both ``channel`` and ``ts``, or both ``unfurl_id`` and ``source`` (a valid one)."""
        if params.get("unfurl_id") or params.get("source"):
            if not params.get("unfurl_id"):
                return "missing_unfurl_id"
            if not params.get("source"):
                return "missing_source"
            return None if params["source"] in _UNFURL_SOURCES else "invalid_source"
        if not params.get("channel"):
            return "missing_channel"
        return None if params.get("ts") else "missing_ts"

    # --------------------------------------------------------- Slackbot skills

    def _skill_fields_error(self, params: JSONDict) -> JSONDict | None:
        """Slack's answer to a skill's fields it refuses; ``None`` when they are taken."""
        for name, limit in _SKILL_LIMITS.items():
            if len(str(params.get(name) or "")) > limit:
                return {"ok": False, "error": "invalid_arguments"}
        servers = params.get("mcp_servers")
        if servers is None:
            return None
        if not isinstance(servers, list) or not all(isinstance(s, dict) for s in servers):
            return {"ok": False, "error": "invalid_arguments"}
        invalid = [
            s
            for s in servers
            if s.get("app_id") != self.app_id or s.get("server_id") not in self.mcp_server_ids
        ]
        if invalid:
            return {"ok": False, "error": "invalid_arguments", "invalid_mcp_servers": invalid}
        return None

    def _m_slackbot_skills_create(self, params: JSONDict) -> JSONDict:
        if not params.get("display_name"):
            return {"ok": False, "error": "invalid_arguments"}
        if bool(params.get("instructions")) == bool(params.get("canvas_id")):
            # Exactly one of instructions or canvas_id.
            return {"ok": False, "error": "invalid_arguments"}
        refused = self._skill_fields_error(params)
        if refused is not None:
            return refused
        skill_id = _next_id("F")
        fields = ("display_name", "description", "example_prompt", "instructions", "mcp_servers")
        self.skills[skill_id] = {"id": skill_id, **{f: params[f] for f in fields if f in params}}
        return {"ok": True, "skill": self._skill_object(skill_id)}

    def _m_slackbot_skills_update(self, params: JSONDict) -> JSONDict:
        skill = self.skills.get(str(params.get("skill_id", "")))
        if skill is None:
            return {"ok": False, "error": "invalid_arguments"}
        refused = self._skill_fields_error(params)
        if refused is not None:
            return refused
        # Only the inputs sent are changed.
        for name in (
            "display_name",
            "description",
            "example_prompt",
            "instructions",
            "mcp_servers",
        ):
            if name in params:
                skill[name] = params[name]
        return {"ok": True, "skill": self._skill_object(skill["id"])}

    def _m_slackbot_skills_list(self, params: JSONDict) -> JSONDict:
        # Instructions are not listed; a page of ``limit`` (default 20), then next_cursor.
        ids = sorted(self.skills)
        start = int(params.get("cursor") or 0)
        limit = int(params.get("limit") or 20)
        page = ids[start : start + limit]
        more = start + limit < len(ids)
        return {
            "ok": True,
            "skills": [self._skill_object(i) for i in page],
            "response_metadata": {"next_cursor": str(start + limit) if more else ""},
        }

    def _skill_object(self, skill_id: str) -> JSONDict:
        return {k: v for k, v in self.skills[skill_id].items() if k != "instructions"}

    def _m_entity_presentDetails(self, params: JSONDict) -> JSONDict:
        ref = self._entity_triggers.get(str(params.get("trigger_id") or ""))
        if ref is None:
            return {"ok": False, "error": "invalid_trigger_id"}
        if params.get("user_auth_required") in (True, 1, "1", "true") and not params.get(
            "user_auth_url"
        ):
            return {"ok": False, "error": "user_auth_url_missing"}
        if "error" in params:
            error = params["error"]
            ok = isinstance(error, dict) and error.get("status") in _DETAILS_ERROR_STATUSES
            return {"ok": True} if ok else {"ok": False, "error": "invalid_arguments"}
        metadata = params.get("metadata")
        if metadata is None:
            return {"ok": False, "error": "invalid_arguments"}
        errors = _entity_errors(metadata, unfurl=False)
        if errors:
            return {"ok": False, "error": "invalid_metadata", "errors": errors}
        if str(metadata["external_ref"]["id"]) != ref:
            return {"ok": False, "error": "entity_metadata_does_not_match_trigger"}
        return {"ok": True}

    def _m_files_info(self, params: JSONDict) -> JSONDict:
        stored = self._files.get(str(params.get("file", "")))
        if stored is None:
            return {"ok": False, "error": "file_not_found"}
        return {
            "ok": True,
            "file": dict(stored[0]),
            "comments": [],
            "response_metadata": {"next_cursor": ""},
        }


# Work Objects (https://docs.slack.dev/messaging/work-objects-implementation and the reference
# pages of chat.unfurl and entity.presentDetails): the error statuses presentDetails takes,
# and the most actions an entity shows.
_DETAILS_ERROR_STATUSES = frozenset(
    {
        "restricted",
        "internal_error",
        "not_found",
        "custom",
        "custom_partial_view",
        "timeout",
        "edit_error",
    }
)
_UNFURL_SOURCES = frozenset({"composer", "conversations_history"})
_PRIMARY_ACTIONS = 2
_OVERFLOW_ACTIONS = 5


def _unfurl_key(params: JSONDict) -> tuple[str, str]:
    """The message a ``chat.unfurl`` call names: ``("unfurl_id", id)``, else ``(channel, ts)``."""
    if params.get("unfurl_id"):
        return ("unfurl_id", str(params["unfurl_id"]))
    return (str(params.get("channel", "")), str(params.get("ts", "")))


def _entity_errors(entity: Any, *, unfurl: bool) -> list[str]:
    """What Slack would refuse in one Work Object entity, checked with ``slack_sdk.models``."""
    if not isinstance(entity, Mapping):
        return ["entity must be an object"]
    errors = []
    # "The exact URL posted in the source message. Required in metadata passed to chat.unfurl."
    if unfurl and not entity.get("app_unfurl_url"):
        errors.append("missing required field: app_unfurl_url")
    error = _sdk_error(lambda: EntityMetadata(**entity).to_dict())
    if error:
        return [*errors, error]
    if not str((entity.get("external_ref") or {}).get("id") or ""):
        errors.append("missing required field: external_ref.id")
    payload = entity.get("entity_payload")
    error = _sdk_error(lambda: EntityPayload(**payload).to_dict())
    if error or not isinstance(payload, Mapping):
        return [*errors, error or "entity_payload must be an object"]
    return errors + _payload_errors(payload)


def _payload_errors(payload: Mapping[str, Any]) -> list[str]:
    attributes = payload.get("attributes")
    errors = [
        e
        for e in (
            _sdk_error(lambda: EntityAttributes(**attributes).to_dict()),
            _sdk_error(lambda: EntityTitle(**attributes["title"]).to_dict()),
        )
        if e
    ]
    if not errors and not str(attributes["title"].get("text") or ""):
        errors.append("missing required field: attributes.title.text")
    for custom in payload.get("custom_fields") or []:
        error = _sdk_error(lambda custom=custom: EntityCustomField(**custom).to_dict())
        if error:
            errors.append(error)
    return errors + _action_errors(payload.get("actions"))


def _action_errors(actions: Any) -> list[str]:
    if actions is None:
        return []
    error = _sdk_error(lambda: EntityActions(**actions).to_dict())
    if error:
        return [error]
    errors = []
    for kind, most in (
        ("primary_actions", _PRIMARY_ACTIONS),
        ("overflow_actions", _OVERFLOW_ACTIONS),
    ):
        buttons = actions.get(kind) or []
        if len(buttons) > most:
            errors.append(f"{kind}: at most {most} actions")
        for button in buttons:
            error = _sdk_error(lambda button=button: EntityActionButton(**button).to_dict())
            if error:
                errors.append(error)
                continue
            # Max lengths from the actions table of the Work Objects reference.
            for key, most_chars in (("action_id", 255), ("value", 2000), ("url", 3000)):
                if len(str(button.get(key) or "")) > most_chars:
                    errors.append(f"{kind}.{key}: at most {most_chars} characters")
    return errors


# --------------------------------------------------------------------------- OpenAI


Reply = str | Callable[[list[JSONDict]], str]


# agents.sessions.setStatus's statuses, and chat.stopStream's session_status.
_SESSION_STATUSES = frozenset({"active", "processing", "suspended", "closed"})
_TASK_STATUSES = frozenset({"pending", "in_progress", "complete", "error"})


def _chunk_errors(chunks: Any) -> list[str]:
    """What Slack's streaming reference says is wrong with ``chunks``: each a known type with
    its fields (``task_update``: ``id``, ``title``, a status, URL ``sources``; ``plan_update``:
    ``title``; ``markdown_text``: ``text``, at most 12,000 characters; ``blocks``: valid blocks)."""
    if not isinstance(chunks, list) or not chunks:
        return ["chunks must be a non-empty array"]
    errors = []
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict) or chunk.get("type") not in _CHUNK_FIELDS:
            errors.append(f"chunks[{i}]: unknown chunk type")
            continue
        kind = chunk["type"]
        missing = [f for f in _CHUNK_FIELDS[kind] if not chunk.get(f)]
        if missing:
            errors.append(f"chunks[{i}]: {kind} needs {', '.join(missing)}")
            continue
        errors += [f"chunks[{i}]: {e}" for e in _chunk_field_errors(chunk)]
    return errors


_CHUNK_FIELDS = {
    "markdown_text": ("text",),
    "task_update": ("id", "title", "status"),
    "plan_update": ("title",),
    "blocks": ("blocks",),
}


def _chunk_field_errors(chunk: JSONDict) -> list[str]:
    kind = chunk["type"]
    if kind == "markdown_text" and len(str(chunk["text"])) > 12000:
        return ["markdown_text is longer than 12,000 characters"]
    if kind == "blocks":
        return _block_errors(chunk["blocks"], max_blocks=50)
    if kind == "task_update":
        if chunk["status"] not in _TASK_STATUSES:
            return [f"task_update status {chunk['status']!r}"]
        for source in chunk.get("sources") or []:
            if not isinstance(source, dict):
                return ["task_update sources are url elements"]
            url = source.get("url")
            if source.get("type") != "url" or not source.get("text") or not isinstance(url, str):
                return ["task_update sources are url elements with text"]
            if urlsplit(url).scheme not in ("http", "https"):
                return [f"task_update source url {url!r}"]
    error = _sdk_error(lambda: Chunk.parse(chunk).to_dict())  # type: ignore[union-attr]
    return [error] if error else []


def _ts_key(ts: str) -> tuple[int, int]:
    seconds, _, micros = ts.partition(".")
    return int(seconds), int(micros or 0)


def _is_prompt(prompt: Any) -> bool:
    return (
        isinstance(prompt, dict)
        and set(prompt) == {"title", "message"}
        and all(isinstance(v, str) and v for v in prompt.values())
    )


def hashed_bag_of_words(text: str, dim: int) -> list[float]:
    """A unit vector of ``text``'s lower-cased words, each hashed to one signed coordinate.

    Texts sharing words are close, texts sharing none are orthogonal (up to
    collisions): enough for retrieval through an embeddings endpoint to mean something.
    """
    vec = [0.0] * dim
    for word in re.findall(r"\w+", text.lower()):
        digest = hashlib.sha256(word.encode()).digest()
        vec[int.from_bytes(digest[:4], "big") % dim] += 1.0 if digest[4] % 2 else -1.0
    norm = sum(x * x for x in vec) ** 0.5
    if norm == 0:
        vec[0], norm = 1.0, 1.0
    return [x / norm for x in vec]


class OpenAICompatServer(_LocalServer):
    """A local OpenAI-compatible endpoint: ``POST /v1/chat/completions``, ``POST /v1/embeddings``,
    ``GET /v1/models``.

    Args:
        reply: the assistant's answer, or a function of the request's ``messages``.
        model: the model id ``/v1/models`` lists (requests may name any model).
        api_key: when set, requests without ``Authorization: Bearer <api_key>`` get 401.

    Use :attr:`url` as the client's ``base_url`` (it ends with ``/v1``). Every
    request body lands in :attr:`requests`. Failure modes: :meth:`fail_with`,
    :meth:`delay`, :meth:`drop_connections`, :meth:`answer_raw` (a malformed
    reply); for "connection refused" use
    :func:`closed_port_url` or close the server (its URL then refuses). The
    failure modes apply to embedding requests too, whose bodies land in
    :attr:`embedding_requests`; their vectors are :func:`hashed_bag_of_words`
    of :attr:`embedding_dim` dimensions (change it to provoke a wrong size).
    """

    def __init__(
        self, *, reply: Reply = "OK [1]", model: str = "test-model", api_key: str | None = None
    ) -> None:
        super().__init__()
        self.model = model
        self.api_key = api_key
        self.requests: list[JSONDict] = []
        """Parsed JSON bodies of the chat completion requests, oldest first."""
        self.headers: list[dict[str, str]] = []
        """Request headers, parallel to :attr:`requests`."""
        self._reply: Reply = reply
        self._fail: tuple[int, int | None] | None = None
        self._delay = 0.0
        self._drop: int | None = 0
        self._raw: tuple[bytes, str] | None = None
        self._trickle = 0.0
        self._trickle_embeddings = 0.0
        self._hold: int | None = None
        self.disconnects: list[float] = []
        """When (``time.perf_counter()``) a client went away in the middle of a streamed answer."""
        self._cond = asyncio.Condition()
        self.embedding_requests: list[JSONDict] = []
        """Parsed JSON bodies of the embedding requests, oldest first."""
        self._embeddings_gate: asyncio.Event | None = None
        self.held_embedding_requests = 0
        """How many embedding requests were held open (:meth:`hold_embeddings`)."""
        self.embedding_dim = 64
        self.retry_after: float | None = None
        """When set, a failure answer carries this ``Retry-After`` (seconds)."""
        self._at_once: asyncio.Semaphore | None = None
        self._held_if: Callable[[list[JSONDict]], bool] | None = None
        self._completions_gate = asyncio.Event()
        self.held_completions: list[JSONDict] = []
        """The completion requests held open (:meth:`hold_completions`), in the order held."""

    @property
    def url(self) -> str:
        """The ``base_url`` for ``openai.AsyncOpenAI`` (``http://127.0.0.1:<port>/v1``)."""
        return f"{self.base_url}/v1"

    def set_reply(self, reply: Reply) -> None:
        """Answer with ``reply`` (text, or a function of the request's ``messages``)."""
        self._reply = reply

    def fail_with(self, status: int, times: int | None = None) -> None:
        """Answer the next ``times`` requests (all when ``None``) with ``status`` and an OpenAI error body."""
        self._fail = (status, times)

    def delay(self, seconds: float) -> None:
        """Wait ``seconds`` before answering (to provoke client timeouts); 0 to stop."""
        self._delay = seconds

    def drop_connections(self, times: int | None = None) -> None:
        """Close the connection without answering, for the next ``times`` requests (all when ``None``)."""
        self._drop = times

    def trickle(self, seconds: float) -> None:
        """Stream each piece of the answer ``seconds`` after the previous one; 0 to stop."""
        self._trickle = seconds

    def trickle_embeddings(self, seconds: float) -> None:
        """Send an embedding reply's headers at once, then its body one byte every ``seconds``
        (each byte well within a client's read timeout, the whole far beyond it); 0 to stop."""
        self._trickle_embeddings = seconds

    def hold_after(self, pieces: int | None) -> None:
        """Stream the first ``pieces`` pieces of each answer, then send nothing more until the
        client goes away (noted in :attr:`disconnects`); ``None`` to stop."""
        self._hold = pieces

    async def wait_for_disconnect(self, count: int = 1, timeout: float = WAIT_SECONDS) -> float:
        """Wait until ``count`` clients went away mid-answer; when the last of them did."""
        await _wait_until(
            lambda: len(self.disconnects) >= count,
            self._cond,
            timeout,
            lambda: f"expected {count} client(s) to go away, saw {len(self.disconnects)}",
        )
        return self.disconnects[count - 1]

    async def _until_gone(self, response: web.StreamResponse) -> None:
        """Hold a streamed answer until its client closes the connection.

        The test server cancels a handler whose client went away (an SSE comment
        every 5 ms, which clients skip, also finds out if it does not).
        """
        try:
            while not self._closing.is_set():
                await response.write(b": waiting\n\n")
                await self._sleep(0.005)
        except ConnectionError:
            await self._note_disconnect()
        except asyncio.CancelledError:
            if not self._closing.is_set():
                await self._note_disconnect()
            raise

    async def _note_disconnect(self) -> None:
        self.disconnects.append(time.perf_counter())
        async with self._cond:
            self._cond.notify_all()

    def answer_raw(self, body: bytes, content_type: str) -> None:
        """Answer every completion request with status 200 and exactly ``body``, until :meth:`reset`.

        For replies no client expects: an HTML page from a proxy, a broken stream chunk.
        """
        self._raw = (body, content_type)

    def reset(self) -> None:
        """Back to normal answers; forget recorded requests."""
        self._fail = None
        self._raw = None
        self._trickle = 0.0
        self._trickle_embeddings = 0.0
        self._hold = None
        self.disconnects.clear()
        self._delay = 0.0
        self._drop = 0
        self.requests.clear()
        self.headers.clear()
        self.embedding_requests.clear()
        self.embedding_dim = 64
        self.retry_after = None
        self._at_once = None
        self.release_completions()
        self.held_completions.clear()

    def answer_at_once(self, count: int | None) -> None:
        """Work on at most ``count`` completion requests at a time, the others waiting their
        turn in order of arrival (a model server's parallel slots); ``None``: no limit."""
        self._at_once = asyncio.Semaphore(count) if count is not None else None

    def hold_completions(self, which: Callable[[list[JSONDict]], bool]) -> None:
        """Hold the completion requests whose ``messages`` ``which`` picks, once they have a
        slot (:meth:`answer_at_once`), until :meth:`release_completions`; the others are answered."""
        self._held_if = which
        self._completions_gate = asyncio.Event()

    def release_completions(self) -> None:
        """Answer the held completion requests, and stop holding."""
        self._held_if = None
        self._completions_gate.set()

    async def wait_for_held_completions(
        self, count: int = 1, timeout: float = WAIT_SECONDS
    ) -> list[JSONDict]:
        """Wait until ``count`` completion requests are being held; return them all."""
        await _wait_until(
            lambda: len(self.held_completions) >= count,
            self._cond,
            timeout,
            lambda: f"expected {count} held completion(s), got {len(self.held_completions)}",
        )
        return self.held_completions

    def hold_embeddings(self) -> None:
        """Hold every embedding request open, nothing answered, until :meth:`release_embeddings`.

        A process indexing a document is then stopped at a known point (to be killed there).
        """
        self._embeddings_gate = asyncio.Event()

    def release_embeddings(self) -> None:
        """Answer the held embedding requests, and the next ones at once."""
        if self._embeddings_gate is not None:
            self._embeddings_gate.set()
        self._embeddings_gate = None

    async def wait_for_held_embeddings(self, count: int = 1, timeout: float = WAIT_SECONDS) -> None:
        """Wait until ``count`` embedding requests are being held (:meth:`hold_embeddings`)."""
        await _wait_until(
            lambda: self.held_embedding_requests >= count,
            self._cond,
            timeout,
            lambda: (
                f"expected {count} held embedding request(s), got {self.held_embedding_requests}"
            ),
        )

    async def wait_for_requests(
        self, count: int = 1, timeout: float = WAIT_SECONDS
    ) -> list[JSONDict]:
        """Wait until ``count`` completion requests arrived; return them all."""
        await _wait_until(
            lambda: len(self.requests) >= count,
            self._cond,
            timeout,
            lambda: f"expected {count} completion request(s), got {len(self.requests)}",
        )
        return self.requests

    def _build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        return app

    @staticmethod
    def _error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
        body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        return web.json_response(body, status=status)

    def _authorised(self, request: web.Request) -> bool:
        return (
            self.api_key is None or request.headers.get("Authorization") == f"Bearer {self.api_key}"
        )

    async def _models(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return self._error(
                401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
            )
        model = {"id": self.model, "object": "model", "created": 1700000000, "owned_by": "local"}
        return web.json_response({"object": "list", "data": [model]})

    async def _injected_reply(self, request: web.Request) -> web.StreamResponse | None:
        """The reply a configured fault makes instead of the real one (a wrong key too), or None."""
        if not self._authorised(request):
            return self._error(
                401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"
            )
        if self._drop is None or self._drop > 0:
            if self._drop is not None:
                self._drop -= 1
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)  # never delivered: the socket is gone
        await self._sleep(self._delay)
        if self._fail is not None:
            status, times = self._fail
            if times is not None:
                self._fail = (status, times - 1) if times > 1 else None
            kind = "server_error" if status >= 500 else "invalid_request_error"
            failed = self._error(status, f"Simulated failure ({status}).", kind)
            if self.retry_after is not None:
                failed.headers["Retry-After"] = str(self.retry_after)
            return failed
        if self._raw is not None:
            raw, content_type = self._raw
            return web.Response(body=raw, headers={"Content-Type": content_type})
        return None

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return self._error(
                400, "We could not parse the JSON body of your request.", "invalid_request_error"
            )
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        async with self._cond:
            self._cond.notify_all()

        injected = await self._injected_reply(request)
        if injected is not None:
            return injected
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return self._error(
                400, "'messages' must be a non-empty array.", "invalid_request_error"
            )
        if self._at_once is None:
            return await self._completion(request, body)
        async with self._at_once:
            return await self._completion(request, body)

    async def _completion(self, request: web.Request, body: JSONDict) -> web.StreamResponse:
        """The reply to a well-formed completion request, once any hold let it go."""
        if self._held_if is not None and self._held_if(body["messages"]):
            gate = self._completions_gate
            self.held_completions.append(body)
            async with self._cond:
                self._cond.notify_all()
            await gate.wait()
        reply = self._reply(body["messages"]) if callable(self._reply) else self._reply
        model = str(body.get("model") or self.model)
        completion_id = "chatcmpl-" + _next_id("")
        created = int(time.time())
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(reply.split()),
            "total_tokens": prompt_tokens + len(reply.split()),
        }
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(
                request, completion_id, created, model, reply, usage if include_usage else None
            )
        return web.json_response(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply, "refusal": None},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
                "system_fingerprint": None,
            }
        )

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return self._error(
                400, "We could not parse the JSON body of your request.", "invalid_request_error"
            )
        self.embedding_requests.append(body)
        gate = self._embeddings_gate
        if gate is not None:
            self.held_embedding_requests += 1
            async with self._cond:
                self._cond.notify_all()
            await _until_set(gate, self._closing)
        injected = await self._injected_reply(request)
        if injected is not None:
            return injected
        texts = body.get("input")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return self._error(
                400,
                "'input' must be a string or a non-empty array of strings.",
                "invalid_request_error",
            )
        dim = int(body.get("dimensions") or self.embedding_dim)
        data = [
            {"object": "embedding", "index": i, "embedding": hashed_bag_of_words(t, dim)}
            for i, t in enumerate(texts)
        ]
        tokens = sum(len(t.split()) for t in texts)
        reply = {
            "object": "list",
            "data": data,
            "model": str(body.get("model") or self.model),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        if self._trickle_embeddings:
            return await self._trickled(
                request, json.dumps(reply).encode(), self._trickle_embeddings
            )
        return web.json_response(reply)

    async def _trickled(
        self, request: web.Request, body: bytes, seconds: float
    ) -> web.StreamResponse:
        """``body`` as JSON, its headers at once and then one byte every ``seconds``."""
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = len(body)
        await response.prepare(request)
        for i in range(len(body)):
            if self._closing.is_set():
                break
            await response.write(body[i : i + 1])
            await self._sleep(seconds)
        await response.write_eof()
        return response

    async def _stream(
        self,
        request: web.Request,
        completion_id: str,
        created: int,
        model: str,
        reply: str,
        usage: JSONDict | None,
    ) -> web.StreamResponse:
        """Send ``reply`` as server-sent events, a few words per chunk, then ``[DONE]``."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)

        def chunk(delta: JSONDict, finish: str | None) -> JSONDict:
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }

        events: list[JSONDict] = [chunk({"role": "assistant", "content": ""}, None)]
        events += [chunk({"content": piece}, None) for piece in re.findall(r"\s*\S+\s*|\s+", reply)]
        events.append(chunk({}, "stop"))
        if usage is not None:
            events.append({**chunk({}, None), "choices": [], "usage": usage})
        pieces = 0
        for event in events:
            content = bool(event["choices"] and event["choices"][0]["delta"].get("content"))
            if content and self._hold is not None and pieces >= self._hold:
                await self._until_gone(response)
                return response
            pieces += content
            if self._trickle and content:
                await self._sleep(self._trickle)
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


# --------------------------------------------------------------------------- signing


def sign_slack_request(
    secret: str, body: bytes | str, timestamp: int | None = None
) -> dict[str, str]:
    """Slack's request-signing headers for ``body``.

    ``X-Slack-Signature`` is ``v0=`` + hex HMAC-SHA256 of ``v0:{timestamp}:{body}``
    keyed with the signing secret; ``timestamp`` defaults to now.
    """
    raw = body.encode() if isinstance(body, str) else body
    ts = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), b"v0:%d:" % ts + raw, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": str(ts), "X-Slack-Signature": f"v0={digest}"}


def slack_headers(
    secret: str,
    body: bytes | str,
    *,
    json_body: bool | None = None,
    timestamp: int | None = None,
    retry_num: int | None = None,
    retry_reason: str = "http_timeout",
) -> dict[str, str]:
    """Everything Slack sends with a request: signature, content type, retry headers.

    ``json_body`` defaults to guessing from the body (events are JSON; commands and
    interactivity are form-encoded). ``retry_num`` adds ``X-Slack-Retry-Num`` /
    ``X-Slack-Retry-Reason`` as on Slack's redeliveries.
    """
    raw = body.encode() if isinstance(body, str) else body
    is_json = raw.lstrip()[:1] == b"{" if json_body is None else json_body
    headers = sign_slack_request(secret, raw, timestamp)
    headers["Content-Type"] = "application/json" if is_json else "application/x-www-form-urlencoded"
    headers["User-Agent"] = "Slackbot 1.0 (+https://api.slack.com/robots)"
    if retry_num is not None:
        headers["X-Slack-Retry-Num"] = str(retry_num)
        headers["X-Slack-Retry-Reason"] = retry_reason
    return headers


# --------------------------------------------------------------------------- payloads


def _rich_text(text: str) -> list[JSONDict]:
    """The ``rich_text`` block Slack attaches to a typed message, with mentions as elements."""
    elements: list[JSONDict] = []
    for part in re.split(r"(<@[UW][A-Z0-9]+>)", text):
        if not part:
            continue
        mention = re.fullmatch(r"<@([UW][A-Z0-9]+)>", part)
        elements.append(
            {"type": "user", "user_id": mention.group(1)}
            if mention
            else {"type": "text", "text": part}
        )
    return [
        {
            "type": "rich_text",
            "block_id": _next_id("b")[-5:],
            "elements": [{"type": "rich_text_section", "elements": elements}],
        }
    ]


def _client_msg_id() -> str:
    n = next(_ids)
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def event_payload(
    event: JSONDict,
    *,
    event_id: str | None = None,
    team_id: str = TEAM_ID,
    api_app_id: str = APP_ID,
    event_time: int | None = None,
    bot_user_id: str = BOT_USER_ID,
    is_ext_shared_channel: bool = False,
) -> JSONDict:
    """The Events API ``event_callback`` envelope around ``event``.

    ``is_ext_shared_channel``: the channel is shared with another organisation (Slack Connect).
    """
    return {
        "token": "verification-token-unused",
        "team_id": team_id,
        "context_team_id": team_id,
        "context_enterprise_id": ENTERPRISE_ID,
        "api_app_id": api_app_id,
        "event": event,
        "type": "event_callback",
        "event_id": event_id or _next_id("Ev"),
        "event_time": event_time or int(time.time()),
        "authorizations": [
            {
                "enterprise_id": ENTERPRISE_ID,
                "team_id": team_id,
                "user_id": bot_user_id,
                "is_bot": True,
                "is_enterprise_install": False,
            }
        ],
        "is_ext_shared_channel": is_ext_shared_channel,
        "event_context": "4-" + _next_id("ctx"),
    }


def event_body(event: JSONDict, **envelope: Any) -> bytes:
    """The raw JSON body Slack posts for ``event`` (see :func:`event_payload` for options)."""
    return json.dumps(event_payload(event, **envelope)).encode()


def url_verification_body(challenge: str = "challenge-token") -> bytes:
    """The body of Slack's one-time ``url_verification`` request."""
    return json.dumps(
        {"token": "verification-token-unused", "challenge": challenge, "type": "url_verification"}
    ).encode()


def _user_message(
    kind: str,
    text: str,
    *,
    channel: str,
    user: str = USER_ID,
    ts: str | None = None,
    thread_ts: str | None = None,
    team: str = TEAM_ID,
) -> JSONDict:
    """The fields a person's message carries, whatever event type delivers it."""
    ts = ts or slack_ts()
    event: JSONDict = {
        "type": kind,
        "client_msg_id": _client_msg_id(),
        "text": text,
        "user": user,
        "ts": ts,
        "blocks": _rich_text(text),
        "team": team,
        "channel": channel,
        "event_ts": ts,
    }
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event


def app_mention_event(
    text: str,
    *,
    channel: str = CHANNEL_ID,
    bot_user_id: str = BOT_USER_ID,
    mention: bool = True,
    **fields: Any,
) -> JSONDict:
    """An ``app_mention`` event; ``text`` gets ``<@bot>`` prepended unless ``mention=False``.

    ``fields``: ``user``, ``ts``, ``thread_ts``, ``team`` (the person's own team).
    """
    full = f"<@{bot_user_id}> {text}" if mention else text
    return _user_message("app_mention", full, channel=channel, **fields)


def message_im_event(text: str, *, channel: str = DM_CHANNEL_ID, **fields: Any) -> JSONDict:
    """A ``message`` event in a direct message with the bot (``message.im``).

    ``fields``: ``user``, ``ts``, ``thread_ts``, ``team`` (the person's own team).
    """
    return {**_user_message("message", text, channel=channel, **fields), "channel_type": "im"}


def agent_session_stopped_event(
    channel: str,
    thread_ts: str,
    *,
    user: str = USER_ID,
    streaming_message_ts: Iterable[str] = (),
) -> JSONDict:
    """``agent_session_stopped``: ``user`` clicked Stop on the agent session of that thread.

    ``streaming_message_ts``: the app's streams Slack stopped at the click
    (:meth:`MockSlackAPI.press_stop`); empty when none was streaming.
    """
    return {
        "type": "agent_session_stopped",
        "channel": channel,
        "thread_ts": thread_ts,
        "user": user,
        "streaming_message_ts": list(streaming_message_ts),
        "event_ts": slack_ts(),
    }


def file_share_event(
    files: list[JSONDict],
    *,
    text: str = "",
    user: str = USER_ID,
    channel: str = DM_CHANNEL_ID,
    channel_type: str = "im",
    ts: str | None = None,
    thread_ts: str | None = None,
) -> JSONDict:
    """A ``message`` event with subtype ``file_share`` (files sent to the bot); pass :meth:`MockSlackAPI.add_file` objects."""
    ts = ts or slack_ts()
    event: JSONDict = {
        "type": "message",
        "subtype": "file_share",
        "text": text,
        "files": files,
        "upload": False,
        "user": user,
        "display_as_bot": False,
        "ts": ts,
        "channel": channel,
        "event_ts": ts,
        "channel_type": channel_type,
    }
    if text:
        event["blocks"] = _rich_text(text)
        event["client_msg_id"] = _client_msg_id()
    if thread_ts:
        event["thread_ts"] = thread_ts
    return event


def _trigger_id() -> str:
    n = next(_ids)
    return f"{n}.{n * 7919}.{hashlib.md5(str(n).encode()).hexdigest()}"


def slash_command_payload(
    command: str,
    text: str = "",
    user_id: str = USER_ID,
    channel_id: str = CHANNEL_ID,
    response_url: str | None = None,
    trigger_id: str | None = None,
    *,
    team_id: str = TEAM_ID,
    user_name: str = "alice",
    channel_name: str = "general",
    api_app_id: str = APP_ID,
) -> dict[str, str]:
    """The fields of a slash command: the form Slack posts, or a Socket Mode envelope's payload.

    Pass ``response_url=slack.response_url(...)``; without one it points at a
    local port that refuses connections (never at hooks.slack.com).
    """
    return {
        "token": "verification-token-unused",
        "team_id": team_id,
        "team_domain": "example",
        "channel_id": channel_id,
        "channel_name": "directmessage" if channel_id.startswith("D") else channel_name,
        "user_id": user_id,
        "user_name": user_name,
        "command": command,
        "text": text,
        "api_app_id": api_app_id,
        "is_enterprise_install": "false",
        "response_url": response_url or UNREACHABLE_RESPONSE_URL,
        "trigger_id": trigger_id or _trigger_id(),
    }


def slash_command_body(*args: Any, **fields: Any) -> bytes:
    """The form-encoded body Slack posts for a slash command (arguments of :func:`slash_command_payload`)."""
    return urlencode(slash_command_payload(*args, **fields)).encode()


def socket_envelope(
    kind: str,
    payload: JSONDict,
    *,
    envelope_id: str | None = None,
    retry_attempt: int = 0,
    retry_reason: str = "",
) -> JSONDict:
    """A Socket Mode envelope as Slack sends it over the websocket.

    ``kind`` is ``events_api`` (``payload``: an :func:`event_payload`),
    ``slash_commands`` (:func:`slash_command_payload`) or ``interactive``. Only
    events carry retry fields; commands and interactivity accept a response
    payload in the acknowledgement.
    """
    envelope: JSONDict = {
        "envelope_id": envelope_id or str(uuid.uuid4()),
        "type": kind,
        "payload": payload,
        "accepts_response_payload": kind != "events_api",
    }
    if kind == "events_api":
        envelope["retry_attempt"] = retry_attempt
        envelope["retry_reason"] = retry_reason
    return envelope


def _user_ref(user_id: str, team_id: str) -> JSONDict:
    return {"id": user_id, "username": user_id.lower(), "name": user_id.lower(), "team_id": team_id}


def file_input_state(block_id: str, action_id: str, files: list[JSONDict]) -> JSONDict:
    """A view ``state`` whose ``file_input`` (``block_id``/``action_id``) holds ``files``."""
    return {"values": {block_id: {action_id: {"type": "file_input", "files": files}}}}


def view_submission_body(
    view: JSONDict,
    user_id: str = USER_ID,
    *,
    team_id: str = TEAM_ID,
    api_app_id: str = APP_ID,
    trigger_id: str | None = None,
    response_urls: list[JSONDict] | None = None,
    user_team_id: str | None = None,
) -> bytes:
    """The ``payload=<JSON>`` body of a ``view_submission``.

    ``user_team_id``: the submitter's own team, when it is not the app's (Slack Connect).

    ``view`` is typically the view the bot opened (from ``MockSlackAPI.views`` or
    ``calls("views.open")``) with ``state`` set, e.g. by :func:`file_input_state`;
    missing fields get Slack's defaults.
    """
    full: JSONDict = {
        "id": _next_id("V"),
        "team_id": team_id,
        "type": "modal",
        "blocks": [],
        "private_metadata": "",
        "callback_id": "",
        "state": {"values": {}},
        "hash": _next_id("hash."),
        "title": {"type": "plain_text", "text": "Modal"},
        "clear_on_close": False,
        "notify_on_close": False,
        "close": None,
        "submit": None,
        "previous_view_id": None,
        "app_id": api_app_id,
        "external_id": "",
        "app_installed_team_id": team_id,
        "bot_id": BOT_ID,
    }
    full.update(view)
    full.setdefault("root_view_id", full["id"])
    payload = {
        "type": "view_submission",
        "team": {"id": team_id, "domain": "example"},
        "user": _user_ref(user_id, user_team_id or team_id),
        "api_app_id": api_app_id,
        "token": "verification-token-unused",
        "trigger_id": trigger_id or _trigger_id(),
        "view": full,
        "response_urls": response_urls or [],
        "is_enterprise_install": False,
        "enterprise": None,
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def button_action(
    action_id: str, value: str = "", *, block_id: str | None = None, text: str = "Button"
) -> JSONDict:
    """One ``button`` entry of a ``block_actions`` payload's ``actions``."""
    return {
        "action_id": action_id,
        "block_id": block_id or _next_id("blk"),
        "text": {"type": "plain_text", "text": text, "emoji": True},
        "value": value,
        "type": "button",
        "action_ts": slack_ts(),
    }


def feedback_action(action_id: str, value: str, *, block_id: str | None = None) -> JSONDict:
    """One ``feedback_buttons`` click (a ``context_actions`` thumbs up/down)."""
    return {
        "action_id": action_id,
        "block_id": block_id or _next_id("blk"),
        "text": {"type": "plain_text", "text": "\U0001f44d" if "pos" in value else "\U0001f44e"},
        "value": value,
        "type": "feedback_buttons",
        "action_ts": slack_ts(),
    }


def block_actions_body(
    actions: list[JSONDict],
    user_id: str = USER_ID,
    channel_id: str = CHANNEL_ID,
    message_ts: str | None = None,
    *,
    message: JSONDict | None = None,
    thread_ts: str | None = None,
    response_url: str | None = None,
    team_id: str = TEAM_ID,
    api_app_id: str = APP_ID,
    trigger_id: str | None = None,
    view: JSONDict | None = None,
) -> bytes:
    """The ``payload=<JSON>`` body of a ``block_actions`` interaction.

    For a click in a message give ``message_ts`` (and ideally the ``message``,
    e.g. from ``MockSlackAPI.messages``); for a click in a modal give ``view``.
    """
    payload: JSONDict = {
        "type": "block_actions",
        "user": _user_ref(user_id, team_id),
        "api_app_id": api_app_id,
        "token": "verification-token-unused",
        "trigger_id": trigger_id or _trigger_id(),
        "team": {"id": team_id, "domain": "example"},
        "enterprise": None,
        "is_enterprise_install": False,
        "state": {"values": {}},
        "actions": actions,
    }
    if view is not None:
        payload["container"] = {"type": "view", "view_id": view.get("id", "")}
        payload["view"] = view
    else:
        ts = message_ts or (message or {}).get("ts") or slack_ts()
        msg = dict(
            message or {"type": "message", "user": BOT_USER_ID, "ts": ts, "text": "", "blocks": []}
        )
        if thread_ts:
            msg.setdefault("thread_ts", thread_ts)
        payload["container"] = {
            "type": "message",
            "message_ts": ts,
            "channel_id": channel_id,
            "is_ephemeral": False,
        }
        if thread_ts:
            payload["container"]["thread_ts"] = thread_ts
        payload["channel"] = {"id": channel_id, "name": "general"}
        payload["message"] = msg
        payload["response_url"] = response_url or UNREACHABLE_RESPONSE_URL
    return urlencode({"payload": json.dumps(payload)}).encode()
