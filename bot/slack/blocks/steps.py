"""The steps of an answer as streaming chunks (a plan of task cards), and an answer stopped midway.

While an answer is worked on, a native stream shows its steps as Slack's task
cards (``task_update`` chunks, grouped in a plan under a ``plan_update``
title): "Searching the knowledge base…", then "Found N passages in M documents"
with each document once as a URL source (the signed link of its first kept
passage), then "Writing the answer…". A step updates its card by id, so the
search card turns into what was found. A question the knowledge base cannot
answer ends its search card with that, and no writing card follows.

Titles are the bot's own words; a source's label is a document's name (a
person chose it), shortened and kept to one line; its URL is the server's own
signed link. Slack shows neither as mrkdwn, so nothing in them can mention
anyone.

An answer stopped midway keeps the text it had shown (escaped and made inert,
as while it was being written), marked as stopped.
"""

from __future__ import annotations

from slack_sdk.models.blocks.block_elements import UrlSourceElement
from slack_sdk.models.messages.chunk import Chunk, PlanUpdateChunk, TaskUpdateChunk

from bot.slack.blocks.elements import Rendered, context, section
from bot.slack.blocks.mrkdwn import (
    FALLBACK_LIMIT,
    SECTION_LIMIT,
    fit,
    from_markdown,
    inert_links,
)
from bot.slack.words import Words
from core.answer import Step, StepKind
from index.names import display_name

__all__ = ["MAX_STEP_SOURCES", "STEP_DISPLAY_MODE", "render_stopped", "step_chunks"]

# How the steps show: all together in one plan block (Slack's other mode, "timeline",
# puts each card between pieces of streamed text).
STEP_DISPLAY_MODE = "plan"
# A card names the documents an answer is written from; more than a handful is noise.
MAX_STEP_SOURCES = 8
SOURCE_LABEL_CHARS = 80
_SEARCH_TASK = "search"
_WRITE_TASK = "write"


def step_chunks(step: Step, *, words: Words, first: bool = False) -> list[Chunk]:
    """The chunks that show ``step``; ``first``: the stream starts with it (the plan's title too).

    Empty for a step that shows nothing (``DONE``).
    """
    chunks: list[Chunk] = [PlanUpdateChunk(title=words.STEPS_TITLE)] if first else []
    if step.kind is StepKind.SEARCHING:
        chunks.append(_task(_SEARCH_TASK, words.PLACEHOLDER, "in_progress"))
    elif step.kind is StepKind.FOUND:
        title = words.step_found(step.passages, step.documents)
        sources = [
            UrlSourceElement(url=s.url, text=display_name(s.document, SOURCE_LABEL_CHARS))
            for s in step.sources[:MAX_STEP_SOURCES]
        ]
        chunks.append(_task(_SEARCH_TASK, title, "complete", sources))
    elif step.kind is StepKind.NOTHING_FOUND:
        chunks.append(_task(_SEARCH_TASK, words.STEP_NOTHING_FOUND, "complete"))
    elif step.kind is StepKind.WRITING:
        chunks.append(_task(_WRITE_TASK, words.WRITING, "in_progress"))
    return chunks if len(chunks) > int(first) else []


def _task(
    task_id: str, title: str, status: str, sources: list[UrlSourceElement] | None = None
) -> TaskUpdateChunk:
    return TaskUpdateChunk(id=task_id, title=title, status=status, sources=sources or None)


def render_stopped(text: str, *, words: Words) -> Rendered:
    """What a stopped answer leaves: the text it had shown (``""``: none), marked as stopped."""
    text = inert_links(text)
    body = fit(from_markdown(text), SECTION_LIMIT - 1) if text.strip() else ""
    if not body:
        return Rendered.build(words.STOPPED, [section(words.STOPPED)])
    fallback = fit(f"{text}\n\n{words.STOPPED}", FALLBACK_LIMIT)
    return Rendered.build(fallback, [section(body), context(words.STOPPED)])
