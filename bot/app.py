"""The bot's one server process: the web server with the Slack surface attached.

``create_app(settings)`` opens the knowledge base and the engine once (the
embedding model loads once), serves the document viewer and the health checks
(``bot.server``) and attaches Slack (``bot.slack``): HTTP events at
``/slack/events``, or Socket Mode when ``SLACK_APP_TOKEN`` is set (no public
URL needed). Without Slack credentials the viewer and health checks still run
and the log says which settings are missing. A background task follows the
database, so what other processes commit (``kb ingest``, ``kb rm``,
``kb reindex``, another replica) is searchable within ``KB_SYNC_SECONDS`` plus
one refresh, and documents another process moved to another embedding model
are searched on that model (``core.switch``); another takes over the uploads a dead replica left unfinished
(``KB_UPLOAD_SWEEP_SECONDS``, and at start-up), and a third the canvases of
``KB_CANVAS_CHANNELS`` (``KB_CANVAS_SYNC_SECONDS``, ``bot.slack.canvases``). With ``KB_VIEWER_AUTH=slack`` the
viewer opens documents only for people signed in with Slack
(``bot.slack.people.signin``). With ``KB_MCP=on`` agents reach the knowledge
base as MCP tools at ``/mcp`` (``bot.mcp``). Whether the document readers are
confined (``KB_READER_SANDBOX``) is logged at start and kept in ``/readyz``.
With ``KB_SOURCE_SYNC_MINUTES`` above 0 another syncs each source
(``kb source add``) that often, one replica at a time; each source's state is
in ``/readyz``. ``run_server(settings)`` runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from slack_sdk.web.async_client import AsyncWebClient

from bot import mcp
from bot.access import Access, SourceGrants, slack_access
from bot.server import bodies, connections, routes
from bot.settings import Settings
from bot.slack import app as slack
from bot.slack.people import signin
from bot.slack.services import Services
from bot.slack.slackbot import SlackbotBlocks
from core.answer import Engine, build_engine
from core.rerank import RerankerUnavailable
from core.switch import ModelSwitch
from index.errors import KBError
from index.ingest import readers_status
from index.knowledge_base import KnowledgeBase
from index.sources import sync_due_sources

log = logging.getLogger(__name__)

__all__ = ["SERVICES", "create_app", "run_server"]

SERVICES = web.AppKey("services", Services)
SLACK_MODE = web.AppKey("slack_mode", str)
SYNC_SECONDS = web.AppKey("sync_seconds", float)
MODEL_SWITCH = web.AppKey("model_switch", ModelSwitch)
# Seconds between two syncs of each source (0: none), and each kind's token.
# Every how many seconds, with which tokens, and in how long one file's download.
SOURCE_SCHEDULE: web.AppKey[tuple[float, dict[str, str], float]] = web.AppKey("source_schedule")
# How often a replica looks for a source that is due, whatever the schedule.
SOURCE_LOOK_SECONDS = 60.0
# Readiness tolerates the snapshot trailing the database this many sync rounds
# (at least routes.DEFAULT_MAX_BEHIND_SECONDS): a slow refresh is not an outage.
BEHIND_ROUNDS = 10
# On shutdown, uploads being indexed get this long to finish before they are cancelled.
SHUTDOWN_GRACE_SECONDS = 30.0


def create_app(
    settings: Settings,
    *,
    engine: Engine | None = None,
    kb: KnowledgeBase | None = None,
    slack_client: AsyncWebClient | None = None,
) -> web.Application:
    """Build the aiohttp application serving Slack events, the viewer and health checks.

    Args:
        settings: the product settings; each part gets its own configuration from them.
        engine: an opened engine (tests share one); built from ``settings`` otherwise.
        kb: an opened knowledge base; the engine's, or opened from ``settings``.
        slack_client: the Web API client; by default one for ``SLACK_BOT_TOKEN``
            at ``SLACK_API_URL``.

    Returns:
        The application; run it with ``web.run_app`` or a test client.
    """
    # The server's own knowledge base fits its query map in the background: a write
    # (an upload, a sync) and the start return once the passages are searchable.
    kb = kb or (
        engine.kb
        if engine is not None
        else KnowledgeBase(settings.index_config(), fit_in_background=True)
    )
    engine = engine or build_engine(settings.engine_config(kb.config.embedding_model), kb)
    slack_config = settings.slack_config()
    # Who may read what, one rule and one membership cache for every surface.
    access = slack_access(
        settings.access_config(), slack_client, SourceGrants(kb.store), kb.store.people_heard
    )
    # One switch of the embedding model: a /kb-reindex that moves it, or the store moved.
    switch = ModelSwitch(engine, settings.engine_config)
    services = Services.open(slack_config, kb, engine, access, switch=switch)
    # Each route's own body size is bodies.limit_body's; this is the one for the rest.
    app = web.Application(middlewares=routes.MIDDLEWARES, client_max_size=bodies.DEFAULT_MAX_BODY)
    bodies.setup(app, settings.http_limits())
    app[routes.KB] = kb
    app[routes.ENGINE] = engine
    app[SERVICES] = services
    routes.setup(app)
    if settings.viewer_auth == "slack":
        signin.attach(app, settings.signin_config(), slack_config, engine.signer, access)
    routes.add_readiness_info(app, "viewer_auth", settings.viewer_auth)
    app[SYNC_SECONDS] = settings.sync_seconds
    app[MODEL_SWITCH] = switch
    app[SOURCE_SCHEDULE] = (
        settings.source_sync_minutes * 60,
        settings.source_tokens(),
        settings.download_timeout,
    )
    routes.set_max_behind(
        app, max(routes.DEFAULT_MAX_BEHIND_SECONDS, BEHIND_ROUNDS * settings.sync_seconds)
    )
    app[SLACK_MODE] = slack.attach(app, slack_config, services, slack_client)
    if settings.mcp:
        blocks = SlackbotBlocks(slack_client or slack.web_client(slack_config), services.languages)
        _attach_mcp(app, settings, engine, access, blocks)
    routes.add_readiness_info(app, "mcp", settings.mcp)
    _report_readers(app, settings.reader_sandbox)
    app.cleanup_ctx.append(_services_ctx)
    return app


def _report_readers(app: web.Application, mode: str) -> None:
    """Say once, at start, what a parser exploit in a document reader could reach;
    ``/readyz`` keeps saying it (``reader_sandbox``)."""
    facts = readers_status(mode)
    routes.add_readiness_info(app, "reader_sandbox", facts)
    if facts["confined"]:
        log.info("%s", facts["summary"])
    elif mode == "required":
        log.error("%s", facts["summary"])
    else:
        log.warning("%s", facts["summary"])


def _attach_mcp(
    app: web.Application,
    settings: Settings,
    engine: Engine,
    access: Access,
    blocks: SlackbotBlocks,
) -> None:
    """Serve the MCP endpoint (``KB_MCP=on``); the caller's channels are asked of Slack,
    and Slackbot is shown the Slack surface's own blocks (``blocks``)."""
    config = mcp.McpConfig(
        calls_per_minute=settings.mcp_calls_per_minute,
        slack_signing_secret=(
            settings.slack_signing_secret.get_secret_value() if settings.mcp_slack_identity else ""
        ),
    )
    # Without a bot token nobody can say who is in a channel (or a Slack person's workspace).
    people = access if access.directory is not None else None
    mcp.attach(app, engine, config, people, blocks)
    log.info(
        "MCP server at %s (callers' channels %s)",
        mcp.MCP_PATH,
        "asked of Slack" if people else "unknown without SLACK_BOT_TOKEN: documents for everyone",
    )


