"""The rebuild as the bot runs it for ``/kb-reindex``.

Only admins may run it (``bot.slack.people.roles``). The reindex runs in a worker
thread, so questions keep being answered, and one at a time: the file lock of
``KnowledgeBase.reindex`` also covers ``kb reindex`` run from a shell. The
final report ends with the latest changes to the knowledge base, the reindex
among them, from the audit log. The report is the admin's alone, and names only
the documents the access rule lets them read (``bot.access``): a failure or a
change of a channel's document they are not in says which channel, not which
document, nor why it failed.

A knowledge base kept on the earlier default model (``index.kept_model``) is
moved: every document is embedded by the configured model beside the live
index while questions are answered on the earlier one; then the engine's
search gate (``core.searches``) is closed for the swap (the searches under
way finish first, new ones wait), the documents and the index change over,
the engine takes the new model's thresholds, and the gate reopens
(``core.switch``, the same switch a server runs when another process moved
the store). No question is searched on two models, nor on a half-moved store;
the running bot answers on the configured model from then on, without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from bot.access import Access, Person
from bot.slack.blocks import audit_lines, audited_scopes, escape, unnamed_document
from bot.slack.words import Words
from core.switch import ModelSwitch
from index.errors import KBError, ReindexInProgress
from index.knowledge_base import KnowledgeBase, ReindexReport
from index.records import AuditEntry, DocumentRow

log = logging.getLogger(__name__)

__all__ = ["Reindexer", "render_reindex_report"]

REINDEX_PROGRESS_SECONDS = 2.0
MAX_REPORTED_FAILURES = 10
RECENT_CHANGES = 10


Report = Callable[[str], Coroutine[Any, Any, None]]


class Reindexer:
    """Runs one reindex at a time in a worker thread and reports its progress.

    Args:
        kb: the knowledge base to rebuild.
        access: who may read what: the report names only what its admin may read.
        switch: moves the engine answering from ``kb`` with it when a reindex moves
            ``kb`` off the earlier default model; ``None``: such a reindex rebuilds
            on the earlier model, as any other.
        progress_seconds: least time between two progress reports.
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        access: Access,
        *,
        switch: ModelSwitch | None = None,
        progress_seconds: float = REINDEX_PROGRESS_SECONDS,
    ) -> None:
        self.kb = kb
        self.access = access
        self.switch = switch
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

    async def run(self, report: Report, *, actor: str, words: Words) -> ReindexReport | None:
        """Rebuild the index (after :meth:`claim`); ``report`` gets progress and the final report.

        ``actor`` (who asked) is recorded in the audit log; ``words``: their language.

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
            text = words.reindex_progress(int(info["index"]) + 1, int(info["total"]))
            loop.call_soon_threadsafe(send, text)

        kept = self.kb.kept_model
        model_switch = self.switch
        switch = (
            (lambda: model_switch.holding(loop))
            if kept is not None and model_switch is not None
            else None
        )
        try:
            result = await asyncio.to_thread(
                self.kb.reindex, progress=progress, actor=actor, switch=switch
            )
        except ReindexInProgress:
            await report(words.REINDEX_RUNNING)
            return None
        except KBError as exc:
            # The disk refused a write, the configured model could not run...: said, not silent.
            log.exception("the reindex stopped")
            await report(words.reindex_stopped(escape(str(exc))))
            return None
        finally:
            self._running = False
            # The final report must not be overtaken by a late progress line.
            await asyncio.sleep(0)
            await asyncio.gather(*pending, return_exceptions=True)
        recent = await asyncio.to_thread(self.kb.audit_log.entries, RECENT_CHANGES)
        move = None
        if kept is not None and switch is not None:
            move = (kept.built_on, kept.default, self.kb.kept_model is None)
        listed = [f.document for f in (*result.failed, *result.skipped)]
        scopes = audited_scopes(recent) | {d.scope for d in listed}
        named = await self.access.readable_among(scopes, person=Person(actor))
        await report(
            render_reindex_report(result, words=words, recent=recent, move=move, named=named)
        )
        return result


def render_reindex_report(
    report: ReindexReport,
    *,
    words: Words,
    recent: Sequence[AuditEntry] = (),
    move: tuple[str, str, bool] | None = None,
    named: frozenset[str] = frozenset(),
) -> str:
    """The final ``/kb-reindex`` message (failure reasons escaped), then the ``recent`` changes.

    ``named``: the scopes whose documents the admin reading it may read; a document of
    any other is said to be one of its channel's, without its name or the reason.

    ``move``: for a reindex that was to move the knowledge base off the earlier
    default model, that model, the configured one, and whether it moved.
    """
    lines = [
        words.reindex_done(
            report.documents,
            report.chunks,
            len(report.failed),
            report.stale_before,
            report.stale_after,
        )
    ]
    if move is not None:
        built_on, default, moved = move
        if moved:
            lines.append(words.reindex_moved(built_on, default))
        else:
            lines.append(words.reindex_not_moved(built_on, default))
    for failure in report.failed[:MAX_REPORTED_FAILURES]:
        reason = failure.reason or failure.document.failure_reason or ""
        lines.append(words.reindex_failure_line(*_listed(failure.document, reason, named, words)))
    if len(report.failed) > MAX_REPORTED_FAILURES:
        lines.append(words.reindex_more_failures(len(report.failed) - MAX_REPORTED_FAILURES))
    for skip in report.skipped[:MAX_REPORTED_FAILURES]:
        lines.append(words.reindex_skipped_line(*_listed(skip.document, skip.reason, named, words)))
    if len(report.skipped) > MAX_REPORTED_FAILURES:
        lines.append(words.reindex_more_skipped(len(report.skipped) - MAX_REPORTED_FAILURES))
    if recent:
        lines += ["", words.APPROVAL_RECENT_HEADER, *audit_lines(recent, words, named)]
    return "\n".join(lines)


def _listed(doc: DocumentRow, reason: str, named: frozenset[str], words: Words) -> tuple[str, str]:
    """``doc``'s name and ``reason`` as the report shows them (escaped); a document of a scope
    not ``named`` by its scope and id only, and without the reason (the document's words)."""
    if doc.scope in named:
        return escape(doc.name), escape(reason)
    return unnamed_document(doc.scope, doc.id, words), words.HOME_STATES["failed"]
