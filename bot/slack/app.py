"""The Slack surface on the web server: the bolt app, HTTP events, Socket Mode.

``attach(app, config, services)`` builds the bolt ``AsyncApp`` with every
listener registered and adds ``POST /slack/events`` to the aiohttp app; in
Socket Mode (``SLACK_APP_TOKEN`` set) there is no such route and
``enable_socket_mode`` connects while the app runs. Without Slack credentials nothing is registered and the log
says which settings are missing; the rest of the server runs all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot import access
from bot.server import bodies, routes
from bot.slack import inbound
from bot.slack.config import SlackConfig
from bot.slack.handlers import register
from bot.slack.services import Services

log = logging.getLogger(__name__)

__all__ = [
    "BOLT",
    "EVENTS_PATH",
    "SLACK_CONFIG",
    "attach",
    "build_bolt",
    "enable_socket_mode",
    "web_client",
]

BOLT = web.AppKey("bolt", AsyncApp)
SLACK_CONFIG = web.AppKey("slack_config", SlackConfig)
EVENTS_PATH = "/slack/events"
# Slack documents no largest request. The largest it sends are interactions carrying
# a whole view (100 blocks of up to 3,000 characters each), form-encoded: under 1 MiB,
# the size aiohttp takes by default, which this route kept.
MAX_BODY_BYTES = 1024 * 1024
# Bolt's AsyncApp reads these from the environment and, when both are set,
# becomes a multi-workspace OAuth app; here they serve the viewer's sign-in only.
_BOLT_OAUTH_ENV = ("SLACK_CLIENT_ID", "SLACK_CLIENT_SECRET")


def attach(
    app: web.Application,
    config: SlackConfig,
    services: Services,
    client: AsyncWebClient | None = None,
) -> str:
    """Serve Slack on ``app``; returns the Slack mode: ``socket``, ``http`` or ``disabled``."""
    app[SLACK_CONFIG] = config
    bolt = build_bolt(config, services, client)
    mode = "disabled" if bolt is None else "socket" if config.app_token else "http"
    if bolt is not None:
        app[BOLT] = bolt
    # In Socket Mode every event arrives over the websocket: an HTTP door left
    # open would accept whatever carries a valid signature, so there is none.
    if mode != "socket":
        app.router.add_post(EVENTS_PATH, _slack_events)
        bodies.limit_body(app, EVENTS_PATH, MAX_BODY_BYTES)
    routes.add_readiness_info(app, "slack", mode)
    return mode


def build_bolt(
    config: SlackConfig, services: Services, client: AsyncWebClient | None = None
) -> AsyncApp | None:
    """The bolt app with every listener registered, or ``None`` when Slack is not configured."""
    if config.missing:
        log.warning("Slack is disabled until these settings are set: %s", ", ".join(config.missing))
        return None
    client = client or web_client(config)
    with _oauth_env_hidden():
        # Only the client is passed (it carries the bot token); passing both makes bolt warn.
        bolt = AsyncApp(client=client, signing_secret=config.signing_secret, name="kb")
    if bolt.oauth_flow is not None:
        # A bolt release that found the credentials some other way: never serve in that mode.
        raise RuntimeError(
            "bolt switched to OAuth installation mode; this bot serves one workspace"
        )
    register(bolt, services)
    return bolt


def web_client(config: SlackConfig, **kwargs: Any) -> AsyncWebClient:
    """A Web API client for the bot token at ``SLACK_API_URL``, retrying what is worth retrying."""
    return access.web_client(config.bot_token, config.api_url, **kwargs)


@contextlib.contextmanager
def _oauth_env_hidden() -> Iterator[None]:
    """Keep the app's OAuth credentials out of bolt's sight while it is built.

    Bolt offers no setting that stops it reading them (an explicit
    ``oauth_settings`` turns OAuth mode on, never off), and it reads them only in
    ``AsyncApp.__init__``. Construction is synchronous, so no other code of this
    process runs meanwhile on the event loop.
    """
    saved = {name: os.environ.pop(name) for name in _BOLT_OAUTH_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


async def _slack_events(request: web.Request) -> web.Response:
    """Slack's Events API, commands and interactivity over HTTP, verified and dispatched by bolt."""
    bolt = request.app.get(BOLT)
    if bolt is None or not request.app[SLACK_CONFIG].signing_secret:
        # Without a signing secret nothing proves a request came from Slack: accept none.
        return web.json_response(
            {
                "error": "Slack HTTP events are not configured: set SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET."
            },
            status=503,
        )
    refusal = inbound.check(
        request.headers, await request.read(), request.app[SLACK_CONFIG].signing_secret
    )
    if refusal is not None:
        return web.json_response({"error": refusal.reason}, status=refusal.status)
    response = await bolt.async_dispatch(await to_bolt_request(request))
    return await to_aiohttp_response(response)


def _socket_mode(
    bolt: AsyncApp, app_token: str
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

        handler = AsyncSocketModeHandler(bolt, app_token)
        routes.add_readiness_check(app, "slack_connected", handler.client.is_connected)
        # In the background: the SDK retries a refused connection (a wrong
        # SLACK_APP_TOKEN) every 10 s forever, and the viewer and health checks
        # must come up meanwhile; /readyz reports whether Slack is connected.
        task = asyncio.create_task(_connect(handler))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await handler.close_async()

    return ctx


async def _connect(handler: Any) -> None:
    await handler.connect_async()
    log.info("connected to Slack in Socket Mode")


def enable_socket_mode(app: web.Application) -> bool:
    """Connect to Slack in Socket Mode while ``app`` runs, when ``SLACK_APP_TOKEN`` is set.

    Call before the app starts. Returns whether Socket Mode was enabled (Slack
    is configured and an app-level token is set).
    """
    bolt = app.get(BOLT)
    app_token = app[SLACK_CONFIG].app_token
    if bolt is None or not app_token:
        return False
    app.cleanup_ctx.append(_socket_mode(bolt, app_token))
    return True
