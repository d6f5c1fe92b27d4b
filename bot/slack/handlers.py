"""Every Slack listener of the app, registered in one place: each reads the payload and hands it on.

Registered on a bolt ``AsyncApp`` by :func:`register`, with the ``Services`` of
``bot.slack.services``:

* questions: ``app_mention`` (answered in the thread), direct messages, and
  follow-ups in a thread the bot already answered in, each turned into a
  ``bot.conversation.Turn`` and answered through a ``SlackReply``;
* ``/kb-upload`` (a modal with a file input), its submission, files shared with
  the bot in a DM, and the Retry button of a failed file; who sent them decides
  how they may become searchable (``bot.slack.people.roles``);
* the Approve and Reject buttons of approval requests (``bot.slack.approvals``);
* ``/kb-reindex`` for admins;
* feedback buttons under answers (``bot.slack.feedback``), and "Ask a person"
  (``bot.slack.escalation``);
* agent messaging: the Messages tab opened, the channel a person views, and
  the older assistant pane's threads (``bot.slack.agent``); the Stop button of
  an agent session (``agent_session_stopped``: ``bot.slack.sessions``);
* the Home tab opened, and its buttons (``bot.slack.home``);
* passage links posted in a conversation, shown as Work Objects, and their
  flexpane (``link_shared``, ``entity_details_requested``: ``bot.slack.unfurls``);
* a canvas of a synced channel changed, deleted, shared or unshared
  (``file_change``, ``file_deleted``, ``file_shared``, ``file_unshared``:
  ``bot.slack.canvases``);
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
from collections.abc import Awaitable, Callable
from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import escalation, feedback, questions, unfurls
from bot.slack.blocks import (
    APPROVE_ACTION_ID,
    ASK_A_PERSON_ACTION_ID,
    FEEDBACK_ACTION_ID,
    HOME_PAGE_ACTION_RE,
    HOME_REFRESH_ACTION_ID,
    HOME_REINDEX_ACTION_ID,
    HOME_RETRY_ACTION_ID,
    OPEN_VIEWER_ACTION_ID,
    REJECT_ACTION_ID,
    RETRY_ACTION_ID,
    UPLOAD_CALLBACK_ID,
    UPLOAD_FILES_BLOCK,
    UPLOAD_TITLE_BLOCK,
    UPLOAD_VISIBILITY_BLOCK,
    VISIBILITY_CHANNEL,
    Pages,
    render_notice,
    upload_modal,
)
from bot.slack.deliveries import CLAIM, DELIVERY_KEYS, Claim, delivery_keys
from bot.slack.reply import REPLY_KEY, set_session_active, stop_stream
from bot.slack.services import Services
from bot.slack.sessions import Stop, stop_request
from bot.slack.uploads import StatusMessage, UploadRequest
from bot.slack.words import WORDS_KEY, Words
from index.embed import EmbeddingModelUnavailable
from index.errors import KBError
from index.models import EVERYONE
from index.storage import STATUS

log = logging.getLogger(__name__)

__all__ = ["register"]


def register(app: AsyncApp, services: Services) -> None:
    """Attach the middleware, listeners and error handler to ``app``."""
    _register_dedupe(app, services)
    _register_questions(app, services)
    _register_agent(app, services)
    _register_home(app, services)
    _register_uploads(app, services)
    _register_approvals(app, services)
    _register_reindex(app, services)
    _register_feedback(app, services)
    _register_escalation(app, services)
    _register_unfurls(app, services)
    _register_canvases(app, services)
    _register_people(app, services)
    _register_errors(app, services)


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
    """Whether this process answers the event (after the ack: another replica may have it).

    The claim won is in ``context[CLAIM]``, for work that outlives the listener (an upload).
    """
    keys = list(context.get(DELIVERY_KEYS) or [])
    claim = await services.deliveries.claim(keys)
    if claim is not None:
        context[CLAIM] = claim
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
        await questions.answer(services, client, context, body, event)

    @app.event("message")
    async def on_message(
        body: dict[str, Any],
        event: dict[str, Any],
        context: AsyncBoltContext,
        client: AsyncWebClient,
    ) -> None:
        if not questions.from_a_person(event, context):
            return
        subtype = event.get("subtype")
        direct = event.get("channel_type") == "im"
        if subtype == "file_share":
            claimed = direct and await _claimed(services, context)
            if claimed and await questions.served_place(services, client, body, event):
                # Held until every file is done: a redelivery after this process died resumes them.
                await _ingest_shared_files(services, client, event, context.get(CLAIM))
            return
        if not direct and not await questions.is_follow_up(services, context, event):
            return
        if not await _claimed(services, context):
            return
        # The DM's own documents are everyone's, plus those of a channel the asker views.
        viewed = services.agent.viewed(event) if direct else []
        await questions.answer(services, client, context, body, event, offered=viewed)


# ---------------------------------------------------------------- uploads


def _register_uploads(app: AsyncApp, services: Services) -> None:
    @app.command("/kb-upload")
    async def on_upload_command(
        ack: Callable[..., Awaitable[None]], body: dict[str, Any], client: AsyncWebClient
    ) -> None:
        await ack()
        # trigger_id expires 3 s after the command: open the modal before anything else
        # (the person's language is one users.info at most, bounded by LOCALE_TIMEOUT_SECONDS).
        channel = str(body.get("channel_id", ""))
        words = await services.languages.of(client, str(body.get("user_id", "")))
        view = upload_modal(
            json.dumps({"channel": channel}),
            channel_scope_allowed=_is_channel(channel),
            words=words,
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
        words = await services.languages.of(client, str((body.get("user") or {}).get("id", "")))
        if not files:
            await ack(response_action="errors", errors={UPLOAD_FILES_BLOCK: words.UPLOAD_NO_FILE})
            return
        if not services.audience.serves_submitter(body):
            await ack(response_action="errors", errors={UPLOAD_FILES_BLOCK: words.EXTERNAL_ASKER})
            return
        channel = _metadata_channel(view.get("private_metadata", ""))
        choice = (_input(values, UPLOAD_VISIBILITY_BLOCK).get("selected_option") or {}).get("value")
        if choice == VISIBILITY_CHANNEL and not _is_channel(channel):
            # The form offers "only this channel" only where there is one: a submission
            # naming none is damaged or forged, and is never widened to everyone.
            await ack(
                response_action="errors",
                errors={UPLOAD_VISIBILITY_BLOCK: words.UPLOAD_CHANNEL_UNKNOWN},
            )
            return
        await ack()
        user = str(body["user"]["id"])
        scope = channel if choice == VISIBILITY_CHANNEL else EVERYONE
        title = (_input(values, UPLOAD_TITLE_BLOCK).get("value") or "").strip() or None
        publish = await services.roles.publish_mode(client, user, scope)
        request = UploadRequest(
            channel=channel or user,
            user=user,
            scope=scope,
            publish=publish,
            words=words,
            title=title,
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
        words = await services.languages.of(client, user)
        if not await _may_retry(services, client, user, int(value)):
            # The value is the clicker's to forge: a document's name is not shown to just anyone.
            log.warning("%s may not retry document %s", user, value)
            await respond(
                text=words.RETRY_NOT_YOURS, response_type="ephemeral", replace_original=False
            )
            return
        recorded = await asyncio.to_thread(
            services.kb.messages.is_of, int(value), STATUS, status.channel, str(status.ts)
        )
        if not recorded:
            # The value and the message are the clicker's to forge: edit only the
            # status message the bot posted for that document, never another one.
            log.warning(
                "%s clicked Retry for document %s on a message that is not its status (%s %s)",
                user,
                value,
                status.channel,
                status.ts,
            )
            await respond(
                text=words.BUTTON_NOT_HERE, response_type="ephemeral", replace_original=False
            )
            return
        await services.uploader.retry(status, int(value), words)


async def _may_retry(services: Services, client: AsyncWebClient, user: str, doc_id: int) -> bool:
    """Its uploader or an admin may retry a document (one that is gone: anyone, to be told so)."""
    try:
        doc = await asyncio.to_thread(services.kb.document, doc_id)
    except KBError:
        return True
    return bool(user) and (doc.uploader == user or await services.roles.is_admin(client, user))


async def _ingest_shared_files(
    services: Services, client: AsyncWebClient, event: dict[str, Any], claim: Claim | None
) -> None:
    """Files sent to the bot in a DM: for everyone (after an approval, unless a publisher
    sent them); statuses go in the DM thread."""
    user = str(event.get("user", ""))
    request = UploadRequest(
        channel=str(event["channel"]),
        user=user,
        scope=EVERYONE,
        publish=await services.roles.publish_mode(client, user, EVERYONE),
        words=await services.languages.of(client, user, str(event.get("text") or "")),
        thread_ts=str(event.get("thread_ts") or event["ts"]),
    )
    await services.uploader.ingest(client, list(event.get("files") or []), request, claim)


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
        admin = await services.roles.is_admin(client, user)
        words = await services.languages.of(client, user)  # the same users.info, remembered
        if not admin:
            await ack(text=words.REINDEX_NOT_ADMIN)
            return
        if not await services.reindexer.claim():
            await ack(text=words.REINDEX_RUNNING)
            return
        await ack(text=words.REINDEX_STARTED)

        async def report(text: str) -> None:
            await respond(text=text, response_type="ephemeral", replace_original=True)

        await services.reindexer.run(report, actor=user, words=words)


# ---------------------------------------------------------------- feedback


def _register_feedback(app: AsyncApp, services: Services) -> None:
    @app.action(FEEDBACK_ACTION_ID)
    async def on_feedback(
        ack: Callable[..., Awaitable[None]],
        body: dict[str, Any],
        action: dict[str, Any],
        client: AsyncWebClient,
        respond: Callable[..., Awaitable[Any]],
    ) -> None:
        await ack()
        click = feedback.Click.of(body, action)
        words = await services.languages.of(client, click.user)
        try:
            # Written only where the answer was posted, by someone who could see it.
            thumb = await feedback.record_thumb(services.kb, services.access, click)
        except KBError:
            await respond(
                text=words.FEEDBACK_UNKNOWN, response_type="ephemeral", replace_original=False
            )
            return
        if thumb is None:
            return
        thanks = (
            words.FEEDBACK_THANKS_POSITIVE if thumb.value > 0 else words.FEEDBACK_THANKS_NEGATIVE
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

    @app.event("agent_session_stopped")
    async def on_session_stopped(event: dict[str, Any], client: AsyncWebClient) -> None:
        # Not claimed in the shared database: only the process answering can stop it.
        request = stop_request(event)
        if request is None:
            log.warning("ignoring an agent_session_stopped event that names no thread or person")
            return
        if services.turns.stop(request) is Stop.NOT_RUNNING:
            # No answer of this process works there (it ended with a restart, or another
            # replica has it): Slack leaves the session processing until the app says
            # otherwise, and nothing here would.
            await set_session_active(client, request.channel, request.thread_ts)


def _register_people(app: AsyncApp, services: Services) -> None:
    # Who reads an answer in a channel (bot.access): its members and the workspace's
    # guests, each remembered a while; these events say at once what changed, to every
    # replica (bot.access.news).
    @app.event("member_joined_channel")
    @app.event("member_left_channel")
    async def on_members_changed(event: dict[str, Any]) -> None:
        channel = event.get("channel")
        if isinstance(channel, str) and channel:
            await services.access.channel_changed(channel)

    @app.event("user_change")
    @app.event("team_join")
    async def on_person_changed(event: dict[str, Any]) -> None:
        user = event.get("user")
        if isinstance(user, dict):
            await services.access.person_changed(user)


def _register_canvases(app: AsyncApp, services: Services) -> None:
    # A canvas is a file: an edit arrives as file_change, a deletion as file_deleted, a
    # share into a channel as file_shared. Unshared from a channel (file_unshared), its
    # document leaves that channel at once: the canvas may have been taken out of it
    # because its members must not read it.
    @app.event("file_change")
    async def on_file_change(
        event: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
    ) -> None:
        await _canvas_changed(services, client, context, event, deleted=False)

    @app.event("file_shared")
    async def on_file_shared(
        event: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
    ) -> None:
        channel = event.get("channel_id")
        if isinstance(channel, str) and channel in services.canvases.channels:
            await _canvas_changed(services, client, context, event, deleted=False, into=channel)

    @app.event("file_unshared")
    async def on_file_unshared(
        event: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
    ) -> None:
        await _canvas_changed(services, client, context, event, deleted=True)

    @app.event("file_deleted")
    async def on_file_deleted(
        event: dict[str, Any], client: AsyncWebClient, context: AsyncBoltContext
    ) -> None:
        await _canvas_changed(services, client, context, event, deleted=True)


async def _canvas_changed(
    services: Services,
    client: AsyncWebClient,
    context: AsyncBoltContext,
    event: dict[str, Any],
    *,
    deleted: bool,
    into: str = "",
) -> None:
    """Sync again the synced channels a changed, shared, unshared or deleted canvas concerns.

    ``deleted``: the file left a channel or Slack; only the channels whose record
    keeps it are synced, nothing is looked up. ``into``: the synced channel it was
    shared into (``files.info`` says whether it is a canvas there).
    """
    file_id = event.get("file_id") or (event.get("file") or {}).get("id")
    if not services.canvases.channels or not isinstance(file_id, str) or not file_id:
        return  # no channel's canvases are kept: a file's change concerns nothing here
    if await _claimed(services, context):
        await services.canvases.on_file_event(client, file_id, deleted=deleted, shared_into=into)


async def _serves(
    services: Services, client: AsyncWebClient, body: dict[str, Any], user: Any
) -> bool:
    """Whether ``user``, who opened one of the app's tabs, is one the bot serves."""
    if not isinstance(user, str) or not user:
        return False
    place = await services.audience.place(client, body, {"user": user})
    return services.audience.serves(place)


