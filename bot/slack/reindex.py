"""Who may rebuild the index, and the rebuild itself as the bot runs it.

``/kb-reindex`` is for admins only: user ids configured in ``KB_ADMIN_USERS``,
or (when ``KB_SLACK_ADMINS_ARE_ADMINS``) Slack workspace admins and owners as
``users.info`` reports them. The reindex runs in a worker thread, so questions
keep being answered, and one at a time: the file lock of
``KnowledgeBase.reindex`` also covers ``kb reindex`` run from a shell.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import messages
from bot.slack.config import SlackConfig
from bot.slack.render import escape
from index.errors import ReindexInProgress
from index.knowledge_base import KnowledgeBase, ReindexReport

log = logging.getLogger(__name__)

__all__ = ["AdminCheck", "Reindexer", "render_reindex_report"]

REINDEX_PROGRESS_SECONDS = 2.0
ADMIN_CACHE_SECONDS = 300.0
MAX_REPORTED_FAILURES = 10


class AdminCheck:
    """Who may run ``/kb-reindex``: configured user ids, or Slack admins and owners.

    ``users.info`` answers are cached for a few minutes, so a burst of commands
    costs one API call.
    """

    def __init__(self, config: SlackConfig, *, ttl_seconds: float = ADMIN_CACHE_SECONDS) -> None:
        self.config = config
        self.ttl_seconds = ttl_seconds
        self._cache: dict[str, tuple[bool, float]] = {}

    async def is_admin(self, client: AsyncWebClient, user_id: str) -> bool:
        """Whether ``user_id`` is a knowledge-base admin."""
        if user_id in self.config.admin_user_ids:
            return True
        if not self.config.workspace_admins_are_admins or not user_id:
            return False
        cached = self._cache.get(user_id)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        try:
            resp = await client.users_info(user=user_id)
        except SlackApiError as exc:
            log.warning("users.info failed for %s; treating as not an admin: %s", user_id, exc)
            return False
        user = resp.get("user") or {}
        admin = bool(user.get("is_admin") or user.get("is_owner")) and not user.get("deleted")
        self._cache[user_id] = (admin, time.monotonic() + self.ttl_seconds)
        return admin


Report = Callable[[str], Coroutine[Any, Any, None]]


class Reindexer:
    """Runs one reindex at a time in a worker thread and reports its progress.

    Args:
        kb: the knowledge base to rebuild.
        progress_seconds: least time between two progress reports.
    """

    def __init__(
        self, kb: KnowledgeBase, *, progress_seconds: float = REINDEX_PROGRESS_SECONDS
    ) -> None:
        self.kb = kb
        self.progress_seconds = progress_seconds
        self._running = False

    @property
    def running(self) -> bool:
        """Whether this process has a reindex claimed or running."""
        return self._running

    async def claim(self) -> bool:
        """Reserve the next reindex; ``False`` when one runs here or in another process.

        The claim is taken before anything is awaited, so two commands
        arriving together cannot both pass the check.
        """
        if self._running:
            return False
        self._running = True
        if await asyncio.to_thread(self.kb.reindex_running):
            self._running = False
            return False
        return True

    async def run(self, report: Report) -> ReindexReport | None:
        """Rebuild the index (after :meth:`claim`); ``report`` gets progress and the final report.

        The claim is released when the reindex ends, however it ends.

        Returns:
            The report, or ``None`` when another process started a reindex first.
        """
        self._running = True
        loop = asyncio.get_running_loop()
        pending: list[asyncio.Task[None]] = []
        last = 0.0

        def send(text: str) -> None:
            pending.append(loop.create_task(report(text)))

        def progress(event: str, info: dict[str, Any]) -> None:
            # Called in the worker thread: hand the report to the event loop, never wait for Slack.
            nonlocal last
            now = time.monotonic()
            if event != "reindex" or now - last < self.progress_seconds:
                return
            last = now
            text = messages.reindex_progress(int(info["index"]) + 1, int(info["total"]))
            loop.call_soon_threadsafe(send, text)

        try:
            result = await asyncio.to_thread(self.kb.reindex, progress=progress)
        except ReindexInProgress:
            await report(messages.REINDEX_RUNNING)
            return None
        finally:
            self._running = False
            # The final report must not be overtaken by a late progress line.
            await asyncio.sleep(0)
            await asyncio.gather(*pending, return_exceptions=True)
        await report(render_reindex_report(result))
        return result


def render_reindex_report(report: ReindexReport) -> str:
    """The final ``/kb-reindex`` message (failure reasons escaped)."""
    lines = [
        messages.reindex_done(
            report.documents,
            report.chunks,
            len(report.failed),
            report.stale_before,
            report.stale_after,
        )
    ]
    for failure in report.failed[:MAX_REPORTED_FAILURES]:
        reason = failure.reason or failure.document.failure_reason or ""
        lines.append(messages.reindex_failure_line(escape(failure.document.name), escape(reason)))
    if len(report.failed) > MAX_REPORTED_FAILURES:
        lines.append(messages.reindex_more_failures(len(report.failed) - MAX_REPORTED_FAILURES))
    return "\n".join(lines)
