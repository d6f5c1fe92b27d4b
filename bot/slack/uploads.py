"""Slack files into the knowledge base: authenticated download, then background indexing.

A file's status message moves ``queued -> downloading -> indexing -> indexed, N
chunks`` (N is the count the server wrote) or ``failed: reason``; a document
that failed after it was stored gets a Retry button that indexes it again from
the stored original.

Downloads are only made from Slack's own file hosts (``https`` and
``*.slack.com``) or from the host of the configured Web API URL (a test
server). Slack answers a request without a valid token with **200 and an HTML
sign-in page**; such a body where a document was expected is a failed
download and is never ingested.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import messages
from bot.slack.approvals import Approvals
from bot.slack.config import SlackConfig
from bot.slack.render import Rendered, escape, render_upload_status
from index.errors import KBError
from index.knowledge_base import KnowledgeBase
from index.models import DocState, Publish
from index.names import display_name
from index.records import DocumentRow

log = logging.getLogger(__name__)

__all__ = [
    "DownloadFailed",
    "Jobs",
    "SlackFile",
    "StatusMessage",
    "Uploader",
    "check_download_url",
    "download",
]

DEFAULT_DOWNLOAD_TIMEOUT = aiohttp.ClientTimeout(total=300, sock_connect=10, sock_read=60)
MAX_REDIRECTS = 3
_CHUNK = 64 * 1024
_HTML_SUFFIXES = (".html", ".htm")
_BOM = b"\xef\xbb\xbf"


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
        """Read a file object from an event, a view submission or ``files.info``."""
        size = obj.get("size")
        return cls(
            id=str(obj.get("id", "")),
            name=display_name(str(obj.get("name") or obj.get("title") or obj.get("id") or ""))
            or "document",
            mimetype=str(obj.get("mimetype", "")),
            filetype=str(obj.get("filetype", "")),
            url=str(obj.get("url_private_download") or obj.get("url_private") or ""),
            size=int(size) if isinstance(size, int) else None,
        )

    @property
    def expects_html(self) -> bool:
        """Whether the person uploaded an HTML document (so an HTML body is expected)."""
        return (
            self.filetype in {"html", "htm"}
            or self.mimetype.startswith("text/html")
            or PurePosixPath(self.name).suffix.lower() in _HTML_SUFFIXES
        )


# ---------------------------------------------------------------- downloading


def check_download_url(url: str, api_url: str) -> str | None:
    """Why ``url`` may not be fetched with the bot token, or ``None`` when it may.

    Allowed: ``https`` on ``*.slack.com``, or the exact scheme, host and port
    of the configured Web API URL (so a local test server works).
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme == "https" and host.endswith(".slack.com"):
        return None
    api = urlsplit(api_url)
    same_as_api = (
        bool(host)
        and host == (api.hostname or "").lower()
        and parts.scheme == api.scheme
        and parts.port == api.port
    )
    return None if same_as_api else messages.download_bad_host(host)


async def download(
    session: aiohttp.ClientSession,
    file: SlackFile,
    *,
    token: str,
    max_bytes: int,
    api_url: str,
) -> bytes:
    """Fetch a private Slack file with the bot token.

    Redirects are followed by hand so that every hop is checked against the
    allowed hosts before the token is sent to it.

    Raises:
        DownloadFailed: a foreign host, an HTTP error, a login page instead of
            the file, a file over ``max_bytes``, or a network failure.
    """
    if file.size is not None and file.size > max_bytes:
        raise DownloadFailed(messages.download_too_large(max_bytes))
    url = file.url
    if not url:
        raise DownloadFailed(messages.DOWNLOAD_NO_URL)
    headers = {"Authorization": f"Bearer {token}"}
    try:
        for _ in range(MAX_REDIRECTS + 1):
            reason = check_download_url(url, api_url)
            if reason:
                raise DownloadFailed(reason)
            async with session.get(url, headers=headers, allow_redirects=False) as resp:
                if resp.status in {301, 302, 303, 307, 308} and "Location" in resp.headers:
                    url = urljoin(url, resp.headers["Location"])
                    continue
                return await _read_body(resp, file, max_bytes)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DownloadFailed(messages.download_unreachable(type(exc).__name__)) from exc
    raise DownloadFailed(messages.DOWNLOAD_TOO_MANY_REDIRECTS)


