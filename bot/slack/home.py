"""The Home tab: how to use the bot and one's own uploads for everyone; more for admins.

``app_home_opened`` on the ``home`` tab publishes the view (``views.publish``)
for the person who opened it (``bot.slack.blocks.home`` builds it):

* everyone: how to ask and add documents, how many searchable documents and
  passages the knowledge base holds, and their own uploads with their states
  (and why one failed), newest first;
* admins (``bot.slack.people.roles``), in addition: failed uploads with a Retry
  button each (the same retry as the button under an upload's status: its
  result comes as a message too), stale documents with a Reindex button (the
  same reindex as ``/kb-reindex``; its progress shows on the tab, its report
  also comes as a message), the knowledge gaps of the last 30 days
  (``core.gaps``), answers marked not helpful, and the calibration in force
  (the thresholds, and the rates ``kb calibrate`` last measured at them); first,
  each synced source whose last run failed (``index.sources``), with the reason
  and its last good sync, and nothing while every source is fine.

The view is a snapshot: it is published again on every open, every button and
every step of a retry or reindex started from it. Every button checks again
who clicked it: an admin's button in a payload from anyone else changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from slack_sdk.web.async_client import AsyncWebClient

from bot.access import Access, Person
from bot.slack.blocks import (
    ADMIN_SECTIONS,
    FIRST_PAGES,
    PAGE_SIZES,
    AdminHome,
    Calibration,
    Disliked,
    MemberHome,
    Pages,
    Rendered,
    Section,
    document_label,
    escape,
    external_view,
    home_view,
    page_number,
    page_of,
    parse_page_value,
    readable_by,
)
from bot.slack.escalation import written_for_everyone
from bot.slack.people import Roles
from bot.slack.reindex import Reindexer
from bot.slack.reply import SLACK_FAILURES, slack_failure
from bot.slack.uploads import StatusMessage, Uploader
from bot.slack.words import Languages, Words
from core.answer import Engine
from core.calibration import last_calibration
from core.errors import LinkSecretUnavailable
from core.gaps import Gap, knowledge_gaps
from index.errors import DocumentNotFound, KBError, QueryNotFound
from index.knowledge_base import KnowledgeBase
from index.models import EVERYONE, DocState
from index.records import DislikedAnswer, DocumentRow

if TYPE_CHECKING:
    from collections.abc import Callable


log = logging.getLogger(__name__)

__all__ = ["GAP_DAYS", "Home"]

GAP_DAYS = 30
# How long a view waits for the knowledge gaps; past that it shows them as coming,
# and is published again when they are ready.
GAPS_WAIT_SECONDS = 2.0
# People whose place in the lists is remembered (the least recently shown are forgotten).
MAX_REMEMBERED = 10_000
# Gaps worked out this recently are shown as they are: paging and buttons stay quick.
GAPS_FRESH_SECONDS = 60.0
MAX_GAPS = 50
_THREAD_CHANNEL = re.compile(r"[CG][A-Z0-9]{2,30}")
_TS = re.compile(r"\d{1,12}\.\d{1,8}")


class GapCache:
    """The knowledge gaps, worked out in a worker thread at most once per ``fresh_seconds``.

    Grouping embeds every wording not seen yet: seconds for thousands of
    questions after a restart. One computation runs at a time, shared by every
    admin's view; a view waits ``wait_seconds`` for it, then shows the previous
    result (``None`` before the first). A failure is returned rather than
    raised, so the rest of the view is still shown, and kept as long as a result.

    Args:
        compute: works the gaps out (blocking).
        clock: monotonic seconds (tests move it).
    """

    def __init__(
        self,
        compute: Callable[[], list[Gap]],
        *,
        wait_seconds: float = GAPS_WAIT_SECONDS,
        fresh_seconds: float = GAPS_FRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.compute = compute
        self.wait_seconds = wait_seconds
        self.fresh_seconds = fresh_seconds
        self.clock = clock
        self.running: asyncio.Task[list[Gap]] | None = None
        self._last: list[Gap] | Exception | None = None
        self._at = -math.inf

    async def get(self) -> list[Gap] | Exception | None:
        """The gaps (or why they could not be worked out); ``None`` while the first runs."""
        if self.clock() - self._at < self.fresh_seconds:
            return self._last
        if self.running is None:
            self.running = asyncio.create_task(asyncio.to_thread(self.compute))
            self.running.add_done_callback(self._done)
        try:
            await asyncio.wait_for(asyncio.shield(self.running), self.wait_seconds)
        except TimeoutError:
            return self._last
        except Exception:  # kept by _done
            pass
        return self._last

    def _done(self, task: asyncio.Task[list[Gap]]) -> None:
        self.running = None
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            self._last = task.result()
        else:
            log.error("knowledge gaps could not be worked out", exc_info=error)
            self._last = error if isinstance(error, Exception) else RuntimeError(str(error))
        self._at = self.clock()


class Home:
    """Builds and publishes each person's Home tab, and runs the admins' buttons.

    Args:
        kb: the knowledge base shown.
        engine: its thresholds in force, and the signer of passage links.
        roles: who is an admin.
        uploader: retries failed uploads (one indexing at a time, with the uploads).
        reindexer: the reindex ``/kb-reindex`` runs.
        languages: the words each person's Home tab is in.
        access: which channels' and synced documents an admin may see named.
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        engine: Engine,
        roles: Roles,
        uploader: Uploader,
        reindexer: Reindexer,
        languages: Languages,
        access: Access,
    ) -> None:
        self.kb = kb
        self.access = access
        self.engine = engine
        self.roles = roles
        self.uploader = uploader
        self.reindexer = reindexer
        self.languages = languages
        self.gaps = GapCache(self._gaps_of_the_window)
        self._workspace_url: str | None = None
        self._shown: OrderedDict[str, Pages] = OrderedDict()

    # ------------------------------------------------------------ publishing

    async def publish(
        self,
        client: AsyncWebClient,
        user: str,
        *,
        pages: Pages | None = None,
        notice: str | None = None,
    ) -> bool:
        """Publish ``user``'s Home tab; whether Slack took it.

        ``pages``: the lists' pages; by default those ``user`` was last shown, so
        that a view published on its own (a reindex's progress) keeps their place.
        """
        if not user:
            return False
        pages = self._last_pages(user) if pages is None else pages
        self._shown[user] = pages
        self._shown.move_to_end(user)
        while len(self._shown) > MAX_REMEMBERED:
            self._shown.popitem(last=False)
        admin = await self.roles.is_admin(client, user)
        member = await asyncio.to_thread(member_home, self.kb, user)
        admin_home = await self._admin_home(client, user, pages) if admin else None
        words = await self.languages.of(client, user)
        view = home_view(member, admin_home, words=words, pages=pages, notice=notice)
        try:
            await client.views_publish(user_id=user, view=view)
        except SLACK_FAILURES as exc:
            log.warning("could not publish the Home tab of %s: %s", user, slack_failure(exc))
            return False
        return True

    async def publish_external(self, client: AsyncWebClient, user: str) -> None:
        """The Home tab of a person of another organisation: only that it is not for them."""
        if not user:
            return
        try:
            words = await self.languages.of(client, user)
            await client.views_publish(user_id=user, view=external_view(words))
        except SLACK_FAILURES as exc:
            log.warning("could not publish the Home tab of %s: %s", user, slack_failure(exc))

    async def _admin_home(self, client: AsyncWebClient, user: str, pages: Pages) -> AdminHome:
        workspace = await self._workspace(client)
        running = self.reindexer.running or await asyncio.to_thread(self.kb.reindex_running)
        gaps = await self.gaps.get()
        if gaps is None:
            self._publish_when_gaps_are_ready(client, user)
        shown = None if isinstance(gaps, Exception) else gaps
        admin = await asyncio.to_thread(self._admin_parts, workspace, pages)
        listed = [
            *page_of(admin["failed"], Section.FAILED, pages)[0],
            *page_of(admin["stale"], Section.STALE, pages)[0],
        ]
        return AdminHome(
            reindex_running=running,
            gaps=shown,
            gaps_failed=isinstance(gaps, Exception),
            gap_links=self._gap_links(shown or []),
            readable=await self._readable(user, listed),
            **admin,
        )

    async def _readable(self, user: str, docs: Sequence[DocumentRow]) -> frozenset[str]:
        """The scopes of ``docs`` but everyone's whose documents ``user`` may read (the access
        rule: a channel's to its members, a synced one to whom its source's permissions
        admit; unknown: none)."""
        scopes = sorted({d.scope for d in docs} - {EVERYONE})
        return await self.access.readable_among(scopes, person=Person(user))

    def _gaps_of_the_window(self) -> list[Gap]:
        return knowledge_gaps(self.kb, since=time.time() - GAP_DAYS * 86400, limit=MAX_GAPS)

    def _publish_when_gaps_are_ready(self, client: AsyncWebClient, user: str) -> None:
        running = self.gaps.running
        if running is None:
            return

        async def later() -> None:
            await asyncio.wait([running])
            await self.publish(client, user)

        # Held with the uploads' background jobs: logged if it fails, cancelled at shutdown.
        self.uploader.jobs.spawn(later(), name=f"home gaps for {user}")

    def _last_pages(self, user: str) -> Pages:
        return self._shown.get(user, FIRST_PAGES)

    def _admin_parts(self, workspace: str | None, pages: Pages) -> dict[str, Any]:
        documents = self.kb.documents(DocState.FAILED)
        disliked, disliked_total = disliked_page(self.kb, workspace, pages)
        config = self.engine.config
        return {
            "failed": sorted(documents, key=lambda d: (d.updated_at, d.id), reverse=True),
            "stale": self.kb.stale_documents(),
            "failing_sources": [s for s in self.kb.store.sources.all() if s.last_error is not None],
            "disliked": disliked,
            "disliked_total": disliked_total,
            "calibration": Calibration(
                config.threshold,
                config.related_threshold,
                last_calibration(self.kb.store),
                model=config.thresholds_model,
                origin=config.thresholds_origin,
                language_advice=self.kb.language_fit().advice,
                kept_model=(kept.built_on, kept.default) if (kept := self.kb.kept_model) else None,
                store_model_refused=self.kb.unfollowed,
            ),
        }

    def _gap_links(self, gaps: Sequence[Gap]) -> dict[int, str]:
        """Viewer links to the closest passages of documents for everyone."""
        links = {}
        for gap in gaps:
            row = gap.closest
            if row is None or row.scope != EVERYONE:
                continue
            try:
                links[row.id] = self.engine.passage_link(row)
            except LinkSecretUnavailable:
                continue  # no secret yet (a full disk): the gap is listed without its link
        return links

    async def _workspace(self, client: AsyncWebClient) -> str | None:
        """The workspace's web address (``auth.test``), for links to threads; asked once."""
        if self._workspace_url is None:
            try:
                resp = await client.auth_test()
            except SLACK_FAILURES as exc:
                log.warning("auth.test failed: %s", slack_failure(exc))
                return None
            self._workspace_url = workspace_url(resp.get("url"))
        return self._workspace_url or None

    # ------------------------------------------------------------ buttons

    async def turn_page(self, client: AsyncWebClient, user: str, value: Any, metadata: Any) -> None:
        """Previous / Next of a list: the same view with that list on another page."""
        parsed = parse_page_value(value)
        if parsed is None:
            log.warning("ignoring a Home page button with a malformed value %r", str(value)[:40])
            return
        section, page = parsed
        pages = Pages.from_metadata(metadata)
        if section in ADMIN_SECTIONS and not await self.roles.is_admin(client, user):
            log.warning("%s is not an admin: not paging %s", user, section)
            await self.publish(client, user, pages=pages)
            return
        await self.publish(client, user, pages=pages.at(section, page))

    async def retry(self, client: AsyncWebClient, user: str, value: Any, metadata: Any) -> None:
        """An admin's Retry: index the failed document again, then show what became of it."""
        pages = Pages.from_metadata(metadata)
        if not await self._admin_or_refuse(client, user, pages):
            return
        raw = str(value)
        if not (raw.isascii() and raw.isdigit() and len(raw) < 19):
            log.warning("ignoring a Home Retry with a malformed value %r", raw[:40])
            return
        words = await self.languages.of(client, user)
        doc = await self._document(int(raw))
        if doc is None:
            await self.publish(client, user, pages=pages, notice=words.RETRY_GONE)
            return
        readable = await self._readable(user, [doc])
        if doc.state not in (DocState.FAILED, DocState.PENDING):
            await self.publish(client, user, pages=pages, notice=_outcome(doc, readable, words))
            return
        named = readable_by(doc, readable)
        retrying = words.home_retrying(_name(doc, readable, words), message=named)
        await self.publish(client, user, pages=pages, notice=retrying)
        # No message to edit on the Home tab: the status goes to the admin's DM, unless it
        # would name a channel's document to an admin who is not in that channel.
        status = StatusMessage(client, user, None) if named else _Unreported(client, user, None)
        try:
            await self.uploader.retry(status, doc.id, words)
        except KBError as exc:
            # Refused on purpose (a full disk...): the reason is one the admin can act on.
            log.warning("retrying document %s from the Home tab failed: %s", doc.id, exc)
            notice = words.home_retried(
                _name(doc, readable, words), DocState.FAILED, escape(str(exc))
            )
            await self.publish(client, user, notice=notice)
            return
        after = await self._document(doc.id)
        notice = words.RETRY_GONE if after is None else _outcome(after, readable, words)
        await self.publish(client, user, notice=notice)

    async def reindex(self, client: AsyncWebClient, user: str, metadata: Any) -> None:
        """An admin's Reindex: the ``/kb-reindex`` rebuild, its progress shown on the tab."""
        pages = Pages.from_metadata(metadata)
        if not await self._admin_or_refuse(client, user, pages):
            return
        words = await self.languages.of(client, user)
        if not await self.reindexer.claim():
            await self.publish(client, user, pages=pages, notice=words.REINDEX_RUNNING)
            return
        await self.publish(client, user, pages=pages, notice=words.REINDEX_STARTED)
        reports: list[str] = []

        async def report(text: str) -> None:
            reports.append(text)
            await self.publish(client, user, notice=text)

        result = await self.reindexer.run(report, actor=user, words=words)
        if result is not None and reports:
            await _tell(client, user, reports[-1])

    async def _admin_or_refuse(self, client: AsyncWebClient, user: str, pages: Pages) -> bool:
        if await self.roles.is_admin(client, user):
            return True
        log.warning("refused an admin's Home button clicked by %s, who is not an admin", user)
        words = await self.languages.of(client, user)
        await _tell(client, user, words.HOME_NOT_ADMIN)
        await self.publish(client, user, pages=pages)
        return False

    async def _document(self, doc_id: int) -> DocumentRow | None:
        try:
            return await asyncio.to_thread(self.kb.document, doc_id)
        except DocumentNotFound:
            return None


