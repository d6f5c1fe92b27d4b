"""Handing a question to people: the "Ask a person" button under answers and refusals.

With ``KB_ESCALATION_CHANNEL`` set, every logged answer, related-passages reply
and refusal carries the button; its value is the logged question's id, and
nothing else is trusted from it. A click posts the question in that channel,
once per question (``index.storage.escalations`` claims it in the shared database
first, so double clicks, replicas and redelivered clicks post once), with who
asked, what the bot replied and a link to the thread, and tells the clicker
what happened.

Who may hand off what, and what the escalation channel may read (its members
need not be in the channel, or the DM, the question came from):

* a question asked in a DM only by its asker; in a channel thread, by anyone
  who sees the answer there (the click must come from the question's own
  channel, so a forged id never reaches another conversation's question);
* the question's text only when its asker handed it off; otherwise the
  channel is told to open the thread (a DM's asker is always the clicker);
* the bot's answer only when everyone in that channel may read every passage it
  was written from (the access rule at that place: ``Access.readable_at``): an
  answer drawn from another channel's documents is withheld, and so is one from
  the documents for everyone where a guest of the workspace or people of
  another organisation (Slack Connect) read too.

A post Slack refuses (the bot is not in the channel, it was archived, Slack is
unreachable) releases the claim, so a click after an admin fixed it posts.

The claim is a lease of ``CLAIM_LEASE`` seconds, renewed every third of it while
the hand-off is built and posted, so a post Slack is slow to answer is never
taken over by a later click; only a claim whose process died is. A claim found
taken over just before posting posts nothing, and a post that finds another one
marked sent first (its own renewals failed) is deleted: the channel sees one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from slack_bolt.async_app import AsyncBoltContext
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import Access, Where
from bot.slack.blocks import (
    HandOff,
    mark_handed_off,
    mention,
    parse_query_id,
    render_hand_off,
    scope_label,
)
from bot.slack.people import channel_readers
from bot.slack.reply import SLACK_FAILURES, slack_failure
from bot.slack.words import Languages, Words
from core.answer import Outcome
from index.errors import QueryNotFound
from index.models import EVERYONE
from index.records import QueryRecord
from index.storage import Store

if TYPE_CHECKING:
    from bot.slack.people import Audience

log = logging.getLogger(__name__)

__all__ = ["CLAIM_LEASE", "ask_a_person", "hand_off_view", "written_for_everyone"]

# How long a claim on a hand-off lasts without being renewed (seconds).
CLAIM_LEASE = 60.0
# How a claim's renewal waits (tests put a clock's sleep here).
_sleep = asyncio.sleep

# Slack's answers meaning the bot cannot post in the channel until an admin acts.
_CHANNEL_REFUSALS = frozenset({"not_in_channel", "channel_not_found", "is_archived"})
_ANSWERS = frozenset({Outcome.ANSWERED.value, Outcome.UNSUPPORTED.value})

Respond = Callable[..., Awaitable[Any]]


async def ask_a_person(
    store: Store,
    channel: str,
    access: Access,
    audience: Audience,
    languages: Languages,
    body: dict[str, Any],
    action: dict[str, Any],
    client: AsyncWebClient,
    context: AsyncBoltContext,
    respond: Respond,
) -> None:
    """The "Ask a person" button clicked: hand the question off to ``channel`` (empty: the
    feature is off) once, if the clicker may.

    The clicker is told in their language; the channel, read by several people, is
    told in the default one (``KB_DEFAULT_LANGUAGE``).
    """
    words = await languages.of(client, str((body.get("user") or {}).get("id", "")))
    if not channel:
        await _tell(respond, words.HAND_OFF_OFF)
        return
    if not audience.serves_clicker(body, context):
        # Slack Connect: people of another organisation hand nothing to this one's staff.
        log.warning("refused a hand-off clicked by a person of another organisation")
        await _tell(respond, words.EXTERNAL_ASKER)
        return
    value = str(action.get("value", ""))
    query_id = parse_query_id(value)
    if query_id is None:
        log.warning("ignoring an Ask-a-person click with a malformed value %r", value[:40])
        return
    await _hand_off(
        store, access, client, body, query_id, channel, respond, words, languages.default
    )


async def _hand_off(
    store: Store,
    access: Access,
    client: AsyncWebClient,
    body: dict[str, Any],
    query_id: int,
    channel: str,
    respond: Respond,
    words: Words,
    channel_words: Words,
) -> None:
    """Hand question ``query_id`` off to ``channel`` if the clicker may, once; tell the clicker
    (in ``words``; the channel in ``channel_words``)."""
    clicker = str((body.get("user") or {}).get("id", ""))
    try:
        record = await asyncio.to_thread(store.queries.get, query_id)
    except QueryNotFound:
        await _tell(respond, words.HAND_OFF_UNKNOWN)
        return
    where = str((body.get("container") or {}).get("channel_id", ""))
    if not _may_hand_off(record, clicker, where):
        log.warning(
            "%s may not hand off question %s (asked by %s in %s; clicked in %s)",
            clicker,
            query_id,
            record.user,
            record.channel,
            where,
        )
        await _tell(respond, words.HAND_OFF_NOT_YOURS)
        return
    claim = await asyncio.to_thread(
        store.escalations.claim, query_id, clicker, stale_after=CLAIM_LEASE
    )
    if claim is None:
        await _tell_already(store, respond, query_id, channel, words)
        return
    hold = _Hold(store, claim)
    renewal = asyncio.get_running_loop().create_task(hold.keep(), name="renew hand-off claim")
    ts: str | None = None
    try:
        answer = await _answer_readable(store, access, client, record, channel)
        view = hand_off_view(record, clicker, answer=answer)
        if not view.direct:
            view = replace(view, permalink=await _permalink(client, record))
        if not await hold.renew():
            log.warning("question %s: the hand-off claim was taken over; not posting", query_id)
            text = ""
        else:
            ts, text = await _post(client, channel, view, query_id, words, channel_words)
        if ts is not None and not await asyncio.to_thread(
            store.escalations.mark_sent, query_id, channel, ts, user=clicker
        ):
            await _withdraw(client, channel, ts, query_id)
            ts, text = None, ""
    finally:
        # A no-op once sent; unsent (refused, or an error on the way), a later click may try again.
        await hold.stop(renewal)
    if not text:
        await _tell_already(store, respond, query_id, channel, words)
        return
    await _tell(respond, text)
    if ts is not None:
        note = words.hand_off_marked(
            scope_label(channel, words), mention(clicker), direct=view.direct
        )
        await _mark_answer(client, body, note, words)


def _may_hand_off(record: QueryRecord, clicker: str, where: str) -> bool:
    """The click came from the question's own conversation, and in a DM from its asker."""
    if not clicker or not record.channel or where != record.channel:
        return False
    return not record.channel.startswith("D") or clicker == record.user