async def _read_body(resp: aiohttp.ClientResponse, file: SlackFile, max_bytes: int) -> bytes:
    if resp.status != 200:
        raise DownloadFailed(messages.download_status(resp.status))
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise DownloadFailed(messages.download_too_large(max_bytes))
    html_type = resp.content_type == "text/html"
    if html_type and not file.expects_html:
        raise DownloadFailed(messages.DOWNLOAD_LOGIN_PAGE)
    data = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        data.extend(chunk)
        if len(data) > max_bytes:
            # Stop reading: the rest of an oversized file is never buffered.
            raise DownloadFailed(messages.download_too_large(max_bytes))
    body = bytes(data)
    if file.expects_html:
        if _is_login_page(body):
            raise DownloadFailed(messages.DOWNLOAD_LOGIN_PAGE)
    elif _looks_like_html(body):
        raise DownloadFailed(messages.DOWNLOAD_LOGIN_PAGE)
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
    """A message the bot keeps editing to show one file's progress."""

    client: AsyncWebClient
    channel: str
    ts: str

    async def show(self, rendered: Rendered) -> None:
        """Replace the message's content."""
        await self.client.chat_update(channel=self.channel, ts=self.ts, **rendered.as_kwargs())


async def post_status(
    client: AsyncWebClient,
    rendered: Rendered,
    *,
    channel: str,
    thread_ts: str | None = None,
    fallback_user: str | None = None,
) -> StatusMessage:
    """Post a status message in ``channel``, or DM ``fallback_user`` if the bot may not post there."""
    try:
        resp = await client.chat_postMessage(
            channel=channel, thread_ts=thread_ts, **rendered.as_kwargs()
        )
    except SlackApiError:
        if not fallback_user:
            raise
        log.info("cannot post in %s, reporting to %s by DM instead", channel, fallback_user)
        resp = await client.chat_postMessage(channel=fallback_user, **rendered.as_kwargs())
    return StatusMessage(client, str(resp["channel"]), str(resp["ts"]))


# ---------------------------------------------------------------- ingestion


@dataclass(frozen=True)
class UploadRequest:
    """Who added which files where, and how they may become searchable (``Roles.publish_mode``)."""

    channel: str
    user: str
    scope: str
    publish: Publish
    title: str | None = None
    thread_ts: str | None = None


