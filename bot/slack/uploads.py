"""Slack files into the knowledge base: authenticated download, then background indexing.

A file's status message moves ``queued -> downloading -> indexing -> indexed, N
chunks`` (N is the count the server wrote) or ``failed: reason``; a document
that failed after it was stored gets a Retry button that indexes it again from
the stored original. A status update Slack refuses is skipped, never the work
it reports on; the final status is posted as a new message when the old one
cannot be edited. A document whose text is the same as documents already
there (``KnowledgeBase.copies``), or nearly the same (the same document in
another format or version: ``KnowledgeBase.near_copies``), is added all the
same, and its final status names and links them, those only that everyone
reading it may read
(``bot.access``: the uploader alone in a DM, the channel's people in a channel,
and in a channel shared with another organisation only its own documents).

Indexing takes one of ``KB_EXTRACT_WORKERS`` slots (``FairTurns``), handed
out round-robin across people; while there is more than one, nobody holds them
all, so one person's slow document never holds up another's upload. Each
document is read into text in a reader process with memory and time limits
(``index.ingest.isolated``).

The same bytes are one document, indexed by one upload at a time: in this
process (a lock per document) and across replicas sharing the store (a claim on
``indexing:<document id>`` in it, a lease like a Slack delivery's). An upload
that finds it held shows its uploader that it waits, and then tells them what
became of the document; a claim whose replica died lapses, and the waiting
upload indexes the document itself.

Downloads run outside the indexing slots, each within a total deadline
(``KB_DOWNLOAD_TIMEOUT``), and one person has at most
``KB_MAX_UPLOADS_PER_USER`` files downloading or indexing at a time (their
further files wait for their own earlier ones): a slow link or a batch of
files from one person never holds up everyone else's uploads.

Downloads are only made from Slack's own file hosts (``https`` and
``*.slack.com``) or from the host of the configured Web API URL (a test
server). Slack answers a request without a valid token with **200 and an HTML
sign-in page**; such a body where a document was expected is a failed
download and is never ingested, and so is a body shorter than the size Slack's
file object gives (cut short on the way).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import secrets
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import PurePosixPath
from typing import Any, TypeVar
from urllib.parse import urljoin, urlsplit

import aiohttp
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import Access, AccessCheckUnavailable, Person, Where
from bot.slack.approvals import Approvals
from bot.slack.blocks import Rendered, escape, is_user_id, linked, render_upload_status
from bot.slack.config import SlackConfig
from bot.slack.deliveries import Claim, Deliveries
from bot.slack.people import channel_readers
from bot.slack.reply import SLACK_FAILURES, slack_failure
from bot.slack.words import Words, words_for
from core.answer import Engine
from core.errors import LinkSecretUnavailable
from core.lines import PersonLines, Place
from index.errors import DocumentNotFound, KBError
from index.knowledge_base import Added, KnowledgeBase
from index.models import EVERYONE, DocState, Publish
from index.names import document_name
from index.records import DocumentRow
from index.storage import APPROVAL, STATUS, Upload

log = logging.getLogger(__name__)

__all__ = [
    "DownloadFailed",
    "FairTurns",
    "Jobs",
    "SlackFile",
    "StatusMessage",
    "Uploader",
    "check_download_url",
    "download",
]

# The total deadline is KB_DOWNLOAD_TIMEOUT, applied around each file's download.
DOWNLOAD_SOCKET_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
MAX_REDIRECTS = 3
_CHUNK = 64 * 1024
_HTML_SUFFIXES = (".html", ".htm")
_BOM = b"\xef\xbb\xbf"
_T = TypeVar("_T")


class DownloadFailed(KBError):
    """A Slack file could not be downloaded; ``reason`` says why, for the person."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SlackFile:
    """The parts of a Slack file object a download needs."""

    id: str
    name: str
    mimetype: str
    filetype: str
    url: str
    size: int | None

    @classmethod
    def from_payload(cls, obj: dict[str, Any]) -> SlackFile:
        """Read a file object from an event, a view submission or ``files.info``.

        ``name`` is empty when Slack left it out (a file from another
        organisation: only its id, until ``files.info`` answers).
        """
        size = obj.get("size")
        return cls(
            id=str(obj.get("id", "")),
            name=document_name(str(obj.get("name") or obj.get("title") or "")),
            mimetype=str(obj.get("mimetype", "")),
            filetype=str(obj.get("filetype", "")),
            url=str(obj.get("url_private_download") or obj.get("url_private") or ""),
            size=int(size) if isinstance(size, int) else None,
        )

    def label(self, words: Words) -> str:
        """How the file is named to people (escaped): its name, never its id."""
        return escape(self.name) if self.name else words.UNNAMED_FILE

    @property
    def expects_html(self) -> bool:
        """Whether the person uploaded an HTML document (so an HTML body is expected)."""
        return (
            self.filetype in {"html", "htm"}
            or self.mimetype.startswith("text/html")
            or PurePosixPath(self.name).suffix.lower() in _HTML_SUFFIXES
        )


# ---------------------------------------------------------------- downloading


def check_download_url(url: str, api_url: str, *, words: Words) -> str | None:
    """Why ``url`` may not be fetched with the bot token, or ``None`` when it may.

    Allowed: ``https`` on ``*.slack.com``, or the exact scheme, host and port
    of the configured Web API URL (so a local test server works).
    """
    try:
        parts = urlsplit(url)
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:  # "https://[files.slack.com/f", a port that is no number
        return words.DOWNLOAD_BAD_URL
    if parts.scheme == "https" and host.endswith(".slack.com"):
        return None
    api = urlsplit(api_url)
    same_as_api = (
        bool(host)
        and host == (api.hostname or "").lower()
        and parts.scheme == api.scheme
        and port == api.port
    )
    return None if same_as_api else words.download_bad_host(host)


