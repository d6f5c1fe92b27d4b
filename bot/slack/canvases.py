"""A channel's canvases as documents of that channel, kept in sync with Slack.

Which canvases (``KB_CANVAS_CHANNELS`` names the channels): the channel canvas
(``conversations.info``: ``properties.canvas.file_id``, and canvas tabs in
``properties.tabs``) and the canvases ``files.list`` lists for the channel with
``types=canvas``, page by page. Each is read whole with ``canvases.getContent``
(markdown, scope ``canvases:read``) and becomes a Markdown document of the
channel: its scope is the channel id, so only the channel's members read it,
on every surface, through ``bot.access``. Its text is the canvas's title as a
heading, then the canvas's markdown; citations (``#char=a,b``) count in that
text. Its name is ``canvases-<channel> › <canvas id>.md`` (an id: titles change
and repeat), its title the canvas's, and the channel's sync record keeps each
canvas's permalink. It is credited to its source (``source:canvases-<channel>``,
as a Confluence page is to its: ``index.models.source_uploader``), which no
upload is: an upload of the same name in the channel is a document beside it,
never its new version, and a canvas never replaces an upload.

A sync of a channel is ``index.sync.listed``'s: content unchanged, nothing is
indexed again (its sha256); changed, the new version replaces the old one
through the upload path (a version that fails, over the size limit say, leaves
the old one searchable and is reported); ``canvas_not_found`` (deleted, or the
bot may no longer view it) or gone from the listing, its document is removed.
A channel whose listing fails (``missing_scope``, ``channel_not_found``, Slack
still rate-limiting after the client waited its ``Retry-After`` twice) removes
nothing and says why. A canvas's text is a document's text like any other:
hostile to whoever quotes it, and escaped where it is quoted
(``core.quoting``, ``bot.slack.blocks.mrkdwn``).

When: every ``KB_CANVAS_SYNC_SECONDS`` in ``kb serve`` (and at start), on
``file_change`` and ``file_deleted`` events for a canvas of a synced channel,
and with ``kb canvases sync``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.access import retry_after, slack_error
from bot.slack.uploads import Jobs
from index.errors import KBError
from index.knowledge_base import KnowledgeBase
from index.models import source_uploader
from index.names import display_name
from index.sync import ItemFailed, ItemGone, ListedItem, SourceReport, SyncSource, sync_listed

log = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = [
    "Canvas",
    "CanvasListingFailed",
    "Canvases",
    "canvas_document",
    "list_canvases",
    "source_of",
]

# files.list pages by page and count (at most 100 a page in Slack's docs); a channel
# with more than 50 pages of canvases is cut there, and nothing is removed then.
FILES_PER_PAGE = 100
MAX_FILE_PAGES = 50
# What files.list and files.info call a canvas's type.
_CANVAS_TYPES = frozenset({"canvas", "quip"})
MAX_TITLE_CHARS = 200


class CanvasListingFailed(KBError):
    """Slack would not say which canvases a channel has; nothing of it was changed."""


@dataclass(frozen=True)
class Canvas:
    """A canvas of a channel: its file id, its title and the link people open it with."""

    id: str
    title: str
    permalink: str


def source_of(channel: str) -> SyncSource:
    """The sync source of ``channel``'s canvases: documents of that channel, credited to the source."""
    source_id = f"canvases-{channel}"
    return SyncSource(
        id=source_id,
        scope=channel,
        # A source's credit, which no upload has: an upload named like a canvas never
        # replaces it, nor does a canvas an upload (index.knowledge_base).
        uploader=source_uploader(source_id),
        origin=f"Slack canvases of {channel}",
    )


def canvas_document(title: str, markdown: str) -> bytes:
    """A canvas as a Markdown document: its title as a heading (unless it starts with it), its text."""
    heading = f"# {title}" if title else ""
    if not heading or markdown.lstrip().startswith(heading):
        return markdown.encode("utf-8")
    return f"{heading}\n\n{markdown}".encode()


def _title(file: dict[str, Any]) -> str:
    raw = str(file.get("title") or file.get("name") or "")
    return display_name(" ".join(raw.split()), MAX_TITLE_CHARS) or "Canvas"


def _canvas(file: dict[str, Any]) -> Canvas:
    return Canvas(str(file["id"]), _title(file), str(file.get("permalink") or ""))


def _is_canvas(file: dict[str, Any]) -> bool:
    return str(file.get("filetype") or "") in _CANVAS_TYPES and bool(file.get("id"))


def _property_ids(channel: object, channel_id: str) -> list[str]:
    """The channel canvas's file id and those of canvas tabs, from ``conversations.info``.

    Raises:
        CanvasListingFailed: a part of another shape than Slack documents (a canvas left
            unread would be removed as gone).
    """
    channel = _shaped(channel or {}, dict, "conversations.info's channel", channel_id)
    props = _shaped(channel.get("properties") or {}, dict, "its properties", channel_id)
    ids = []
    canvas = _shaped(props.get("canvas") or {}, dict, "its canvas", channel_id)
    if canvas.get("file_id") and not canvas.get("is_empty"):
        ids.append(str(canvas["file_id"]))
    for tab in _shaped(props.get("tabs") or [], list, "its tabs", channel_id):
        tab = _shaped(tab, dict, "a tab", channel_id)
        data = _shaped(tab.get("data") or {}, dict, "a tab's data", channel_id)
        if tab.get("type") == "canvas" and data.get("file_id"):
            ids.append(str(data["file_id"]))
    return ids