async def _services_ctx(app: web.Application) -> AsyncIterator[None]:
    services = app[SERVICES]
    await services.uploader.start()
    # Load (or rebuild) the search snapshot now rather than on the first question.
    await asyncio.to_thread(services.kb.search_index.open)
    await asyncio.to_thread(load_embedding_model, services.kb)
    await asyncio.to_thread(load_reranker, services.engine)
    # A knowledge base from before query maps, or changed by a tool that fits none
    # (with ``fit_in_background``, fitted after the server is ready). Asked once the
    # models are loaded: the fit encodes with the loaded model, not a second copy,
    # and a start that failed loading them leaves no fit running.
    await asyncio.to_thread(services.kb.query_adapters.refit_if_due)
    following = follow_store(services.kb, app[SYNC_SECONDS], app[MODEL_SWITCH])
    loops = [asyncio.create_task(following, name="follow-store")]
    every, tokens, download_seconds = app[SOURCE_SCHEDULE]
    if every > 0:
        syncing = keep_sources_synced(services.kb, tokens, every, download_seconds)
        loops.append(asyncio.create_task(syncing, name="sync-sources"))
    bolt = app.get(slack.BOLT)
    if bolt is not None:
        # Uploads a replica that died (this one, before a restart) left unfinished.
        sweep = services.uploader.keep_taking_over(bolt.client, services.config.upload_sweep)
        loops.append(asyncio.create_task(sweep, name="take-over-uploads"))
        canvases, every = services.canvases, services.config.canvas_sync
        if canvases.channels and every > 0:
            # The canvases of KB_CANVAS_CHANNELS, now and every KB_CANVAS_SYNC_SECONDS.
            poll = canvases.keep_syncing(bolt.client, every)
            loops.append(asyncio.create_task(poll, name="sync-canvases"))
    yield
    # A fit under way must not hold the process past its stop: given up, written never.
    services.kb.stop_fitting()
    for loop in loops:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
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