def hand_off_view(record: QueryRecord, clicker: str, *, answer: bool) -> HandOff:
    """What the escalation channel may read about ``record``, handed off by ``clicker``;
    ``answer``: its people may read every passage the answer was written from."""
    question = record.question if clicker == record.user else None
    return HandOff(
        asker=record.user,
        by=clicker,
        channel=record.channel or "",
        question=question,
        outcome=record.outcome,
        answer=record.answer if answer and record.outcome in _ANSWERS else None,
    )


async def _answer_readable(
    store: Store, access: Access, client: AsyncWebClient, record: QueryRecord, channel: str
) -> bool:
    """Whether everyone in ``channel`` may read every passage ``record``'s answer was written
    from (the access rule at that place); a passage no longer there cannot be vouched for."""
    if record.outcome not in _ANSWERS:
        return False
    scopes = await asyncio.to_thread(passage_scopes, store, record)
    if scopes is None:
        return False
    where = await channel_readers(client, channel) or Where(channel=channel)
    for scope in sorted(scopes):
        decision = await access.readable_at(scope, where)
        if not decision.allowed:
            log.info("a handed-off answer is withheld: %s", decision.reason)
            return False
    return True


def passage_scopes(store: Store, record: QueryRecord) -> frozenset[str] | None:
    """The scopes of every passage ``record``'s answer was written from; ``None``: one is gone.

    The model read every kept passage, not only the cited ones.
    """
    ids = sorted({c for c, _ in record.kept} | set(record.cited))
    rows = store.chunks_by_id(ids)
    return frozenset(r.scope for r in rows.values()) if len(rows) == len(ids) else None


def written_for_everyone(store: Store, record: QueryRecord) -> bool:
    """Whether every passage the answer was written from is a document for everyone.

    Whoever reads an answer outside its conversation (an admin's Home tab) need not be a
    member of a channel whose documents it used.
    """
    scopes = passage_scopes(store, record)
    return scopes is not None and scopes <= {EVERYONE}


