"""The MCP endpoint: ``POST /mcp`` on the bot's web server (Streamable HTTP, stateless JSON).

The official SDK (``mcp``) speaks the protocol: an ``MCPServer`` with the two
tools (``bot.mcp.tools``), whose ``StreamableHTTPSessionManager`` runs stateless
with JSON responses (every POST is answered with one JSON body, no session to
keep, any replica can take any call). This module is the door in front of it,
in aiohttp, so nothing reaches the SDK before it passed:

1. a query string is refused (400): a token in a URL ends up in logs and
   histories, so none is ever read from one (and the access log never writes
   query strings, ``bot.server.routes.AccessLogger``);
2. only POST is served (405 otherwise): stateless JSON has no event stream to
   GET and no session to DELETE;
3. a body over ``MAX_BODY_BYTES`` is refused (413) before it is read whole, and
   one not sent within ``KB_HTTP_BODY_TIMEOUT`` gets 408 (``bot.server.bodies``,
   as on every route, in JSON-RPC's words here);
4. the caller must be a bearer token an admin issued (checked before the body
   is read), or (``KB_MCP_SLACK_IDENTITY``) a request Slack signed
   (``bot.mcp.auth``); anything else, two ``Authorization`` headers included,
   gets a bare 401 with ``WWW-Authenticate: Bearer``, saying nothing about why.
   A Slack signature is accepted once: it is claimed in the store's used values
   (``index.storage.used_states``, shared by every replica, the room that refuses
   a replayed sign-in) until its five-minute window is over, and a request that
   comes again gets a 401 saying so, with a log line;
5. at most ``KB_MCP_CALLS_PER_MINUTE`` requests per person, all their tokens and
   Slack-signed calls together (429, ``Retry-After``).

Then a body holding half of an escaped UTF-16 pair (``\\ud83d``: a client that
cut a message in the middle of an emoji, as Slack's clients do) is taken with
each half as U+FFFD (``index.normal_form.well_formed``, as every surface takes a
question): the SDK's JSON parser refuses the whole call over it. And the
verified body and caller are handed to the SDK as one ASGI request
(the caller in the ASGI scope, where the tools read it). The body has been
read once already (to check a Slack signature over its exact bytes), so it is
replayed to the SDK from memory rather than streamed through a mounted ASGI app.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from bot.mcp.auth import (
    SIGNATURE_WINDOW_SECONDS,
    Caller,
    SlackSignatures,
    bearer_token,
    slack_identity,
)
from bot.mcp.blocks import SlackbotBlocks
from bot.mcp.limits import CallLimiter
from bot.mcp.people import People
from bot.mcp.tools import CALLER_SCOPE_KEY, Tools, knowledge_base_tools
from bot.server import bodies
from core.answer import Engine
from index.errors import KBError
from index.normal_form import well_formed
from index.storage import McpToken, McpTokens, UsedStates

log = logging.getLogger(__name__)
# The SDK logs every stateless request's end at INFO ("Terminating session: None"):
# the access log already has one line per request.
logging.getLogger("mcp.server.streamable_http").setLevel(logging.WARNING)

__all__ = [
    "MAX_BODY_BYTES",
    "MCP_ENDPOINT",
    "MCP_PATH",
    "McpConfig",
    "McpEndpoint",
    "attach",
]

MCP_PATH = "/mcp"
# A tool call is a question and a few fields; 64 KiB is room for any of them
# and keeps a flood of large bodies from costing memory.
MAX_BODY_BYTES = 64 * 1024
INSTRUCTIONS = (
    "Tools over the company's knowledge base. Answers and passages come only from its "
    "documents, with links into the exact passage. When a tool says the knowledge base has "
    "nothing on a question, tell the person so; do not answer from elsewhere."
)
# JSON-RPC's code for a request the server will not process (the SDK's own errors use it too).
_INVALID_REQUEST = -32600
_RATE_LIMITED = -32029
# How an accepted Slack signature is kept among the store's used values (beside sign-in states).
_SIGNATURE_CLAIM = "mcp-slack-signature:"
# A signature is valid while its timestamp is within the window of now, either way: one
# stamped up to a window ahead stays valid for two windows from its first use.
_SIGNATURE_KEPT_SECONDS = 2 * SIGNATURE_WINDOW_SECONDS
REPLAYED = (
    "This Slack-signed request was received before: each signature is accepted once. "
    "Send a new request."
)


@dataclass(frozen=True)
class McpConfig:
    """What the MCP endpoint needs.

    Attributes:
        calls_per_minute: requests one caller may make in any minute.
        slack_signing_secret: with it, requests Slack signed are served as the
            person they name (Slack identity auth); empty: bearer tokens only.
    """

    calls_per_minute: int = 60
    slack_signing_secret: str = ""


MCP_ENDPOINT: web.AppKey[McpEndpoint] = web.AppKey("mcp_endpoint")


class _Replayed(Exception):
    """A Slack signature that was accepted before, on this replica or another."""


class McpEndpoint:
    """The door to the SDK's session manager: refuse, authenticate, limit, pass on.

    Args:
        manager: the SDK's session manager (stateless, JSON).
        tokens: the issued bearer tokens.
        used: the store's values used once (accepted Slack signatures are claimed there).
        config: the rate limit and the Slack signing secret.
        limiter: counts calls per person (one with ``config``'s limit by default).
    """

    def __init__(
        self,
        manager: StreamableHTTPSessionManager,
        tokens: McpTokens,
        used: UsedStates,
        config: McpConfig,
        *,
        limiter: CallLimiter | None = None,
    ) -> None:
        self.manager = manager
        self.tokens = tokens
        self.used = used
        self.limiter = limiter or CallLimiter(config.calls_per_minute)
        self.signatures = (
            SlackSignatures(config.slack_signing_secret) if config.slack_signing_secret else None
        )
        self._limited: set[str] = set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one HTTP request to ``/mcp``."""
        refused = _refused(request)
        if refused is not None:
            return refused
        token = await self._token(request)
        if token is False:
            return _unauthorized()
        # Its size and the time it may take are bot.server.bodies' (MAX_BODY_BYTES here).
        body = await request.read()
        try:
            caller = await self._caller(request, token, body)
        except _Replayed:
            return _unauthorized(REPLAYED)
        if caller is None:
            return _unauthorized()
        if body.lstrip()[:1] == b"[":
            # MCP dropped JSON-RPC batches (2025-06-18); the SDK would answer with a
            # validation error about unions.
            return _rpc_error(400, "Send one JSON-RPC message per request: batches are not taken.")
        limited = self._limited_answer(caller)
        if limited is not None:
            return limited
        return await _asgi(self.manager, request, _well_formed(body), caller)

    async def _token(self, request: web.Request) -> McpToken | None | Literal[False]:
        """The bearer token of ``request``; ``None`` without one; ``False``: refuse now.

        Refused before the body is read, so an unknown caller cannot hold the
        connection open by sending a body slowly.
        """
        authorization = request.headers.getall("Authorization", [])
        if len(authorization) > 1:
            # Two credentials: a proxy may check one and this server use the other.
            return False
        token = bearer_token(authorization[0] if authorization else None)
        if token is None:
            return None if self.signatures is not None else False
        found = await asyncio.to_thread(self.tokens.verify, token)
        return found if found is not None else False

    async def _caller(
        self, request: web.Request, token: McpToken | None, body: bytes
    ) -> Caller | None:
        """Who sent ``request``; ``None``: nobody known.

        Raises:
            _Replayed: the request carries a Slack signature accepted before.
        """
        if token is not None:
            return Caller(token=token)
        signature = self.signatures.verified(body, request.headers) if self.signatures else None
        if signature is None:
            return None
        try:
            first = await asyncio.to_thread(
                self.used.claim, _SIGNATURE_CLAIM + signature, ttl_seconds=_SIGNATURE_KEPT_SECONDS
            )
        except KBError as exc:
            # Not known to be unused: refused, never let through.
            log.error("Slack signatures used before cannot be checked (%s): request refused", exc)
            return None
        if not first:
            log.warning(
                "refused a replayed Slack-signed MCP request: its signature was used before"
            )
            raise _Replayed
        return Caller(slack=slack_identity(body))

    def _limited_answer(self, caller: Caller) -> web.Response | None:
        """The 429 for a caller over its rate limit; ``None``: the call is admitted."""
        wait = self.limiter.admit(caller.key)
        if wait is None:
            self._limited.discard(caller.key)
            return None
        if caller.key not in self._limited:
            # Once per burst, not once per refused request.
            log.info("MCP calls of %s (%s) are over the rate limit", caller.key, caller.client)
            self._limited.add(caller.key)
        return _rpc_error(
            429,
            f"Too many calls: at most {self.limiter.per_minute} a minute for this person, "
            f"all their tokens together. Try again in {wait} s.",
            code=_RATE_LIMITED,
            headers={"Retry-After": str(wait)},
        )


# An escaped UTF-16 surrogate (either half), in any case: the only way JSON carries a lone one.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _well_formed(body: bytes) -> bytes:
    """``body`` with every lone surrogate its strings escape as U+FFFD; as it is otherwise.

    Read again only when it escapes a surrogate at all (an emoji escaped whole is a
    pair, kept as its character); a body Python cannot read either is the SDK's to refuse.
    """
    if not _ESCAPED_SURROGATE.search(body):
        return body
    try:
        message = _strings_well_formed(json.loads(body))
    except (ValueError, RecursionError):  # deep nesting exhausts the stack
        return body
    return json.dumps(message, ensure_ascii=False).encode()


def _strings_well_formed(value: Any) -> Any:
    if isinstance(value, str):
        return well_formed(value)
    if isinstance(value, list):
        return [_strings_well_formed(v) for v in value]
    if isinstance(value, dict):
        return {well_formed(k): _strings_well_formed(v) for k, v in value.items()}
    return value


def _refused(request: web.Request) -> web.Response | None:
    """The answer to a request refused before its credentials are looked at; ``None``: go on."""
    if request.query_string:
        # The query string is neither read nor logged: it may hold a token.
        return _rpc_error(
            400,
            "The MCP endpoint takes no query string: send the token in the "
            "Authorization header (Bearer).",
        )
    if request.method != "POST":
        # Stateless JSON has no event stream to GET (the SDK would hold a GET open
        # forever) and no session to DELETE.
        return _rpc_error(
            405,
            "The MCP endpoint takes only POST (stateless, JSON answers; no event stream).",
            headers={"Allow": "POST"},
        )
    return None


def _rpc_error(
    status: int,
    message: str,
    *,
    code: int = _INVALID_REQUEST,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """A JSON-RPC error answer, which MCP clients show, with an HTTP status for the rest."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def _refusal(status: int, message: str, headers: Mapping[str, str]) -> web.Response:
    """How ``bot.server.bodies`` refuses a request here (too large, too slow, busy): in JSON-RPC."""
    return _rpc_error(status, message, headers=dict(headers))


def _unauthorized(message: str = "") -> web.Response:
    # Nothing about why (no token, unknown, revoked, expired): each looks the same. Only a
    # replay is named: whoever sent it holds a signature that was valid, so it tells them nothing.
    if message:
        body = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": _INVALID_REQUEST, "message": message},
        }
        return web.json_response(body, status=401, headers={"WWW-Authenticate": "Bearer"})
    return web.Response(status=401, headers={"WWW-Authenticate": "Bearer"})


async def _asgi(
    manager: StreamableHTTPSessionManager, request: web.Request, body: bytes, caller: Caller
) -> web.Response:
    """Hand one verified request to the SDK as ASGI, and its (single, JSON) answer back."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.encode("latin-1"),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower(), v) for k, v in request.raw_headers],
        # Optional in ASGI; the SDK needs neither.
        "client": None,
        "server": None,
        CALLER_SCOPE_KEY: caller,
    }
    delivered = False
    answered = _Answer()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.done.wait()
        return {"type": "http.disconnect"}

    try:
        await manager.handle_request(scope, receive, answered.send)
    finally:
        answered.done.set()
    return answered.response()


class _Answer:
    """What the SDK sent back for one request, gathered into one aiohttp response."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.status = 500
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.headers = [
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])
            ]
        elif message["type"] == "http.response.body":
            self.body.append(bytes(message.get("body", b"")))

    def response(self) -> web.Response:
        # aiohttp sets the length and encoding of the body it sends itself.
        headers = [(k, v) for k, v in self.headers if k.lower() not in _HOP_HEADERS]
        return web.Response(status=self.status, body=b"".join(self.body), headers=headers)


_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


@contextlib.asynccontextmanager
async def _held(manager: StreamableHTTPSessionManager) -> AsyncIterator[None]:
    """The session manager running in a task of its own while the context is open.

    Its task group must be left by the task that entered it, and aiohttp may run
    an app's start-up and clean-up in different tasks (its test server does).
    """
    started, stop = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with manager.run():
            started.set()
            await stop.wait()

    task = asyncio.create_task(hold(), name="mcp-session-manager")
    waiting = asyncio.create_task(started.wait())
    await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiting.cancel()
        task.result()  # the manager failed to start: raise its error
    try:
        yield
    finally:
        stop.set()
        await task


def build_server(tools: Tools) -> MCPServer[Any]:
    """The SDK's server with the knowledge base's tools."""
    return MCPServer(
        "knowledge-base",
        title="Company knowledge base",
        instructions=INSTRUCTIONS,
        tools=knowledge_base_tools(tools),
    )


def attach(
    app: web.Application,
    engine: Engine,
    config: McpConfig,
    people: People | None,
    blocks: SlackbotBlocks | None = None,
) -> McpEndpoint:
    """Serve the MCP endpoint at ``/mcp`` on ``app``, the tools over ``engine``.

    Args:
        app: the web application (Slack, the viewer, the health checks).
        engine: the answer engine; its knowledge base's store holds the tokens.
        config: the rate limit and Slack identity auth.
        people: who belongs to the workspace and its channels; ``None``: nobody to ask.
        blocks: the Block Kit Slackbot is shown beside the text; ``None``: text only.
    """
    server = build_server(Tools(engine, people, blocks))
    server.streamable_http_app(
        json_response=True,
        stateless_http=True,
        max_request_body_size=MAX_BODY_BYTES,
        # Every call needs a token or Slack's signature, which a DNS-rebinding page lacks;
        # checking the Host header would only break the public URL behind a proxy.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    manager = server.session_manager
    store = engine.kb.store
    endpoint = McpEndpoint(manager, store.mcp_tokens, store.used_states, config)

    async def run_manager(app: web.Application) -> AsyncIterator[None]:
        # Stateless: no session outlives its request, so stopping it loses nothing.
        async with _held(manager):
            yield

    app[MCP_ENDPOINT] = endpoint
    app.router.add_route("*", MCP_PATH, endpoint.handle)
    bodies.limit_body(app, MCP_PATH, MAX_BODY_BYTES, _refusal)
    app.cleanup_ctx.append(run_manager)
    return endpoint
