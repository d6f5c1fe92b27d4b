"""Thin Slack handlers: they read the payload and hand it to the conversation or the knowledge base.

Registered on a bolt ``AsyncApp`` by :func:`register`:

* questions: ``app_mention`` (answered in the thread), direct messages, and
  follow-ups in a thread the bot already answered in, each turned into a
  ``bot.conversation.Turn`` and answered through a ``SlackReply``;
* ``/kb-upload`` (a modal with a file input), its submission, files shared with
  the bot in a DM, and the Retry button of a failed file; who sent them decides
  how they may become searchable (``bot.slack.roles``);
* the Approve and Reject buttons of approval requests (``bot.slack.approvals``);
* ``/kb-reindex`` for admins;
* feedback buttons under answers, and "Ask a person" (``bot.slack.escalation``);
* agent messaging: the Messages tab opened, the channel a person views, and
  the older assistant pane's threads (``bot.slack.agent``);
* the Home tab opened, and its buttons (``bot.slack.home``);
* one global middleware that drops Slack's redeliveries to this process at
  once, while the shared database's record of them is written after the
  acknowledgement (``bot.slack.deliveries``), and one error handler.

Synchronous knowledge-base calls run in threads (``asyncio.to_thread``) so the
event loop keeps acknowledging Slack within its 3 seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

from bot.conversation import Conversation, Turn
from bot.slack import messages
from bot.slack.agent import Agent
from bot.slack.approvals import Approvals
from bot.slack.audience import Audience, Place
from bot.slack.config import SlackConfig
from bot.slack.deliveries import DELIVERY_KEYS, Deliveries, delivery_keys
from bot.slack.directory import Directory
from bot.slack.escalation import register_escalation
from bot.slack.home import Home, register_home
from bot.slack.reindex import Reindexer
from bot.slack.render import (
    APPROVE_ACTION_ID,
    FEEDBACK_ACTION_ID,
    REJECT_ACTION_ID,
    RETRY_ACTION_ID,
    UPLOAD_CALLBACK_ID,
    UPLOAD_FILES_BLOCK,
    UPLOAD_TITLE_BLOCK,
    UPLOAD_VISIBILITY_BLOCK,
    VISIBILITY_CHANNEL,
    parse_feedback_value,
    render_notice,
    upload_modal,
)
from bot.slack.reply import REPLY_KEY, SlackReply, Streaming, stop_stream
from bot.slack.roles import Roles
from bot.slack.thread import SlackThread
from bot.slack.uploads import Jobs, StatusMessage, Uploader, UploadRequest
from core.answer import Asker, Engine
from index.embed import EmbeddingModelUnavailable
from index.errors import KBError
from index.knowledge_base import KnowledgeBase
from index.search.derived import OnlyScopes
from index.storage.store import EVERYONE

log = logging.getLogger(__name__)

__all__ = ["Services", "register", "strip_mention"]


_MENTION_RE = re.compile(r"<@[UW][A-Z0-9]+(?:\|[^>]*)?>")


# ---------------------------------------------------------------- services


@dataclass
class Services:
    """What the handlers need, opened once per process."""

    config: SlackConfig
    kb: KnowledgeBase
    engine: Engine
    jobs: Jobs
    uploader: Uploader
    roles: Roles
    approvals: Approvals
    reindexer: Reindexer
    conversation: Conversation
    audience: Audience
    agent: Agent
    # Delivery records decide whether an event is answered at all: their own
    # threads, so they never queue behind embedding and retrieval work.
    ack_executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=2, thread_name_prefix="kb-ack")
    )
    deliveries: Deliveries = field(init=False)
    home: Home = field(init=False)
    streaming: Streaming = field(default_factory=Streaming)

    def __post_init__(self) -> None:
        self.deliveries = Deliveries(self.kb.store, self.ack_executor, self.config.claim_lease)
        self.home = Home(self.kb, self.engine, self.roles, self.uploader, self.reindexer)

    @classmethod
    def open(cls, config: SlackConfig, kb: KnowledgeBase, engine: Engine) -> Services:
        """Wire the services around an opened knowledge base and engine."""
        jobs = Jobs()
        directory = Directory()
        roles = Roles(config, directory)
        approvals = Approvals(kb, config, roles, engine)
        return cls(
            config=config,
            kb=kb,
            engine=engine,
            jobs=jobs,
            uploader=Uploader(kb, config, jobs, approvals),
            roles=roles,
            approvals=approvals,
            reindexer=Reindexer(kb),
            conversation=Conversation(engine),
            audience=Audience(config, directory),
            agent=Agent(kb, directory),
            streaming=Streaming(config.streaming),
        )


# ---------------------------------------------------------------- helpers


def strip_mention(text: str, bot_user_id: str | None) -> str:
    """The question without the bot's mention (any mention when the bot's id is unknown)."""
    if bot_user_id:
        text = re.sub(rf"<@{re.escape(bot_user_id)}(?:\|[^>]*)?>", " ", text)
    else:
        text = _MENTION_RE.sub(" ", text, count=1)
    return " ".join(text.split())


# ---------------------------------------------------------------- registration


def register(app: AsyncApp, services: Services) -> None:
    """Attach the middleware, listeners and error handler to ``app``."""
    _register_dedupe(app, services)
    _register_questions(app, services)
    _register_agent(app, services)
    register_home(app, services)
    _register_uploads(app, services)
    _register_approvals(app, services)
    _register_reindex(app, services)
    _register_feedback(app, services)
    register_escalation(app, services)
    _register_errors(app)


def _register_dedupe(app: AsyncApp, services: Services) -> None:
    @app.middleware
    async def drop_redeliveries(
        body: dict[str, Any], context: AsyncBoltContext, next: Callable[[], Awaitable[None]]
    ) -> BoltResponse | None:
        # Runs before bolt acknowledges: memory only, never the database.
        keys = delivery_keys(body)
        if keys and not services.deliveries.first_here(keys):
            log.info("dropping a redelivered Slack event (%s)", ", ".join(keys))
            # An empty 200: returning without next() makes bolt answer 404, and Slack retries again.
            return BoltResponse(status=200, body="")
        context[DELIVERY_KEYS] = keys
        await next()
        return None


async def _claimed(services: Services, context: AsyncBoltContext) -> bool:
    """Whether this process answers the event (after the ack: another replica may have it)."""
    keys = list(context.get(DELIVERY_KEYS) or [])
    if await services.deliveries.claim(keys):
        return True
    log.info("another process handles Slack event %s", ", ".join(keys))
    return False


def _register_questions(app: AsyncApp, services: Services) -> None:
    @app.event("app_mention")
    async def on_mention(
        body: dict[str, Any],
        event: dict[str, Any],
        context: AsyncBoltContext,
        client: AsyncWebClient,
    ) -> None:
        if not await _claimed(services, context):
            return
        scopes = frozenset({str(event["channel"])})
        await _answer(services, client, context, body, event, scopes=scopes)

    @app.event("message")
    async def on_message(
        body: dict[str, Any],
        event: dict[str, Any],
        context: AsyncBoltContext,
        client: AsyncWebClient,
    ) -> None:
        if not _from_a_person(event, context):
            return
        subtype = event.get("subtype")
        direct = event.get("channel_type") == "im"
        if subtype == "file_share":
            claimed = direct and await _claimed(services, context)
            if claimed and await _place(services, client, body, event):
                await _ingest_shared_files(services, client, event)
            return
        if not direct and not await _is_follow_up(services, context, event):
            return
        if not await _claimed(services, context):
            return
        if direct:
            # The DM's own documents are everyone's, plus those of a channel the asker views.
            scopes = await services.agent.dm_scopes(client, event)
        else:
            scopes = frozenset({str(event["channel"])})
        await _answer(services, client, context, body, event, scopes=scopes)


# A person writing: a plain message, files with one, or a thread reply also sent to the
# channel. Every other subtype (edits, deletions, joins, other apps) is not a question.
_PERSON_SUBTYPES = (None, "file_share", "thread_broadcast")


def _from_a_person(event: dict[str, Any], context: AsyncBoltContext) -> bool:
    """Whether a message event is a person's own new message (never this bot's or another app's)."""
    if event.get("subtype") not in _PERSON_SUBTYPES or event.get("bot_id"):
        return False
    user = event.get("user")
    return bool(user) and user != context.bot_user_id