# ---------------------------------------------------------------- data


def member_home(kb: KnowledgeBase, user: str) -> MemberHome:
    """Counts of the searchable documents, and ``user``'s own uploads, newest first."""
    documents = kb.documents()
    stale = {d.id for d in kb.stale_documents()}
    searchable = [d for d in documents if d.state == DocState.INDEXED and d.id not in stale]
    uploads = [d for d in reversed(documents) if user and d.uploader == user]
    return MemberHome(
        documents=len(searchable),
        chunks=sum(d.chunk_count for d in searchable),
        channel_documents=sum(d.scope != EVERYONE for d in searchable),
        uploads=uploads,
    )


def disliked_page(
    kb: KnowledgeBase, workspace: str | None, pages: Pages
) -> tuple[list[Disliked], int]:
    """The page of answers marked not helpful (latest mark first), and how many there are."""
    total = kb.feedback.disliked_count()
    size = PAGE_SIZES[Section.DISLIKED]
    offset = page_number(Section.DISLIKED, total, pages) * size
    rows = kb.feedback.disliked_answers(limit=size, offset=offset)
    return [_disliked(row, workspace, _for_everyone(kb, row.id)) for row in rows], total


def _for_everyone(kb: KnowledgeBase, query_id: int) -> bool:
    """Whether the answer of ``query_id`` was written only from documents for everyone."""
    try:
        return written_for_everyone(kb.store, kb.queries.get(query_id))
    except QueryNotFound:
        return False