class Uploader:
    """Downloads Slack files and indexes them in the background, reporting each step.

    Indexing runs one document at a time (``asyncio.to_thread``): embedding is
    CPU-bound, and a queue keeps questions responsive while uploads proceed.

    Args:
        kb: the knowledge base.
        config: the bot token (downloads are authenticated) and the Web API URL.
        jobs: where background work is held.
        approvals: asks the admins about documents that need their approval.
    """

    def __init__(
        self, kb: KnowledgeBase, config: SlackConfig, jobs: Jobs, approvals: Approvals
    ) -> None:
        self.kb = kb
        self.config = config
        self.jobs = jobs
        self.approvals = approvals
        self._session: aiohttp.ClientSession | None = None
        self._turn = asyncio.Semaphore(1)

    async def start(self) -> None:
        """Open the HTTP session used for downloads."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=DEFAULT_DOWNLOAD_TIMEOUT)

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def ingest(
        self, client: AsyncWebClient, files: list[dict[str, Any]], request: UploadRequest
    ) -> list[asyncio.Task[Any]]:
        """Post a ``queued`` status per file and start its background ingestion."""
        tasks = []
        title = request.title if len(files) == 1 else None
        for obj in files:
            name = escape(SlackFile.from_payload(obj).name)
            status = await post_status(
                client,
                render_upload_status(messages.upload_queued(name)),
                channel=request.channel,
                thread_ts=request.thread_ts,
                fallback_user=request.user,
            )
            coro = self._ingest_one(client, status, obj, request, title)
            tasks.append(self.jobs.spawn(coro, name=f"ingest {obj.get('id', '?')}"))
        return tasks

    async def retry(self, status: StatusMessage, document_id: int) -> None:
        """Index a failed document again from its stored original and report on ``status``."""
        row = await asyncio.to_thread(self.kb.store.document, document_id)
        if row.state not in (DocState.FAILED, DocState.PENDING):
            # Decided meanwhile (a retry never publishes nor brings back a version).
            await status.show(_settled_status(row))
            return
        name = escape(row.name)
        async with self._turn:
            await status.show(render_upload_status(messages.upload_indexing(name)))
            row = await asyncio.to_thread(self.kb.retry, document_id)
        await status.show(await self._final_status(status, row))

    async def _ingest_one(
        self,
        client: AsyncWebClient,
        status: StatusMessage,
        obj: dict[str, Any],
        request: UploadRequest,
        title: str | None,
    ) -> None:
        file = SlackFile.from_payload(obj)
        name = escape(file.name)
        try:
            async with self._turn:
                await status.show(render_upload_status(messages.upload_downloading(name)))
                data = await self._download(client, file)
                final = await self._store_and_index(status, data, file.name, request, title)
        except DownloadFailed as exc:
            log.info("download of %s failed: %s", file.id, exc.reason)
            text = messages.upload_failed(name, escape(exc.reason)) + "\n" + messages.UPLOAD_AGAIN
            final = render_upload_status(text)
        except Exception:
            # The request that started this job is long answered: report here, not to bolt.
            log.exception("ingesting Slack file %s failed", file.id)
            final = render_upload_status(messages.upload_failed(name, messages.UPLOAD_UNEXPECTED))
        with contextlib.suppress(SlackApiError):
            await status.show(final)

    async def _download(self, client: AsyncWebClient, file: SlackFile) -> bytes:
        file = await self._complete(client, file)
        return await download(
            self._http(),
            file,
            token=self.config.bot_token,
            max_bytes=self.kb.config.max_upload_bytes,
            api_url=self.config.api_url,
        )

    async def _store_and_index(
        self,
        status: StatusMessage,
        data: bytes,
        filename: str,
        request: UploadRequest,
        title: str | None,
    ) -> Rendered:
        added = await asyncio.to_thread(
            self.kb.add_bytes,
            data,
            filename,
            uploader=request.user,
            scope=request.scope,
            title=title,
            publish=request.publish,
        )
        row = added.document
        if added.duplicate and row.state in (DocState.INDEXED, DocState.AWAITING_APPROVAL):
            return _settled_status(row, duplicate=True)
        await status.show(render_upload_status(messages.upload_indexing(escape(row.name))))
        row = await asyncio.to_thread(self.kb.index_document, row.id)
        return await self._final_status(status, row)

    async def _final_status(self, status: StatusMessage, row: DocumentRow) -> Rendered:
        """What became of a document just indexed; asks for an approval when it needs one."""
        name = escape(row.name)
        if row.state == DocState.FAILED:
            reason = escape(row.failure_reason or "unknown reason")
            return render_upload_status(
                messages.upload_failed(name, reason), retry_document_id=row.id
            )
        placement = await asyncio.to_thread(self.kb.placement, row.id)
        if row.state == DocState.AWAITING_APPROVAL:
            delivered = await self.approvals.request(
                status.client, placement, status_channel=status.channel, status_ts=status.ts
            )
            notes = [messages.UPLOAD_AWAITING_REPLACES] if placement.beside else []
            notes += [] if delivered else [messages.UPLOAD_AWAITING_NOBODY]
            return _with_notes(messages.upload_awaiting(name, row.chunk_count), notes)
        notes = [messages.UPLOAD_REPLACED] if placement.replaced else []
        notes += [messages.UPLOAD_BESIDE] if placement.beside else []
        return _with_notes(messages.upload_indexed(name, row.chunk_count), notes)

    async def _complete(self, client: AsyncWebClient, file: SlackFile) -> SlackFile:
        """Ask ``files.info`` for the download link when an event left it out."""
        if file.url or not file.id:
            return file
        try:
            resp = await client.files_info(file=file.id)
        except SlackApiError as exc:
            raise DownloadFailed(messages.DOWNLOAD_NO_URL) from exc
        return SlackFile.from_payload(dict(resp["file"]))

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Uploader.start() was not awaited before downloading")
        return self._session


def _with_notes(text: str, notes: list[str]) -> Rendered:
    return render_upload_status(" ".join([text, *notes]))


def _settled_status(row: DocumentRow, *, duplicate: bool = False) -> Rendered:
    """The status of a document that this upload or retry leaves as it is."""
    name = escape(row.name)
    if row.state == DocState.AWAITING_APPROVAL:
        return render_upload_status(messages.upload_awaiting_duplicate(name))
    if row.state == DocState.INDEXED:
        text = messages.upload_duplicate if duplicate else messages.upload_indexed
        return render_upload_status(text(name, row.chunk_count))
    return render_upload_status(messages.upload_state(name, row.state))