# ---------------------------------------------------------------- handing a question to a person


def _register_escalation(app: AsyncApp, services: Services) -> None:
    @app.action(ASK_A_PERSON_ACTION_ID)
    async def on_ask_a_person(
        ack: Callable[..., Awaitable[None]],
        body: dict[str, Any],
        action: dict[str, Any],
        client: AsyncWebClient,
        context: AsyncBoltContext,
        respond: Callable[..., Awaitable[Any]],
    ) -> None:
        await ack()
        await escalation.ask_a_person(
            services.kb.store,
            services.config.escalation_channel,
            services.access,
            services.audience,
            services.languages,
            body,
            action,
            client,
            context,
            respond,
        )


# ---------------------------------------------------------------- the Home tab


def _register_home(app: AsyncApp, services: Services) -> None:
    """The Home tab's buttons (its ``app_home_opened`` comes through the agent's listener)."""
    home = services.home

    def clicked(handler: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        async def listener(
            ack: Callable[..., Awaitable[None]],
            body: dict[str, Any],
            action: dict[str, Any],
            client: AsyncWebClient,
            context: AsyncBoltContext,
        ) -> None:
            await ack()
            user = str((body.get("user") or {}).get("id", ""))
            view = body.get("view") or {}
            if not user or view.get("type") != "home":
                log.warning("ignoring a Home button outside the Home tab")
                return
            if not services.audience.serves_clicker(body, context):
                log.warning("a Home button clicked by a person of another organisation")
                await home.publish_external(client, user)
                return
            await handler(client, user, action.get("value"), view.get("private_metadata"))

        return listener

    async def refresh(client: AsyncWebClient, user: str, value: Any, metadata: Any) -> None:
        await home.publish(client, user, pages=Pages.from_metadata(metadata))

    async def reindex(client: AsyncWebClient, user: str, value: Any, metadata: Any) -> None:
        await home.reindex(client, user, metadata)

    app.action(HOME_PAGE_ACTION_RE)(clicked(home.turn_page))
    app.action(HOME_REFRESH_ACTION_ID)(clicked(refresh))
    app.action(HOME_RETRY_ACTION_ID)(clicked(home.retry))
    app.action(HOME_REINDEX_ACTION_ID)(clicked(reindex))


# ---------------------------------------------------------------- Work Objects


def _register_unfurls(app: AsyncApp, services: Services) -> None:
    """Passage links as Work Objects: the card (``link_shared``) and its flexpane."""
    unfurling = unfurls.Unfurls(services)

    @app.event("link_shared")
    async def on_link_shared(
        body: dict[str, Any],
        event: dict[str, Any],
        context: AsyncBoltContext,
        client: AsyncWebClient,
    ) -> None:
        if await _claimed(services, context):
            await unfurling.link_shared(client, body, event, context)

    @app.event("entity_details_requested")
    async def on_entity_details_requested(
        body: dict[str, Any],
        event: dict[str, Any],
        context: AsyncBoltContext,
        client: AsyncWebClient,
    ) -> None:
        if await _claimed(services, context):
            await unfurling.details_requested(client, body, event, context)

    @app.action(OPEN_VIEWER_ACTION_ID)
    async def on_open_viewer(ack: Callable[..., Awaitable[None]]) -> None:
        # The button opens its URL in the browser; Slack still wants the click acknowledged.
        await ack()


# ---------------------------------------------------------------- errors


def _register_errors(app: AsyncApp, services: Services) -> None:
    @app.error
    async def on_error(
        error: Exception,
        body: dict[str, Any],
        context: AsyncBoltContext,
        client: AsyncWebClient,
        respond: Callable[..., Awaitable[Any]] | None,
    ) -> None:
        log.error("Slack listener failed: %s", error, exc_info=error)
        words = context.get(WORDS_KEY) or services.languages.default
        try:
            await _tell_user(body, context, client, respond, _failure_text(error, words))
        except Exception:  # the person is unreachable; the log has the cause
            log.exception("could not tell the user about the failure")


def _failure_text(error: Exception, words: Words) -> str:
    """What the person is told: the cause when it is one they can wait out, never a trace."""
    if isinstance(error, EmbeddingModelUnavailable):
        return words.ERROR_SEARCH_UNAVAILABLE
    return words.ERROR_GENERIC


async def _tell_user(
    body: dict[str, Any],
    context: AsyncBoltContext,
    client: AsyncWebClient,
    respond: Callable[..., Awaitable[Any]] | None,
    text: str,
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