async def _is_follow_up(
    services: Services, context: AsyncBoltContext, event: dict[str, Any]
) -> bool:
    """A channel message is a question only as a reply in a thread the bot answers in."""
    thread_ts = event.get("thread_ts")
    if not thread_ts:
        return False
    if _mentions_the_bot(event, context):
        # Slack sends this message as app_mention too, and that event answers it:
        # it arrives whether or not the bot answered in the thread, and even for
        # an app installed without the channel message events.
        return False
    if _MENTION_RE.search(str(event.get("text", ""))):
        return False  # addressed to someone else: people talking, the bot stays out
    return await asyncio.to_thread(
        services.kb.store.answered_in_thread, str(event["channel"]), str(thread_ts)
    )


def _mentions_the_bot(event: dict[str, Any], context: AsyncBoltContext) -> bool:
    text = str(event.get("text", ""))
    if context.bot_user_id:
        return f"<@{context.bot_user_id}>" in text or f"<@{context.bot_user_id}|" in text
    # Without the bot's id, any mention may be it: a missed follow-up beats a double answer.
    return _MENTION_RE.search(text) is not None


async def _place(
    services: Services, client: AsyncWebClient, body: dict[str, Any], event: dict[str, Any]
) -> Place | None:
    """Where ``event`` happened, or ``None`` (after telling the person) when it is not served."""
    place = await services.audience.place(client, body, event)
    if services.audience.serves(place):
        return place
    log.info("not serving %s: a person of another organisation", event.get("user"))
    notice = render_notice(messages.EXTERNAL_ASKER)
    thread_ts = str(event.get("thread_ts") or event["ts"])
    await client.chat_postMessage(
        channel=str(event["channel"]), thread_ts=thread_ts, **notice.as_kwargs()
    )
    return None