def _disliked(row: DislikedAnswer, workspace: str | None, for_everyone: bool) -> Disliked:
    channel, thread = row.channel or "", row.thread_id or ""
    return Disliked(
        question=row.question,
        answer=(row.answer or "") if for_everyone else "",
        withheld=bool(row.answer) and not for_everyone,
        outcome=row.outcome,
        at=row.disliked_at,
        dislikes=row.dislikes,
        thread_url=thread_url(workspace, channel, thread),
        direct=channel.startswith("D"),
    )


def workspace_url(raw: Any) -> str:
    """``https://team.slack.com/`` from ``auth.test``, or "" when it is not one of Slack's."""
    if not isinstance(raw, str):
        return ""
    parts = urlsplit(raw)
    host = (parts.hostname or "").lower()
    if parts.scheme != "https" or not host.endswith(".slack.com") or parts.port:
        return ""
    return f"https://{host}/"


def thread_url(workspace: str | None, channel: str, thread_ts: str) -> str | None:
    """The permalink of a channel thread (never of a DM: only its two people can open it)."""
    if not (workspace and _THREAD_CHANNEL.fullmatch(channel) and _TS.fullmatch(thread_ts)):
        return None
    return f"{workspace}archives/{channel}/p{thread_ts.replace('.', '')}"


class _Unreported(StatusMessage):
    """A retry's progress told nowhere: the Home tab's notice says what became of it."""

    async def show(self, rendered: Rendered) -> bool:
        return False

    async def settle(self, rendered: Rendered) -> None:
        return None


def _outcome(doc: DocumentRow, readable: frozenset[str], words: Words) -> str:
    named = readable_by(doc, readable)
    reason = escape(doc.failure_reason or "") if doc.state == DocState.FAILED and named else ""
    return words.home_retried(_name(doc, readable, words), doc.state.value, reason)


def _name(doc: DocumentRow, readable: frozenset[str], words: Words) -> str:
    """``doc``'s name in a notice, or only its channel for an admin not in it."""
    if readable_by(doc, readable):
        return escape(doc.name)
    return document_label(doc, readable, words)


async def _tell(client: AsyncWebClient, user: str, text: str) -> None:
    """A message in the person's DM with the bot."""
    try:
        await client.chat_postMessage(channel=user, text=text, unfurl_links=False)
    except SLACK_FAILURES as exc:
        log.warning("could not message %s: %s", user, slack_failure(exc))