def _page_count(resp: Any, channel: str) -> int:
    """How many pages ``files.list`` says it has (``paging.pages``; none said: one).

    Raises:
        CanvasListingFailed: not a number.
    """
    paging = _shaped(resp.get("paging") or {}, dict, "files.list's paging", channel)
    try:
        return int(paging.get("pages") or 1)
    except (TypeError, ValueError):
        raise CanvasListingFailed(_of_another_shape("files.list's page count", channel)) from None


def _shaped(value: Any, kind: type[T], what: str, channel: str) -> T:
    """``value`` when it is a ``kind``.

    Raises:
        CanvasListingFailed: it is not.
    """
    if not isinstance(value, kind):
        raise CanvasListingFailed(_of_another_shape(what, channel))
    return value


def _of_another_shape(what: str, channel: str) -> str:
    return f"Slack answered {what} for {channel} in a shape it does not document; nothing changed."


async def _listing_call(method: str, channel: str, call: Awaitable[T]) -> T:
    """Await a listing call; Slack's refusal becomes a sentence naming what to do."""
    try:
        return await call
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise CanvasListingFailed(f"Slack cannot be reached ({method}); nothing changed.") from exc
    except SlackApiError as exc:
        raise CanvasListingFailed(_refusal(method, channel, exc)) from exc


def _refusal(method: str, channel: str, exc: SlackApiError) -> str:
    error = slack_error(exc)
    if error == "missing_scope":
        needed = str(exc.response.get("needed") or "canvases:read, files:read")
        return (
            f"Slack refused {method}: the app lacks the {needed} scope. Add it to the app "
            "(deploy/ manifests) and reinstall it; nothing changed."
        )
    if error == "channel_not_found":
        return f"The bot cannot see channel {channel} ({method}): invite it; nothing changed."
    wait = retry_after(exc)
    if wait is not None:
        # The client waited out Retry-After as often as it retries: the next sync asks again.
        return (
            f"Slack still rate-limits {method} after waiting (next call in {wait:.0f} s); "
            "the next sync tries again."
        )
    return f"Slack answered {error} to {method} for {channel}; nothing changed."


async def list_canvases(client: AsyncWebClient, channel: str) -> list[Canvas]:
    """The canvases of ``channel``: its channel canvas and tabs, and ``files.list``'s canvases.

    Raises:
        CanvasListingFailed: Slack refused or could not be reached; or the listing
            is longer than ``MAX_FILE_PAGES`` pages (removing what lies past it
            would be wrong).
    """
    info = await _listing_call(
        "conversations.info", channel, client.conversations_info(channel=channel)
    )
    found: dict[str, Canvas] = {}
    for page in range(1, MAX_FILE_PAGES + 1):
        resp = await _listing_call(
            "files.list",
            channel,
            client.files_list(channel=channel, types="canvas", count=FILES_PER_PAGE, page=page),
        )
        for file in _shaped(resp.get("files") or [], list, "files.list's files", channel):
            if isinstance(file, dict) and _is_canvas(file):
                found.setdefault(str(file["id"]), _canvas(file))
        if page >= _page_count(resp, channel):
            break
    else:
        raise CanvasListingFailed(
            f"{channel} lists more than {MAX_FILE_PAGES * FILES_PER_PAGE} canvases; none removed."
        )
    for file_id in _property_ids(info.get("channel"), channel):
        if file_id not in found:
            resp = await _listing_call("files.info", channel, client.files_info(file=file_id))
            file = _shaped(resp.get("file") or {}, dict, "files.info's file", channel)
            found[file_id] = _canvas({**file, "id": file_id})
    return list(found.values())