async def _answer(
    services: Services,
    client: AsyncWebClient,
    context: AsyncBoltContext,
    body: dict[str, Any],
    event: dict[str, Any],
    *,
    scopes: frozenset[str],
) -> None:
    place = await _place(services, client, body, event)
    if place is None:
        return
    note = None
    if services.audience.channel_only(place):
        # Everyone in the channel reads the answer, people of other organisations included.
        scopes, note = OnlyScopes(scopes), messages.SHARED_CHANNEL_NOTE
    channel = str(event["channel"])
    thread_ts = str(event.get("thread_ts") or event["ts"])
    in_thread = bool(event.get("thread_ts"))
    thread = SlackThread(
        client,
        channel=channel,
        thread_ts=thread_ts,
        before=str(event["ts"]),
        bot_user_id=context.bot_user_id,
        bot_id=context.bot_id,
    )
    turn = Turn(
        question=strip_mention(str(event.get("text", "")), context.bot_user_id),
        scopes=scopes,
        asker=Asker(user=event.get("user"), channel=channel, thread_id=thread_ts),
        follow_up=in_thread,
        thread=thread if in_thread else None,
    )
    reply = SlackReply(
        client,
        context,
        channel=channel,
        thread_ts=thread_ts,
        note=note,
        streaming=services.streaming,
        recipient_user_id=event.get("user"),
        recipient_team_id=event.get("user_team") or event.get("team") or body.get("team_id"),
        ask_a_person=bool(services.config.escalation_channel),
    )
    await services.conversation.answer(turn, reply)


