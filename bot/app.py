"""The bot's one server process: the bolt app and the aiohttp web server around it.

``create_app(settings)`` opens the knowledge base and the engine once (the
embedding model loads once), wires the bolt ``AsyncApp`` to Slack's HTTP events
at ``/slack/events``, and serves the document viewer and the health checks.
``run_server(settings)`` runs it: in Socket Mode when ``SLACK_APP_TOKEN`` is
set (no public URL needed), otherwise with HTTP events; the web server runs in
both modes. Without Slack credentials the viewer and health checks still run
and the log says which settings are missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from bot.server import routes
from bot.slack.listeners import Services, register
from core.answer import Engine, build_engine
from index.knowledge_base import KnowledgeBase
from index.settings import Settings

log = logging.getLogger(__name__)

__all__ = [
    "BOLT",
    "SERVICES",
    "create_app",
    "enable_socket_mode",
    "missing_slack_settings",
    "run_server",
]

BOLT = web.AppKey("bolt", AsyncApp)
SERVICES = web.AppKey("services", Services)
EVENTS_PATH = "/slack/events"
# On shutdown, uploads being indexed get this long to finish before they are cancelled.
SHUTDOWN_GRACE_SECONDS = 30.0


def missing_slack_settings(settings: Settings) -> list[str]:
    """Environment variables that must be set before the bot can talk to Slack."""
    missing = [] if settings.slack_bot_token else ["SLACK_BOT_TOKEN"]
    if not settings.slack_app_token and not settings.slack_signing_secret:
        missing.append("SLACK_SIGNING_SECRET (or SLACK_APP_TOKEN for Socket Mode)")
    return missing


def create_app(
    settings: Settings,
    *,
    engine: Engine | None = None,
    kb: KnowledgeBase | None = None,
    slack_client: AsyncWebClient | None = None,
) -> web.Application:
    """Build the aiohttp application serving Slack events, the viewer and health checks.

    Args:
        settings: the product settings.
        engine: an opened engine (tests share one); built from ``settings`` otherwise.
        kb: an opened knowledge base; the engine's, or opened from ``settings``.
        slack_client: the Web API client; by default one for ``SLACK_BOT_TOKEN``
            at ``SLACK_API_URL``.

    Returns:
        The application; run it with ``web.run_app`` or a test client.
    """
    kb = kb or (engine.kb if engine is not None else KnowledgeBase(settings))
    engine = engine or build_engine(settings, kb=kb)
    services = Services.open(settings, kb, engine)
    app = web.Application(middlewares=routes.MIDDLEWARES)
    app[routes.SETTINGS] = settings
    app[routes.KB] = kb
    app[routes.ENGINE] = engine
    app[SERVICES] = services
    bolt = build_bolt(settings, services, slack_client)
    if bolt is not None:
        app[BOLT] = bolt
    app[routes.SLACK_MODE] = _slack_mode(settings, bolt)
    routes.setup(app)
    app.router.add_post(EVENTS_PATH, _slack_events)
    app.cleanup_ctx.append(_services_ctx)
    return app


def build_bolt(
    settings: Settings, services: Services, client: AsyncWebClient | None = None
) -> AsyncApp | None:
    """The bolt app with every listener registered, or ``None`` when Slack is not configured."""
    missing = missing_slack_settings(settings)
    if missing:
        log.warning("Slack is disabled until these settings are set: %s", ", ".join(missing))
        return None
    client = client or AsyncWebClient(
        token=settings.slack_bot_token,
        base_url=settings.slack_api_url,
        # The async client retries only connection errors unless told otherwise.
        retry_handlers=[
            AsyncConnectionErrorRetryHandler(),
            AsyncRateLimitErrorRetryHandler(max_retry_count=2),
        ],
    )
    # Only the client is passed (it carries the bot token); passing both makes bolt warn.
    bolt = AsyncApp(client=client, signing_secret=settings.slack_signing_secret, name="kb")
    if bolt.oauth_flow is not None:
        log.error(
            "Slack is disabled: SLACK_CLIENT_ID and SLACK_CLIENT_SECRET are set, which switches "
            "bolt to multi-workspace OAuth. This bot uses one workspace's SLACK_BOT_TOKEN: unset them."
        )
        return None
    register(bolt, services)
    return bolt


def _slack_mode(settings: Settings, bolt: AsyncApp | None) -> str:
    if bolt is None:
        return "disabled"
    return "socket" if settings.slack_app_token else "http"


async def _slack_events(request: web.Request) -> web.Response:
    """Slack's Events API, commands and interactivity over HTTP, verified and dispatched by bolt."""
    bolt = request.app.get(BOLT)
    if bolt is None or not request.app[routes.SETTINGS].slack_signing_secret:
        # Without a signing secret nothing proves a request came from Slack: accept none.
        return web.json_response(
            {
                "error": "Slack HTTP events are not configured: set SLACK_BOT_TOKEN and SLACK_SIGNING_SECRET."
            },
            status=503,
        )
    response = await bolt.async_dispatch(await to_bolt_request(request))
    return await to_aiohttp_response(response)


async def _services_ctx(app: web.Application) -> AsyncIterator[None]:
    services = app[SERVICES]
    await services.uploader.start()
    # Load (or rebuild) the search snapshot now rather than on the first question.
    await asyncio.to_thread(services.kb.indexes.open)
    yield
    try:
        await asyncio.wait_for(services.jobs.drain(), SHUTDOWN_GRACE_SECONDS)
    except TimeoutError:
        log.warning(
            "shutting down with %d background jobs still running; cancelling them",
            len(services.jobs),
        )
        await services.jobs.cancel_all()
    await services.uploader.close()
    await services.engine.aclose()
    services.ack_executor.shutdown(wait=False)


def _socket_mode(
    bolt: AsyncApp, app_token: str
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

        handler = AsyncSocketModeHandler(bolt, app_token)
        app[routes.SOCKET_CONNECTED] = handler.client.is_connected
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
    app_token = app[routes.SETTINGS].slack_app_token
    if bolt is None or not app_token:
        return False
    app.cleanup_ctx.append(_socket_mode(bolt, app_token))
    return True


def run_server(settings: Settings) -> None:
    """Serve until interrupted: Slack (Socket Mode or HTTP events), the viewer and health checks."""
    app = create_app(settings)
    enable_socket_mode(app)
    mode = app[routes.SLACK_MODE]
    log.info(
        "serving on port %d (Slack: %s%s; viewer at %s/d/...)",
        settings.port,
        mode,
        f", events at {EVENTS_PATH}" if mode == "http" else "",
        settings.link_base_url,
    )
    web.run_app(app, port=settings.port, print=None, access_log_class=routes.AccessLogger)