async def download(
    session: aiohttp.ClientSession,
    file: SlackFile,
    *,
    token: str,
    max_bytes: int,
    api_url: str,
    words: Words,
) -> bytes:
    """Fetch a private Slack file with the bot token (failure reasons in ``words``).

    Redirects are followed by hand so that every hop is checked against the
    allowed hosts before the token is sent to it.

    Raises:
        DownloadFailed: a foreign host, an HTTP error, a login page instead of
            the file, a file over ``max_bytes``, or a network failure.
    """
    if file.size is not None and file.size > max_bytes:
        raise DownloadFailed(words.download_too_large(max_bytes))
    url = file.url
    if not url:
        raise DownloadFailed(words.DOWNLOAD_NO_URL)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        for _ in range(MAX_REDIRECTS + 1):
            reason = check_download_url(url, api_url, words=words)
            if reason:
                raise DownloadFailed(reason)
            async with session.get(url, headers=headers, allow_redirects=False) as resp:
                if resp.status in {301, 302, 303, 307, 308} and "Location" in resp.headers:
                    url = _redirect_target(url, resp.headers["Location"], words)
                    continue
                return await _read_body(resp, file, max_bytes, words)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DownloadFailed(words.download_unreachable(type(exc).__name__)) from exc
    raise DownloadFailed(words.DOWNLOAD_TOO_MANY_REDIRECTS)


def _redirect_target(url: str, location: str, words: Words) -> str:
    """Where a redirect points; a ``Location`` that is not a URL is the download's failure."""
    try:
        return urljoin(url, location)
    except ValueError as exc:  # "https://[bad" and the like: the server's answer is malformed
        raise DownloadFailed(words.DOWNLOAD_BAD_URL) from exc


async def _read_body(
    resp: aiohttp.ClientResponse, file: SlackFile, max_bytes: int, words: Words
) -> bytes:
    if resp.status != 200:
        raise DownloadFailed(words.download_status(resp.status))
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise DownloadFailed(words.download_too_large(max_bytes))
    html_type = resp.content_type == "text/html"
    if html_type and not file.expects_html:
        raise DownloadFailed(words.DOWNLOAD_LOGIN_PAGE)
    data = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        data.extend(chunk)
        if len(data) > max_bytes:
            # Stop reading: the rest of an oversized file is never buffered.
            raise DownloadFailed(words.download_too_large(max_bytes))
    if file.size is not None and len(data) < file.size:
        # Cut short on the way (a connection closed early, with no length to tell it by):
        # Slack's file object says how long the file is, and part of it is never indexed.
        raise DownloadFailed(words.DOWNLOAD_CUT_SHORT)
    body = bytes(data)
    if file.expects_html:
        if _is_login_page(body):
            raise DownloadFailed(words.DOWNLOAD_LOGIN_PAGE)
    elif _looks_like_html(body):
        raise DownloadFailed(words.DOWNLOAD_LOGIN_PAGE)
    return body


def _looks_like_html(body: bytes) -> bool:
    head = body[:1024].removeprefix(_BOM).lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html"))


def _is_login_page(body: bytes) -> bool:
    # An HTML document was expected, so only Slack's sign-in page gives itself away.
    lower = body[:65536].lower()
    return b"<title>slack</title>" in lower or (b"<form" in lower and b"signin" in lower)


# ---------------------------------------------------------------- background jobs


class Jobs:
    """Background tasks that outlive the Slack request that started them.

    ``asyncio`` keeps only weak references to tasks, so a task nobody holds
    can be collected mid-flight; this set holds them until they finish.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
        """Run ``coro`` in the background; its failure is logged, never lost."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background job %s failed", task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def drain(self) -> None:
        """Wait until every job (including jobs started meanwhile) has finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def cancel_all(self) -> None:
        """Cancel every job and wait for them to stop (server shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)


# ---------------------------------------------------------------- status messages


@dataclass
class StatusMessage:
    """A message the bot keeps editing to show one file's progress.

    ``ts`` is ``None`` while no message could be posted; ``thread_ts`` is where
    a replacement goes when the message cannot be edited any more.
    """

    client: AsyncWebClient
    channel: str
    ts: str | None
    thread_ts: str | None = None

    async def show(self, rendered: Rendered) -> bool:
        """Replace the message's content; whether Slack took it (a progress step may be lost)."""
        if self.ts is None:
            return False
        try:
            await self.client.chat_update(channel=self.channel, ts=self.ts, **rendered.as_kwargs())
        except SLACK_FAILURES as exc:
            log.warning("status update in %s failed: %s", self.channel, slack_failure(exc))
            return False
        return True

    async def settle(self, rendered: Rendered) -> None:
        """Show a final status: edit the message, or post a new one (deleted, unreachable)."""
        if await self.show(rendered):
            return
        try:
            resp = await self.client.chat_postMessage(
                channel=self.channel, thread_ts=self.thread_ts, **rendered.as_kwargs()
            )
        except SLACK_FAILURES as exc:
            # The knowledge base holds the outcome: `kb docs` shows it, `kb retry` redoes a failure.
            log.error(
                "could not report an upload's outcome in %s (%s): %s",
                self.channel,
                slack_failure(exc),
                rendered.text,
            )
            return
        # A DM posted to a user id answers with the DM's channel: the one its clicks name.
        self.channel = str(resp.get("channel") or self.channel)
        self.ts = str(resp["ts"])