# ---------------------------------------------------------------- uploads


def _register_uploads(app: AsyncApp, services: Services) -> None:
    @app.command("/kb-upload")
    async def on_upload_command(
        ack: Callable[..., Awaitable[None]], body: dict[str, Any], client: AsyncWebClient
    ) -> None:
        await ack()
        # trigger_id expires 3 s after the command: open the modal before anything else.
        channel = str(body.get("channel_id", ""))
        view = upload_modal(
            json.dumps({"channel": channel}), channel_scope_allowed=_is_channel(channel)
        )
        await client.views_open(trigger_id=body["trigger_id"], view=view)

    @app.view(UPLOAD_CALLBACK_ID)
    async def on_upload_submit(
        ack: Callable[..., Awaitable[None]],
        body: dict[str, Any],
        view: dict[str, Any],
        client: AsyncWebClient,
    ) -> None:
        values = view.get("state", {}).get("values", {})
        files = _input(values, UPLOAD_FILES_BLOCK).get("files") or []
        if not files:
            await ack(
                response_action="errors", errors={UPLOAD_FILES_BLOCK: messages.UPLOAD_NO_FILE}
            )
            return
        if not services.audience.serves_submitter(body):
            await ack(
                response_action="errors", errors={UPLOAD_FILES_BLOCK: messages.EXTERNAL_ASKER}
            )
            return
        await ack()
        user = str(body["user"]["id"])
        channel = _metadata_channel(view.get("private_metadata", ""))
        choice = (_input(values, UPLOAD_VISIBILITY_BLOCK).get("selected_option") or {}).get("value")
        scope = channel if choice == VISIBILITY_CHANNEL and _is_channel(channel) else EVERYONE
        title = (_input(values, UPLOAD_TITLE_BLOCK).get("value") or "").strip() or None
        publish = await services.roles.publish_mode(client, user, scope)
        request = UploadRequest(
            channel=channel or user, user=user, scope=scope, publish=publish, title=title
        )
        await services.uploader.ingest(client, list(files), request)

    @app.action(RETRY_ACTION_ID)
    async def on_retry(
        ack: Callable[..., Awaitable[None]],
        body: dict[str, Any],
        action: dict[str, Any],
        client: AsyncWebClient,
        respond: Callable[..., Awaitable[Any]],
    ) -> None:
        await ack()
        container = body.get("container") or {}
        if not (container.get("channel_id") and container.get("message_ts")):
            log.warning("ignoring a Retry that names no status message")
            return
        status = StatusMessage(
            client,
            str(container["channel_id"]),
            str(container["message_ts"]),
            thread_ts=container.get("thread_ts"),
        )
        value = str(action.get("value", ""))
        if not (value.isascii() and value.isdigit() and len(value) < 19):
            log.warning("ignoring a Retry with a malformed value %r", value[:40])
            return
        user = str((body.get("user") or {}).get("id", ""))
        if not await _may_retry(services, client, user, int(value)):
            # The value is the clicker's to forge: a document's name is not shown to just anyone.
            log.warning("%s may not retry document %s", user, value)
            await respond(
                text=messages.RETRY_NOT_YOURS, response_type="ephemeral", replace_original=False
            )
            return
        await services.uploader.retry(status, int(value))


async def _may_retry(services: Services, client: AsyncWebClient, user: str, doc_id: int) -> bool:
    """Its uploader or an admin may retry a document (one that is gone: anyone, to be told so)."""
    try:
        doc = await asyncio.to_thread(services.kb.store.document, doc_id)
    except KBError:
        return True
    return bool(user) and (doc.uploader == user or await services.roles.is_admin(client, user))