class _Hold:
    """A claim on a hand-off (``Escalations.claim``), renewed while its post is under way."""

    def __init__(self, store: Store, claim: Any) -> None:
        self.store = store
        self.claim: Any = claim  # the newest renewal: what tells it from a takeover
        self.lock = asyncio.Lock()  # a renewal and the release never overlap
        self.held = True

    async def renew(self) -> bool:
        """Renew the claim now: ``False`` when it was taken over (or released)."""
        async with self.lock:
            if self.held:
                renewed = await asyncio.to_thread(self.store.escalations.renew, self.claim)
                self.held = renewed is not None
                self.claim = renewed or self.claim
            return self.held

    async def keep(self) -> None:
        """Renew the claim every third of the lease until it is lost or released."""
        while self.held:
            await _sleep(CLAIM_LEASE / 3)
            try:
                if not await self.renew():
                    log.warning("hand-off of question %s taken over", self.claim.query_id)
            except Exception as exc:  # the lease may lapse: a duplicate is withdrawn
                log.warning("could not renew a hand-off claim: %s", type(exc).__name__)

    async def stop(self, renewal: asyncio.Task[None]) -> None:
        """Stop renewing and release the claim if unsent (a no-op once sent or taken over)."""
        async with self.lock:
            self.held = False
            renewal.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewal
        await asyncio.to_thread(self.store.escalations.release, self.claim.query_id, self.claim)


async def _withdraw(client: AsyncWebClient, channel: str, ts: str, query_id: int) -> None:
    """Delete a hand-off posted after another one of the same question was marked sent."""
    log.warning("question %s was handed off twice; deleting the later post", query_id)
    try:
        await client.chat_delete(channel=channel, ts=ts)
    except SLACK_FAILURES as exc:
        log.error("the duplicate hand-off %s in %s stays: %s", ts, channel, slack_failure(exc))


async def _post(
    client: AsyncWebClient,
    channel: str,
    view: HandOff,
    query_id: int,
    words: Words,
    channel_words: Words,
) -> tuple[str | None, str]:
    """Post the hand-off in ``channel``: its ``ts`` (``None`` when Slack refused) and what the
    clicker is told."""
    try:
        posted = await client.chat_postMessage(
            channel=channel, **render_hand_off(view, words=channel_words).as_kwargs()
        )
    except SLACK_FAILURES as exc:
        reason = slack_failure(exc)
        log.warning("question %s not handed off to %s: %s", query_id, channel, reason)
        if isinstance(exc, SlackApiError) and reason in _CHANNEL_REFUSALS:
            return None, words.hand_off_not_in_channel(scope_label(channel, words))
        return None, words.HAND_OFF_FAILED
    log.info("question %s handed off to %s by %s", query_id, channel, view.by)
    ts = str(posted.get("ts") or "") or "posted"
    return ts, words.hand_off_posted(scope_label(channel, words), direct=view.direct)


async def _permalink(client: AsyncWebClient, record: QueryRecord) -> str | None:
    """The link to the question's thread, or ``None`` when Slack gives none."""
    if not (record.channel and record.thread_id):
        return None
    try:
        resp = await client.chat_getPermalink(channel=record.channel, message_ts=record.thread_id)
    except SLACK_FAILURES as exc:
        log.info(
            "no link to thread %s in %s: %s", record.thread_id, record.channel, slack_failure(exc)
        )
        return None
    link = resp.get("permalink")
    return str(link) if isinstance(link, str) and link.startswith("https://") else None


async def _mark_answer(
    client: AsyncWebClient, body: dict[str, Any], note: str, words: Words
) -> None:
    """Replace the button under the answer with ``note`` (best effort: the hand-off was posted)."""
    container, message = body.get("container") or {}, body.get("message") or {}
    blocks = message.get("blocks")
    if not (container.get("message_ts") and isinstance(blocks, list) and blocks):
        return  # never an answer replaced by nothing
    try:
        await client.chat_update(
            channel=str(container.get("channel_id", "")),
            ts=str(container["message_ts"]),
            text=str(message.get("text") or words.ASK_A_PERSON),
            blocks=mark_handed_off(blocks, note),
        )
    except SLACK_FAILURES as exc:
        log.info("the answer's button was not replaced: %s", slack_failure(exc))


async def _tell_already(
    store: Store, respond: Respond, query_id: int, channel: str, words: Words
) -> None:
    """A later click: where, and by whom, the question was handed off."""
    sent = await asyncio.to_thread(store.escalations.get, query_id)
    by = mention(sent.user) if sent else words.HAND_OFF_SOMEONE
    where = sent.channel if sent and sent.channel else channel
    await _tell(respond, words.hand_off_already(scope_label(where, words), by))


async def _tell(respond: Respond, text: str) -> None:
    """Tell the clicker alone (best effort: the hand-off itself is what matters)."""
    try:
        await respond(text=text, response_type="ephemeral", replace_original=False)
    except SLACK_FAILURES as exc:
        log.info("could not tell the clicker about a hand-off: %s", slack_failure(exc))