def load_embedding_model(kb: KnowledgeBase) -> bool:
    """Load the embedding model at start; whether it is ready.

    A snapshot loaded from its files needs no model, so without this a replica
    behind a load balancer that waits for ``/readyz`` would never get the first
    question that loads it. One that cannot load (an endpoint that is down) is
    logged, and ``/readyz`` says so until a question loads it.
    """
    if kb.embedder.loaded:
        return True
    try:
        kb.embedder.encode_query("warm up")
    except KBError as exc:
        log.warning("embedding model not loaded at start; questions will try again: %s", exc)
        return False
    return True


def load_reranker(engine: Engine) -> bool:
    """Load a configured reranker at start, not on the first answer; whether one is ready.

    One that cannot load is logged, and answers keep the fused order.
    """
    if engine.reranker is None:
        return False
    try:
        engine.reranker.load()
    except RerankerUnavailable as exc:
        log.warning("reranker not loaded; answers keep the fused order: %s", exc)
        return False
    return True


async def follow_store(kb: KnowledgeBase, every: float, switch: ModelSwitch | None = None) -> None:
    """Keep the search snapshot at the database's generation, whichever process changed it.

    A round costs one ``SELECT`` of the generation counter when nothing moved,
    and an incremental refresh when something did; then, with a ``switch``, one
    read of the documents' model stamps: when another process moved them to
    another model, the server moves to it (``core.switch``). A failing round
    leaves the last snapshot answering; ``/readyz`` turns 503 once it trails too long.
    """
    failing = False
    seen: int | None = None
    while True:
        await asyncio.sleep(every)
        try:
            generation = await asyncio.to_thread(kb.search_index.sync)
            moved = generation != seen or kb.unfollowed is not None
            # While this process switches itself (/kb-reindex), ask again next round.
            if switch is not None and moved and not switch.busy:
                await switch.follow()
                seen = generation
        except Exception:  # the next round may succeed: keep following
            if not failing:
                log.warning(
                    "cannot bring the search index up to the database; answering from the "
                    "last snapshot, /readyz turns 503 if this lasts",
                    exc_info=True,
                )
            failing = True
        else:
            if failing:
                log.info("search index caught up with the database again")
            failing = False


async def keep_sources_synced(
    kb: KnowledgeBase, tokens: dict[str, str], every: float, download_seconds: float
) -> None:
    """Sync each source once it is ``every`` seconds past its last run (``sync_due_sources``),
    each file's download within ``download_seconds``.

    Every replica looks; the store says what is due and its lock lets one
    replica sync a source at a time. A failing round is logged and the next
    one tried: a source's failure is recorded on it (``/readyz``, ``kb source list``).
    """
    while True:
        try:
            await asyncio.to_thread(
                sync_due_sources, kb, tokens, every, download_seconds=download_seconds
            )
        except Exception:  # the next round may succeed: keep syncing
            log.warning("a round of source syncs failed; trying again later", exc_info=True)
        await asyncio.sleep(min(every, SOURCE_LOOK_SECONDS))


def run_server(settings: Settings) -> None:
    """Serve until interrupted: Slack (Socket Mode or HTTP events), the viewer and health checks.

    Every client is held to ``settings.http_limits()``: the connections by
    ``bot.server.connections`` (a cap, the request head's deadline), bodies by
    ``bot.server.bodies`` (the same on every route, Socket Mode or not).
    """
    app = create_app(settings)
    slack.enable_socket_mode(app)
    mode = app[SLACK_MODE]
    log.info(
        "serving on port %d (Slack: %s%s; viewer at %s/d/...)",
        settings.port,
        mode,
        f", events at {slack.EVENTS_PATH}" if mode == "http" else "",
        settings.link_base_url,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            connections.serve(
                app,
                limits=app[bodies.LIMITS],
                faults=app[bodies.FAULTS],
                port=settings.port,
                access_log_class=routes.AccessLogger,
            )
        )