class Canvases:
    """The canvases of the synced channels, kept in the knowledge base.

    Args:
        kb: the knowledge base.
        channels: the channels whose canvases are documents (``KB_CANVAS_CHANNELS``).
        jobs: where the syncs events start run (the server drains them on shutdown,
            and logs their failures); their own tasks otherwise.
    """

    def __init__(
        self, kb: KnowledgeBase, channels: Iterable[str], jobs: Jobs | None = None
    ) -> None:
        self.kb = kb
        self.channels = frozenset(channels)
        self.jobs = jobs or Jobs()
        self._running: dict[str, asyncio.Task[SourceReport]] = {}
        self._again: set[str] = set()

    async def sync(
        self, client: AsyncWebClient, channel: str, *, dry_run: bool = False
    ) -> SourceReport:
        """Bring ``channel``'s canvas documents in line with Slack; one report, never raises for Slack."""
        source = source_of(channel)
        try:
            canvases = await list_canvases(client, channel)
        except CanvasListingFailed as exc:
            log.warning("canvases of %s not synced: %s", channel, exc)
            return SourceReport(source.id, source.location, error=str(exc))
        loop = asyncio.get_running_loop()
        listing = {
            c.id: ListedItem(self._reader(client, c, loop), c.title, c.permalink) for c in canvases
        }
        report = await asyncio.to_thread(sync_listed, self.kb, source, listing, dry_run=dry_run)
        for key, reason in report.failed:
            log.warning("canvas %s of %s not indexed: %s", key, channel, reason)
        return report

    def _reader(
        self, client: AsyncWebClient, canvas: Canvas, loop: asyncio.AbstractEventLoop
    ) -> Any:
        """Read ``canvas`` from the sync's worker thread, on the event loop that owns the client."""

        def read() -> tuple[bytes, str]:
            future = asyncio.run_coroutine_threadsafe(_content(client, canvas), loop)
            return canvas_document(canvas.title, future.result()), "canvas.md"

        return read

    async def sync_all(
        self, client: AsyncWebClient, channels: Iterable[str] | None = None
    ) -> list[SourceReport]:
        """Sync each channel in turn (the configured ones by default)."""
        return [await self.sync(client, c) for c in sorted(channels or self.channels)]

    async def keep_syncing(self, client: AsyncWebClient, every: float) -> None:
        """Sync every channel now, then every ``every`` seconds; a failing round is logged and retried."""
        while True:
            try:
                await self.sync_all(client)
            except Exception:  # the next round may succeed: keep polling
                log.warning("canvas sync round failed; trying again in %s s", every, exc_info=True)
            await asyncio.sleep(every)

    async def on_file_event(
        self, client: AsyncWebClient, file_id: str, *, deleted: bool, shared_into: str = ""
    ) -> set[str]:
        """The channels a ``file_change``, ``file_deleted``, ``file_shared`` or
        ``file_unshared`` of ``file_id`` concerns, each synced again.

        A canvas already kept names its channel in that channel's record; a new
        one is looked up with ``files.info`` (never for a deletion: there is
        nothing to look up), and only a canvas shared in a synced channel counts.
        ``shared_into``: the synced channel it was just shared into, synced too,
        though another channel's record names it already.
        """
        channels = {c for c in self.channels if self._keeps(c, file_id)}
        if shared_into in self.channels and shared_into not in channels:
            channels = channels | await self._channels_of(client, file_id)
        elif not channels and not deleted:
            channels = await self._channels_of(client, file_id)
        for channel in channels:
            self.request(client, channel)
        return channels

    def _keeps(self, channel: str, file_id: str) -> bool:
        """Whether ``channel``'s sync record names the canvas ``file_id``."""
        raw = self.kb.store.get_meta(f"sync:{source_of(channel).id}")
        try:
            return raw is not None and file_id in (json.loads(raw).get("items") or {})
        except (ValueError, AttributeError):
            return False

    async def _channels_of(self, client: AsyncWebClient, file_id: str) -> set[str]:
        try:
            file = dict((await client.files_info(file=file_id)).get("file") or {})
        except (SlackApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.info("files.info for %s failed (%s): not synced now", file_id, type(exc).__name__)
            return set()
        if not _is_canvas(file):
            return set()
        shared = {str(c) for c in [*(file.get("channels") or []), *(file.get("groups") or [])]}
        return shared & self.channels

    def request(self, client: AsyncWebClient, channel: str) -> asyncio.Task[SourceReport]:
        """Sync ``channel`` soon: at once, or once more after the sync already running (a burst of
        edits costs at most two syncs)."""
        running = self._running.get(channel)
        if running is not None and not running.done():
            self._again.add(channel)
            return running
        task = self.jobs.spawn(
            self._sync_until_settled(client, channel), name=f"canvases-{channel}"
        )
        self._running[channel] = task
        return task

    async def _sync_until_settled(self, client: AsyncWebClient, channel: str) -> SourceReport:
        while True:
            self._again.discard(channel)
            report = await self.sync(client, channel)
            if channel not in self._again:
                return report


async def _content(client: AsyncWebClient, canvas: Canvas) -> str:
    """A canvas's markdown (``canvases.getContent``).

    Raises:
        ItemGone: ``canvas_not_found``: deleted, or the bot may no longer view it.
        ItemFailed: anything else (its document, if any, stays as it was).
    """
    try:
        resp = await client.canvases_getContent(canvas_id=canvas.id, content_type="markdown")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ItemFailed("Slack cannot be reached (canvases.getContent).") from exc
    except SlackApiError as exc:
        if slack_error(exc) == "canvas_not_found":
            raise ItemGone(
                canvas.id, "Slack answers canvas_not_found: deleted, or not viewable by the bot"
            ) from exc
        raise ItemFailed(_refusal("canvases.getContent", canvas.id, exc)) from exc
    content = resp.get("content")
    if not isinstance(content, str):
        raise ItemFailed("canvases.getContent answered without the canvas's content.")
    return content