async def post_status(
    client: AsyncWebClient,
    rendered: Rendered,
    *,
    channel: str,
    thread_ts: str | None = None,
    fallback_user: str | None = None,
) -> StatusMessage:
    """Post a status message in ``channel``, or DM ``fallback_user`` if the bot may not post there.

    When Slack takes neither, the status has no message yet: the work goes on
    and its outcome is posted when it is known.
    """
    places = [(channel, thread_ts)] + ([(fallback_user, None)] if fallback_user else [])
    for where, thread in places:
        try:
            resp = await client.chat_postMessage(
                channel=where, thread_ts=thread, **rendered.as_kwargs()
            )
        except SLACK_FAILURES as exc:
            log.info("cannot post a status in %s: %s", where, slack_failure(exc))
            continue
        return StatusMessage(client, str(resp["channel"]), str(resp["ts"]), thread)
    return StatusMessage(client, places[-1][0], None, places[-1][1])


class FairTurns:
    """At most ``slots`` documents indexed at once, handed out round-robin across people.

    While there is more than one slot, nobody holds all of them: one person's
    slow document (or batch) always leaves a slot for someone else's.
    """

    def __init__(self, slots: int) -> None:
        self.slots = max(1, slots)
        self.per_person = max(1, self.slots - 1)
        self._busy = 0
        self._held: Counter[str] = Counter()
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}  # waiting people, in turn order

    @property
    def busy(self) -> int:
        """How many slots are taken."""
        return self._busy

    @contextlib.asynccontextmanager
    async def hold(
        self, who: str, *, on_wait: Callable[[], Awaitable[Any]] | None = None
    ) -> AsyncIterator[None]:
        """Hold one slot for ``who``; ``on_wait`` is awaited first when it must wait."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(who, deque()).append(turn)
        self._dispatch()
        try:
            if not turn.done() and on_wait is not None:
                await on_wait()
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():
                self._release(who)  # granted, then cancelled: give it back
            else:
                turn.cancel()
                self._forget(who, turn)
            raise
        try:
            yield
        finally:
            self._release(who)

    def _dispatch(self) -> None:
        while self._busy < self.slots:
            who = next((w for w in self._queues if self._held[w] < self.per_person), None)
            if who is None:
                return
            queue = self._queues.pop(who)
            turn = queue.popleft()
            if queue:
                self._queues[who] = queue  # to the back of the turn order
            if turn.done():  # cancelled while waiting
                continue
            turn.set_result(None)
            self._busy += 1
            self._held[who] += 1

    def _forget(self, who: str, turn: asyncio.Future[None]) -> None:
        queue = self._queues.get(who)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._queues[who]

    def _release(self, who: str) -> None:
        self._busy -= 1
        self._held[who] -= 1
        if self._held[who] <= 0:
            del self._held[who]
        self._dispatch()


# ---------------------------------------------------------------- ingestion

# Of the documents an upload repeats, the first this many of its copies (the newest) and
# of its near-copies (the most alike) are named.
MAX_REPEATS_NAMED = 3

# A takeover that finds a file's indexing already started this many times fails it
# (retryable) instead of indexing it again: a document that kills the process
# indexing it must not kill every replica in turn.
MAX_ATTEMPTS = 3

# The states an upload's indexing ends in (``replaced``: a newer version was added meanwhile).
_ENDED = (DocState.INDEXED, DocState.AWAITING_APPROVAL, DocState.FAILED, DocState.REPLACED)


@dataclass(frozen=True)
class UploadRequest:
    """Who added which files where, and how they may become searchable (``Roles.publish_mode``)."""

    channel: str
    user: str
    scope: str
    publish: Publish
    words: Words  # the uploader's: every status of these files is theirs to read
    title: str | None = None
    thread_ts: str | None = None
    retry: bool = False  # a Retry of a stored document, not a new file

    def record(self, obj: dict[str, Any], *, title: str | None) -> dict[str, Any]:
        """What resuming the file ``obj`` of this request takes (``index.storage.uploads``)."""
        return {
            "channel": self.channel,
            "user": self.user,
            "scope": self.scope,
            "publish": self.publish.value,
            "language": self.words.lang,
            "title": title,
            "thread_ts": self.thread_ts,
            "retry": self.retry,
            "file": asdict(SlackFile.from_payload(obj)),
        }


def _resumable(upload: Upload, default_language: str) -> tuple[UploadRequest, SlackFile]:
    """The request and the file an upload was recorded with (``UploadRequest.record``).

    Raises:
        KeyError, TypeError, ValueError: a record this code cannot read.
    """
    record = upload.request
    try:
        words = words_for(str(record["language"]))
    except KeyError:  # a catalog since removed
        words = words_for(default_language)
    request = UploadRequest(
        channel=str(record["channel"]),
        user=str(record["user"]),
        scope=str(record["scope"]),
        publish=Publish(record["publish"]),
        words=words,
        title=record.get("title"),
        thread_ts=record.get("thread_ts"),
        retry=bool(record.get("retry")),
    )
    return request, SlackFile(**record["file"])


class Uploader:
    """Downloads Slack files and indexes them in the background, reporting each step.

    Indexing runs in ``asyncio.to_thread``, at most ``KB_EXTRACT_WORKERS``
    documents at once, shared fairly between people (``FairTurns``): reading
    happens in reader processes, embedding is CPU-bound, and the bound keeps
    questions responsive while uploads proceed.
    Downloads are network-bound and run beside it, at most
    ``config.max_uploads_per_user`` per person, each within
    ``config.download_timeout`` seconds.

    An upload is done when each of its files is indexed, or failed with its
    uploader told. Until then the claim on the delivery that brought it (a
    Slack event, a ``/kb-upload`` submission) is held and renewed
    (``bot.slack.deliveries``), and its files are recorded in the store
    (``index.storage.uploads``) with each step reached: a process that takes
    the claim over after this one died (``take_over``) edits the same status
    message and finishes the same document.

    Args:
        kb: the knowledge base.
        config: the bot token (downloads are authenticated), the Web API URL and the upload limits.
        jobs: where background work is held.
        approvals: asks the admins about documents that need their approval.
        deliveries: the claims on deliveries, shared by every process on the store.
        access: who may read which of the documents an upload repeats.
        engine: signs the links to them.
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        config: SlackConfig,
        jobs: Jobs,
        approvals: Approvals,
        deliveries: Deliveries,
        access: Access,
        engine: Engine,
    ) -> None:
        self.kb = kb
        self.config = config
        self.jobs = jobs
        self.approvals = approvals
        self.deliveries = deliveries
        self.access = access
        self.engine = engine
        self._session: aiohttp.ClientSession | None = None
        limits = kb.config.extract
        self._turns = FairTurns(limits.pool_size if limits is not None else 1)
        self._slots = PersonLines(config.max_uploads_per_user)
        # Threads of their own, one per turn: documents indexed for minutes never take the
        # threads every question, /readyz and each step of an upload wait for.
        self._indexers: ThreadPoolExecutor | None = None
        # Each document indexed by one upload at a time; how many uploads want each lock.
        self._documents: dict[int, tuple[asyncio.Lock, int]] = {}

    async def start(self) -> None:
        """Open the HTTP session used for downloads."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=DOWNLOAD_SOCKET_TIMEOUT)

    async def close(self) -> None:
        """Close the HTTP session; the indexing threads end with the document they index."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._indexers is not None:
            self._indexers.shutdown(wait=False)
            self._indexers = None

    async def _indexing(self, work: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """``work`` run in an indexing thread (``asyncio.to_thread``, on the uploads' own)."""
        if self._indexers is None:
            self._indexers = ThreadPoolExecutor(self._turns.slots, thread_name_prefix="kb-index")
        call = functools.partial(contextvars.copy_context().run, work, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._indexers, call)

    async def ingest(
        self,
        client: AsyncWebClient,
        files: list[dict[str, Any]],
        request: UploadRequest,
        claim: Claim | None = None,
    ) -> list[asyncio.Task[Any]]:
        """Post a ``queued`` status per file and start its background ingestion.

        ``claim`` is the delivery that brought the files (a claim of their own
        when none: a ``/kb-upload`` submission is never redelivered); it is held
        until every file is done. When that delivery's files were recorded
        already (a redelivery taking over from a process that died), those are
        resumed instead.
        """
        claim = claim or await self.deliveries.take([f"upload:{secrets.token_hex(8)}"])
        if claim is None:  # a fresh key is never held: nothing to do if it were
            return []
        claim.detach()
        title = request.title if len(files) == 1 else None
        recorded = [
            (str(obj.get("id") or f"#{i}"), request.record(obj, title=title))
            for i, obj in enumerate(files)
        ]
        try:
            uploads = await asyncio.to_thread(self.kb.uploads.record, claim.keys, recorded)
        except KBError as exc:
            # A full disk: the files are uploaded all the same, without a takeover if this dies.
            log.warning("upload of %s not recorded: %s", ", ".join(claim.keys), exc)
            uploads = [Upload(min(claim.keys), key, claim.keys, rec) for key, rec in recorded]
        return await self._start(client, claim, uploads)

    async def take_over(self, client: AsyncWebClient) -> int:
        """Resume the uploads whose claims nobody renews (their process died); how many deliveries.

        Each is claimed first: of several processes sweeping at once, one takes it.
        """
        lapsed = await asyncio.to_thread(
            self.kb.uploads.lapsed, lease_seconds=self.deliveries.lease_seconds
        )
        taken = 0
        for keys in lapsed:
            claim = await self.deliveries.take(list(keys))
            if claim is None:
                continue
            uploads = await asyncio.to_thread(self.kb.uploads.of, keys)
            log.info("taking over the upload of %s from a process that stopped", ", ".join(keys))
            await self._start(client, claim, uploads)
            taken += 1
        return taken

    async def keep_taking_over(self, client: AsyncWebClient, every: float) -> None:
        """``take_over`` now (a restart after a crash), then every ``every`` seconds.

        Slack redelivers an event at most three times, and a ``/kb-upload``
        submission never: this is what finishes a dead process's uploads.
        """
        failing = False
        while True:
            try:
                await self.take_over(client)
            except Exception:  # the next round may succeed: keep sweeping
                if not failing:
                    log.warning("cannot look for uploads to take over", exc_info=True)
                failing = True
            else:
                failing = False
            await asyncio.sleep(every)

    async def _start(
        self, client: AsyncWebClient, claim: Claim, uploads: list[Upload]
    ) -> list[asyncio.Task[Any]]:
        """Start each file not done yet; the claim ends once they all have."""
        tasks = []
        for upload in uploads:
            if upload.done:
                continue
            try:
                request, file = _resumable(upload, self.config.default_language)
            except (KeyError, TypeError, ValueError) as exc:
                log.error("upload of %s cannot be resumed (%r); dropped", upload.file_id, exc)
                await self._note(self.kb.uploads.settle, upload)
                continue
            # The person's place is taken now, in the order the files came.
            place = self._slots.take(request.user)
            try:
                status = await self._status(client, upload, request, file)
                coro = self._ingest_one(claim, status, upload, request, file, place)
                task = self.jobs.spawn(coro, name=f"ingest {upload.file_id}")
            except BaseException:
                place.leave()  # no task will: the person's next upload must not wait for it
                raise
            # A task cancelled before its first step never reaches its own ``finally``.
            task.add_done_callback(place.leave)
            tasks.append(task)
        self.jobs.spawn(self._hold(claim, tasks), name=f"hold {', '.join(claim.keys)}")
        return tasks

    async def _status(
        self, client: AsyncWebClient, upload: Upload, request: UploadRequest, file: SlackFile
    ) -> StatusMessage:
        """The file's status message: the one already posted for it, or a new ``queued`` one."""
        if upload.status_channel and upload.status_ts:
            return StatusMessage(
                client, upload.status_channel, upload.status_ts, thread_ts=request.thread_ts
            )
        words = request.words
        status = await post_status(
            client,
            render_upload_status(words.upload_queued(file.label(words)), words=words),
            channel=request.channel,
            thread_ts=request.thread_ts,
            fallback_user=request.user,
        )
        if status.ts is not None:
            await self._note(self.kb.uploads.set_status, upload, status.channel, status.ts)
        return status

    async def _hold(self, claim: Claim, tasks: list[asyncio.Task[Any]]) -> None:
        """End ``claim`` once every file's task has: answered when all are done, else let go."""
        done = False
        try:
            results = await asyncio.gather(*tasks, return_exceptions=True)
            done = all(result is True for result in results)
        finally:
            # Cancelled (shutting down) or a file not done: another process takes it over.
            await (claim.finish() if done else claim.let_go())

    async def retry(self, status: StatusMessage, document_id: int, words: Words) -> None:
        """Index a failed document again from its stored original and report on ``status``
        (in ``words``, the clicker's).

        A Retry on its status message is an upload of its own until it is done: claimed,
        recorded and, if this process dies, finished by the one that takes it over.
        """
        try:
            row = await asyncio.to_thread(self.kb.document, document_id)
        except DocumentNotFound:
            # Removed meanwhile (by an admin, or failed documents expiring).
            await status.settle(render_upload_status(words.RETRY_GONE, words=words))
            return
        if document_id in self._documents:
            # An upload of the same bytes indexes it here now: what it made of it is told.
            waiting = render_upload_status(words.upload_waiting(escape(row.name)), words=words)
            try:
                async with self._one_upload_at_a_time(document_id, lambda: status.show(waiting)):
                    row = await asyncio.to_thread(self.kb.document, document_id)
            except DocumentNotFound:
                await status.settle(render_upload_status(words.RETRY_GONE, words=words))
                return
        if row.state not in (DocState.FAILED, DocState.PENDING):
            # Decided meanwhile (a retry never publishes nor brings back a version).
            await status.settle(_settled_status(row, words))
            return
        row = await self._publishing_now(status.client, row)
        if status.ts is None:  # reported elsewhere (the Home tab): nothing to resume
            await self._retry_here(status, row, words)
            return
        claim = await self.deliveries.take([f"retry:{secrets.token_hex(8)}"])
        if claim is None:  # a fresh key is never held
            return
        claim.detach()
        request = UploadRequest(
            status.channel, row.uploader, row.scope, row.publish, words, retry=True
        )
        recorded = [(str(row.id), request.record({"name": row.name}, title=None))]
        try:
            [upload] = await asyncio.to_thread(self.kb.uploads.record, claim.keys, recorded)
            await asyncio.to_thread(self.kb.uploads.set_status, upload, status.channel, status.ts)
            await asyncio.to_thread(self.kb.uploads.set_document, upload, row.id)
        except KBError as exc:  # a full disk: retried all the same, unguarded if this dies
            log.warning("retry of document %s not recorded: %s", row.id, exc)
            await claim.let_go()
            await self._retry_here(status, row, words)
            return
        upload = replace(
            upload, status_channel=status.channel, status_ts=status.ts, document_id=row.id
        )
        # Awaited: the Retry's caller reports once it is done (failures are the task's to log).
        await asyncio.gather(
            *await self._start(status.client, claim, [upload]), return_exceptions=True
        )

    async def _publishing_now(self, client: AsyncWebClient, row: DocumentRow) -> DocumentRow:
        """``row``, to be retried, with the publishing rule its uploader has now when they lost
        the one it was uploaded with (a publisher no more): a Retry, days later perhaps, never
        adds a document for everyone on a right taken away since."""
        if row.publish != Publish.DIRECT or not is_user_id(row.uploader):
            return row  # a synced source's, or the operator's (`kb ingest`)
        now = await self.approvals.roles.publish_mode(client, row.uploader, row.scope)
        if now == Publish.DIRECT:
            return row
        return await asyncio.to_thread(self.kb.narrow_publishing, row.id, now)

    async def _retry_here(self, status: StatusMessage, row: DocumentRow, words: Words) -> None:
        """Retry ``row`` in this task, reporting on ``status`` (no claim, no record)."""
        name = escape(row.name)
        async with self._turns.hold(row.uploader):
            await status.show(render_upload_status(words.upload_indexing(name), words=words))
            try:
                row = await self._indexing(self.kb.retry, row.id)
            except DocumentNotFound:
                # Removed while the retry waited for its turn.
                await status.settle(render_upload_status(words.RETRY_GONE, words=words))
                return
        await status.settle(await self._final_status(status, row, words))
        await _remember(self.kb, status, row.id)

    async def _check_adder(self, request: UploadRequest) -> None:
        """Refuse, before anything is read, an uploader who may not read what they add to (the
        access rule): the same bytes already there would tell them of a document they may not
        read.

        A document for everyone is added only by someone who reads those (never a guest of
        the workspace); a channel's by one of its members, which Slack checked: only they
        run a command there.

        Raises:
            _NotAReader: they may not, or nobody can say now whether they may (unknown is
                hidden: that is said, so that they send the file again, not told they are a
                guest).
        """
        if request.scope != EVERYONE:
            return
        try:
            decision = await self.access.may_read(Person(request.user), EVERYONE)
        except AccessCheckUnavailable as exc:
            log.warning(
                "whether %s reads the documents for everyone is unknown: %s", request.user, exc
            )
            raise _NotAReader(unknown=True) from exc
        if not decision.allowed:
            log.info("%s may not add a document for everyone: %s", request.user, decision.reason)
            raise _NotAReader(unknown=decision.unknown)

    async def _ingest_one(
        self,
        claim: Claim,
        status: StatusMessage,
        upload: Upload,
        request: UploadRequest,
        file: SlackFile,
        place: Place,
    ) -> bool:
        """Take one file as far as it goes; whether it is done (``False``: taken over meanwhile).

        ``place`` is the file's place in its person's line of uploads.
        """
        words = request.words
        document_id = upload.document_id
        attempts = await self._note(self.kb.uploads.started, upload)
        try:
            if document_id is None:
                await self._check_adder(request)
            async with self._user_slot(place, status, file, words):
                waiting = render_upload_status(words.upload_waiting(file.label(words)), words=words)
                if document_id is None:
                    file, data = await self._fetch(status.client, status, file, words)
                    added = await self._add(data, file, request)
                    document_id = added.document.id
                    await self._note(self.kb.uploads.set_document, upload, document_id)
                    final = await self._index(status, added, request.user, words, waiting)
                else:
                    # A Retry, or stored by a process that stopped: from the stored original.
                    again = attempts is None or attempts <= MAX_ATTEMPTS
                    retry = request.retry and (attempts or 1) == 1
                    final = await self._resume(
                        status,
                        document_id,
                        request.user,
                        words,
                        waiting,
                        again=again,
                        retry=retry,
                    )
        except _NotAReader as exc:
            refused = words.upload_reader_unknown if exc.unknown else words.upload_not_a_reader
            final = render_upload_status(refused(file.label(words)), words=words)
        except DownloadFailed as exc:
            log.info("download of %s failed: %s", file.id, exc.reason)
            text = words.upload_failed(file.label(words), escape(exc.reason))
            final = render_upload_status(text + "\n" + words.UPLOAD_AGAIN, words=words)
        except KBError as exc:
            # Refused on purpose (a full disk, the free-space floor...): the reason is the message.
            log.warning("ingesting Slack file %s failed: %s", file.id, exc)
            final = _unexpected_status(file.label(words), exc, document_id, words)
        except Exception as exc:
            # The request that started this job is long answered: report here, not to bolt.
            log.exception("ingesting Slack file %s failed", file.id)
            final = _unexpected_status(file.label(words), exc, document_id, words)
        if not claim.held:
            log.warning("upload of %s was taken over by another process: it reports", file.id)
            return False
        try:
            await status.settle(final)
            await _remember(self.kb, status, document_id)
        finally:
            # Even when reporting failed unexpectedly: a takeover would only fail the same way.
            await self._note(self.kb.uploads.settle, upload)
        return True

    async def _note(self, write: Callable[..., _T], *args: Any) -> _T | None:
        """One step of an upload recorded in the store; ``None`` when it could not be (logged)."""
        try:
            return await asyncio.to_thread(write, *args)
        except KBError as exc:  # a full disk: the upload goes on, unguarded if this process dies
            log.warning("upload step not recorded: %s", exc)
            return None

    @contextlib.asynccontextmanager
    async def _user_slot(
        self, place: Place, status: StatusMessage, file: SlackFile, words: Words
    ) -> AsyncIterator[None]:
        if place.waits:
            text = words.upload_waiting_for_yours(file.label(words), self._slots.per_person)
            await status.show(render_upload_status(text, words=words))
        async with place.hold():
            yield

    async def _fetch(
        self, client: AsyncWebClient, status: StatusMessage, file: SlackFile, words: Words
    ) -> tuple[SlackFile, bytes]:
        """The file's details and bytes, within the download deadline."""
        seconds = self.config.download_timeout
        shown = words.upload_downloading(file.label(words))
        await status.show(render_upload_status(shown, words=words))
        asked = False
        try:
            async with asyncio.timeout(seconds):
                file = await self._complete(client, file, words)
                asked = True
                data = await download(
                    self._http(),
                    file,
                    token=self.config.bot_token,
                    max_bytes=self.kb.config.max_upload_bytes,
                    api_url=self.config.api_url,
                    words=words,
                )
        except TimeoutError as exc:
            late = words.download_timed_out if asked else words.file_info_timed_out
            raise DownloadFailed(late(seconds)) from exc
        return file, data

    async def _add(self, data: bytes, file: SlackFile, request: UploadRequest) -> Added:
        return await asyncio.to_thread(
            self.kb.add_bytes,
            data,
            file.name,
            uploader=request.user,
            scope=request.scope,
            title=request.title,
            publish=request.publish,
        )

    async def _index(
        self,
        status: StatusMessage,
        added: Added,
        user: str,
        words: Words,
        waiting: Rendered,
    ) -> Rendered:
        """Index the stored file in one of the indexing slots (its person's turn); the same
        bytes uploaded meanwhile by someone else wait for that upload, holding no slot, and
        are told what became of it (indexed once, the admins asked once)."""
        row = added.document
        async with self._one_upload_at_a_time(row.id, lambda: status.show(waiting)) as waited:
            try:
                again = added.duplicate or waited
                if again:  # as the upload this one waited for left it (here or on a replica)
                    row = await asyncio.to_thread(self.kb.document, row.id)
                if again and row.state in (DocState.INDEXED, DocState.AWAITING_APPROVAL):
                    return _settled_status(row, words, duplicate=True)
                async with self._turns.hold(user, on_wait=lambda: status.show(waiting)):
                    shown = words.upload_indexing(escape(row.name))
                    await status.show(render_upload_status(shown, words=words))
                    row = await self._indexing(self.kb.index_document, row.id)
            except DocumentNotFound:  # removed while it was indexed (`kb rm`, an admin)
                return render_upload_status(words.RETRY_GONE, words=words)
        return await self._final_status(status, row, words, user)

    @contextlib.asynccontextmanager
    async def _one_upload_at_a_time(
        self, document_id: int, on_wait: Callable[[], Awaitable[Any]]
    ) -> AsyncIterator[bool]:
        """Hold ``document_id`` for one upload, in this process and then in the store every
        replica shares (:meth:`_indexing_claim`); ``on_wait`` is awaited first (once) when it
        must wait. Yields whether it waited for another upload: the document may be decided."""
        lock, wanted = self._documents.get(document_id, (asyncio.Lock(), 0))
        self._documents[document_id] = (lock, wanted + 1)
        try:
            waited = lock.locked()
            if waited:
                await on_wait()
            claimed = self._indexing_claim(document_id, None if waited else on_wait)
            async with lock, claimed as there:
                yield waited or there
        finally:
            lock, wanted = self._documents[document_id]
            if wanted > 1:
                self._documents[document_id] = (lock, wanted - 1)
            else:
                del self._documents[document_id]

    @contextlib.asynccontextmanager
    async def _indexing_claim(
        self, document_id: int, on_wait: Callable[[], Awaitable[Any]] | None
    ) -> AsyncIterator[bool]:
        """The store's claim on indexing ``document_id``; yields whether another replica held it.

        The same bytes shared to two replicas at once are one document: the replica
        that claims it first indexes it, and the other waits, asking again every third
        of the lease (``KB_SLACK_CLAIM_LEASE``), until the holder lets go (done, however
        it ended) or its claim lapses (its process died: this one takes over). A store
        that cannot record the claim is logged and the document indexed all the same.
        """
        keys = [f"indexing:{document_id}"]
        claim = await self.deliveries.take(keys)
        waited = claim is None
        if waited and on_wait is not None:
            await on_wait()
        while claim is None:
            await self.deliveries.sleep(self.deliveries.lease_seconds / 3)
            claim = await self.deliveries.take(keys)
        try:
            yield waited
        finally:
            await claim.let_go()

    async def _resume(
        self,
        status: StatusMessage,
        document_id: int,
        user: str,
        words: Words,
        waiting: Rendered,
        *,
        again: bool,
        retry: bool,
    ) -> Rendered:
        """What becomes of a stored document: retried (a failure indexed again), or resumed
        where another process left it (``KnowledgeBase.resume``). An upload of the same
        bytes indexing it meanwhile is waited for, and what it made of it told."""
        try:
            async with self._one_upload_at_a_time(
                document_id, lambda: status.show(waiting)
            ) as waited:
                row = await asyncio.to_thread(self.kb.document, document_id)
                if waited and row.state in (DocState.INDEXED, DocState.AWAITING_APPROVAL):
                    return await self._final_status(status, row, words, user)  # decided meanwhile
                async with self._turns.hold(user, on_wait=lambda: status.show(waiting)):
                    shown = words.upload_indexing(escape(row.name))
                    await status.show(render_upload_status(shown, words=words))
                    if retry:
                        row = await self._indexing(self.kb.retry, document_id)
                    else:
                        row = await self._indexing(self.kb.resume, document_id, again=again)
        except DocumentNotFound:  # removed meanwhile
            return render_upload_status(words.RETRY_GONE, words=words)
        if row.state in _ENDED:
            return await self._final_status(status, row, words, user)
        return _settled_status(row, words)

    async def _final_status(
        self, status: StatusMessage, row: DocumentRow, words: Words, user: str | None = None
    ) -> Rendered:
        """What became of a document just indexed; asks for an approval when it needs one.

        ``user``: who uploaded it, told of the documents it repeats that they may read
        where the status is shown; ``None``: nobody is (a Retry).
        """
        name = escape(row.name)
        if row.state == DocState.FAILED:
            # The index layer's reason: an English sentence inside the translated frame.
            reason = escape(row.failure_reason or "") or words.UNKNOWN_REASON
            return render_upload_status(
                words.upload_failed(name, reason), words=words, retry_document_id=row.id
            )
        if row.state == DocState.REPLACED:
            # Indexed after a version added since: that one answers (``KnowledgeBase``).
            text = words.upload_indexed(name, row.chunk_count)
            return _with_notes(text, [words.UPLOAD_KEPT_EARLIER], words)
        placement = await asyncio.to_thread(self.kb.placement, row.id)
        if row.state == DocState.AWAITING_APPROVAL:
            # Asked already by a process that stopped before it reported: not asked twice.
            asked = await asyncio.to_thread(self.kb.messages.of, row.id, APPROVAL)
            delivered = bool(asked) or await self.approvals.request(
                status.client, placement, status_channel=status.channel, status_ts=status.ts or ""
            )
            notes = [words.UPLOAD_AWAITING_REPLACES] if placement.beside else []
            notes += [] if delivered else [words.UPLOAD_AWAITING_NOBODY]
            notes += await self._repeats(row, user, status, words)
            return _with_notes(words.upload_awaiting(name, row.chunk_count), notes, words)
        notes = [words.UPLOAD_REPLACED] if placement.replaced else []
        notes += [words.UPLOAD_BESIDE] if placement.beside else []
        notes += await self._repeats(row, user, status, words)
        return _with_notes(words.upload_indexed(name, row.chunk_count), notes, words)

    async def _repeats(
        self, row: DocumentRow, user: str | None, status: StatusMessage, words: Words
    ) -> list[str]:
        """The notes that ``row`` repeats documents ``user`` may read where ``status`` is: its
        copies, then its near-copies (``KnowledgeBase.repeats_of``); none else.

        The status is read by everyone in its channel (``user`` alone in a DM): a document
        is named only when the rule lets them all read it (``Access.may_read`` at
        that place), so no upload ever tells of a document hidden from its reader.
        """
        if not user:
            return []
        try:
            found = await asyncio.to_thread(self.kb.repeats_of, [row.id])
        except KBError as exc:  # the upload stands; only the note is lost
            log.warning("copies of document %s not looked up: %s", row.id, exc)
            return []
        if row.id not in found:
            return []
        where = await channel_readers(status.client, status.channel)
        same = await self._readable(found[row.id].same, Person(user), where)
        near = await self._readable(found[row.id].near, Person(user), where)
        notes = [words.upload_repeats(self._named(same), len(same))] if same else []
        return notes + ([words.upload_near_copies(self._named(near), len(near))] if near else [])

    async def _readable(
        self, docs: list[DocumentRow], person: Person, where: Where | None
    ) -> list[DocumentRow]:
        """The first ``MAX_REPEATS_NAMED`` of ``docs`` everyone reading at ``where`` may read."""
        readable: list[DocumentRow] = []
        for doc in docs:
            try:
                decision = await self.access.may_read(person, doc, where)
            except AccessCheckUnavailable:
                continue  # unknown is hidden
            if decision.allowed:
                readable.append(doc)
            if len(readable) == MAX_REPEATS_NAMED:
                break
        return readable

    def _named(self, docs: list[DocumentRow]) -> str:
        """``docs``' titles in bold, each linked to its viewer page."""
        return ", ".join(linked(self._link(d), f"*{escape(d.title or d.name)}*") for d in docs)

    def _link(self, doc: DocumentRow) -> str:
        """The viewer link to ``doc``; ``""`` while links cannot be signed (its title alone)."""
        try:
            return self.engine.document_link(doc)
        except LinkSecretUnavailable as exc:
            log.warning("a repeated document is named without its link: %s", exc)
            return ""

    async def _complete(self, client: AsyncWebClient, file: SlackFile, words: Words) -> SlackFile:
        """Ask ``files.info`` for the download link (and name) when an event left it out."""
        if file.url or not file.id:
            return file
        try:
            resp = await client.files_info(file=file.id)
        except SLACK_FAILURES as exc:
            raise DownloadFailed(words.file_info_failed(slack_failure(exc))) from exc
        return SlackFile.from_payload(dict(resp["file"]))

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Uploader.start() was not awaited before downloading")
        return self._session


class _NotAReader(Exception):
    """The uploader may not read the scope their file would be added to; ``unknown``: nobody
    can say now whether they may (Slack could not be asked)."""

    def __init__(self, *, unknown: bool) -> None:
        super().__init__()
        self.unknown = unknown


async def _remember(kb: KnowledgeBase, status: StatusMessage, document_id: int | None) -> None:
    """Record ``status`` as the document's status message: its Retry edits this one, no other."""
    if document_id is None or status.ts is None:
        return
    try:
        await asyncio.to_thread(kb.messages.record, document_id, STATUS, status.channel, status.ts)
    except KBError as exc:  # a full disk: the Retry is refused, the upload's outcome stands
        log.warning("status message of document %s not recorded: %s", document_id, exc)


def _unexpected_status(
    label: str, exc: Exception, document_id: int | None, words: Words
) -> Rendered:
    """A failure nobody planned for: its reason when it has one for people, and a Retry once stored.

    A ``KBError``'s reason is the index layer's English sentence, shown inside the
    translated status."""
    reason = escape(str(exc)) if isinstance(exc, KBError) else words.UPLOAD_UNEXPECTED
    text = words.upload_failed(label, reason)
    if document_id is None:
        return render_upload_status(text + "\n" + words.UPLOAD_AGAIN, words=words)
    return render_upload_status(text, words=words, retry_document_id=document_id)


def _with_notes(text: str, notes: list[str], words: Words) -> Rendered:
    return render_upload_status(" ".join([text, *notes]), words=words)


def _settled_status(row: DocumentRow, words: Words, *, duplicate: bool = False) -> Rendered:
    """The status of a document that this upload or retry leaves as it is."""
    name = escape(row.name)
    if row.state == DocState.AWAITING_APPROVAL:
        return render_upload_status(words.upload_awaiting_duplicate(name), words=words)
    if row.state == DocState.INDEXED:
        text = words.upload_duplicate if duplicate else words.upload_indexed
        return render_upload_status(text(name, row.chunk_count), words=words)
    return render_upload_status(words.upload_state(name, row.state), words=words)