async def _ingest_shared_files(
    services: Services, client: AsyncWebClient, event: dict[str, Any]
) -> None:
    """Files sent to the bot in a DM: for everyone (after an approval, unless a publisher
    sent them); statuses go in the DM thread."""
    user = str(event.get("user", ""))
    request = UploadRequest(
        channel=str(event["channel"]),
        user=user,
        scope=EVERYONE,
        publish=await services.roles.publish_mode(client, user, EVERYONE),
        thread_ts=str(event.get("thread_ts") or event["ts"]),
    )
    await services.uploader.ingest(client, list(event.get("files") or []), request)


def _input(values: dict[str, Any], block_id: str) -> dict[str, Any]:
    return dict(values.get(block_id, {}).get(block_id, {}))


def _is_channel(channel: str) -> bool:
    # A DM (D...) has no audience to scope a document to.
    return bool(channel) and not channel.startswith("D")


def _metadata_channel(raw: str) -> str:
    try:
        data = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):  # deep nesting exhausts the decoder's stack
        return ""
    return str(data.get("channel", "")) if isinstance(data, dict) else ""


# ---------------------------------------------------------------- approvals


def _register_approvals(app: AsyncApp, services: Services) -> None:
    async def decide(
        ack: Callable[..., Awaitable[None]],
        body: dict[str, Any],
        action: dict[str, Any],
        client: AsyncWebClient,
        *,
        approve: bool,
    ) -> None:
        await ack()
        value = str(action.get("value", ""))
        await services.approvals.decide(client, body, value, approve=approve)

    @app.action(APPROVE_ACTION_ID)
    async def on_approve(
        ack: Callable[..., Awaitable[None]],
        body: dict[str, Any],
        action: dict[str, Any],
        client: AsyncWebClient,
    ) -> None:
        await decide(ack, body, action, client, approve=True)

    @app.action(REJECT_ACTION_ID)
    async def on_reject(
        ack: Callable[..., Awaitable[None]],
        body: dict[str, Any],
        action: dict[str, Any],
        client: AsyncWebClient,
    ) -> None:
        await decide(ack, body, action, client, approve=False)


# ---------------------------------------------------------------- reindex


def _register_reindex(app: AsyncApp, services: Services) -> None:
    @app.command("/kb-reindex")
    async def on_reindex(
        ack: Callable[..., Awaitable[None]],
        body: dict[str, Any],
        client: AsyncWebClient,
        respond: Callable[..., Awaitable[Any]],
    ) -> None:
        user = str(body.get("user_id", ""))
        if not await services.roles.is_admin(client, user):
            await ack(text=messages.REINDEX_NOT_ADMIN)
            return
        if not await services.reindexer.claim():
            await ack(text=messages.REINDEX_RUNNING)
            return
        await ack(text=messages.REINDEX_STARTED)

        async def report(text: str) -> None:
            await respond(text=text, response_type="ephemeral", replace_original=True)

        await services.reindexer.run(report, actor=user)


# ---------------------------------------------------------------- feedback


def _register_feedback(app: AsyncApp, services: Services) -> None:
    @app.action(FEEDBACK_ACTION_ID)
    async def on_feedback(
        ack: Callable[..., Awaitable[None]],
        body: dict[str, Any],
        action: dict[str, Any],
        respond: Callable[..., Awaitable[Any]],
    ) -> None:
        await ack()
        parsed = parse_feedback_value(str(action.get("value", "")))
        if parsed is None:
            log.warning("ignoring feedback with a malformed value %r", action.get("value"))
            return
        query_id, value = parsed
        try:
            await asyncio.to_thread(
                services.kb.store.add_feedback, query_id, value, body["user"]["id"]
            )
        except KBError:
            await respond(
                text=messages.FEEDBACK_UNKNOWN, response_type="ephemeral", replace_original=False
            )
            return
        thanks = (
            messages.FEEDBACK_THANKS_POSITIVE if value > 0 else messages.FEEDBACK_THANKS_NEGATIVE
        )
        await respond(text=thanks, response_type="ephemeral", replace_original=False)


# ---------------------------------------------------------------- agent messaging


def _register_agent(app: AsyncApp, services: Services) -> None:
    @app.event("app_home_opened")
    async def on_home_opened(
        event: dict[str, Any],
        body: dict[str, Any],
        context: AsyncBoltContext,
        client: AsyncWebClient,
    ) -> None:
        tab = event.get("tab")
        if tab not in ("messages", "home") or not await _claimed(services, context):
            return
        if not await _serves(services, client, body, event.get("user")):
            # Slack Connect: prompts and counts would tell another organisation what is here.
            if tab == "home":
                await services.home.publish_external(client, str(event.get("user", "")))
            return
        if tab == "home":
            await services.home.publish(client, str(event.get("user", "")))
            return
        await services.agent.messages_tab_opened(client, event)

    @app.event("app_context_changed")
    async def on_context_changed(event: dict[str, Any]) -> None:
        services.agent.context_changed(event)

    # Apps still on the assistant view (features.assistant_view).
    @app.event("assistant_thread_started")
    async def on_assistant_thread(
        event: dict[str, Any],
        body: dict[str, Any],
        context: AsyncBoltContext,
        client: AsyncWebClient,
    ) -> None:
        thread = event.get("assistant_thread") or {}
        if not await _claimed(services, context):
            return
        if await _serves(services, client, body, thread.get("user_id")):
            await services.agent.assistant_thread_started(client, thread)

    @app.event("assistant_thread_context_changed")
    async def on_assistant_context(event: dict[str, Any]) -> None:
        services.agent.assistant_context_changed(event.get("assistant_thread") or {})


async def _serves(
    services: Services, client: AsyncWebClient, body: dict[str, Any], user: Any
) -> bool:
    """Whether ``user``, who opened one of the app's tabs, is one the bot serves."""
    if not isinstance(user, str) or not user:
        return False
    place = await services.audience.place(client, body, {"user": user})
    return services.audience.serves(place)


# ---------------------------------------------------------------- errors


def _register_errors(app: AsyncApp) -> None:
    @app.error
    async def on_error(
        error: Exception,
        body: dict[str, Any],
        context: AsyncBoltContext,
        client: AsyncWebClient,
        respond: Callable[..., Awaitable[Any]] | None,
    ) -> None:
        log.error("Slack listener failed: %s", error, exc_info=error)
        try:
            await _tell_user(body, context, client, respond, _failure_text(error))
        except Exception:  # the person is unreachable; the log has the cause
            log.exception("could not tell the user about the failure")


def _failure_text(error: Exception) -> str:
    """What the person is told: the cause when it is one they can wait out, never a trace."""
    if isinstance(error, EmbeddingModelUnavailable):
        return messages.ERROR_SEARCH_UNAVAILABLE
    return messages.ERROR_GENERIC


async def _tell_user(
    body: dict[str, Any],
    context: AsyncBoltContext,
    client: AsyncWebClient,
    respond: Callable[..., Awaitable[Any]] | None,
    text: str = messages.ERROR_GENERIC,
) -> None:
    """Reply with a friendly message where the failed request came from (never a trace)."""
    notice = render_notice(text)
    reply = context.get(REPLY_KEY)
    if reply:
        if reply.get("stream"):
            await stop_stream(client, reply["channel"], reply["ts"])
        await client.chat_update(channel=reply["channel"], ts=reply["ts"], **notice.as_kwargs())
        return
    event = body.get("event") or {}
    if event.get("channel") and event.get("ts"):
        thread_ts = event.get("thread_ts") or event["ts"]
        await client.chat_postMessage(
            channel=event["channel"], thread_ts=thread_ts, **notice.as_kwargs()
        )
        return
    if respond is not None and context.response_url:
        await respond(text=text, response_type="ephemeral", replace_original=False)
