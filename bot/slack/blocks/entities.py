"""Work Objects: the entity a passage link unfurls as, and its flexpane, built with ``slack_sdk.models``.

A passage link (``/d/{id}?t=...#char=a,b`` or ``/d/{id}/file?t=...#page=N``)
becomes a ``slack#/entities/content_item`` entity (Slack's type for "a content
page, an article page"): the document's title in the header, "Passage" as its
type, the section or page as its display id and as fields, the quoted passage
as the ``description`` field, and an "Open in the viewer" action. The flexpane
adds the passages just before and after it.

Two entities carry none of a document's words: :func:`unavailable_entity` (a
valid link to a document that is gone or no longer searchable) and
:func:`restricted_entity` (a valid link shown where not everyone may read the
document). What a document wrote is escaped (``mrkdwn.escape``), as everywhere
the bot shows it, loses its control and invisible characters (a passage keeps
its line breaks, every kind of them as one, and tabs: ``core.quoting.passage_lines``,
the lines every output quotes) and is cut to the limits below.

Limits: Slack's Work Objects reference gives 3000 characters for a text field
(the most its editable plain-text input takes) and for an action's ``url``, 255
for an ``action_id``; it gives none for a title, which is cut to a header's 150
here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slack_sdk.models.metadata import (
    ContentItemEntityFields,
    EntityActionButton,
    EntityActions,
    EntityAttributes,
    EntityCustomField,
    EntityMetadata,
    EntityPayload,
    EntityStringField,
    EntityTimestampField,
    EntityTitle,
    EventAndEntityMetadata,
    ExternalRef,
)

from bot.slack.blocks.mrkdwn import BUTTON_LIMIT, HEADER_LIMIT, fit
from bot.slack.words import Words
from core.quoting import passage_lines
from index.names import display_name

__all__ = [
    "ENTITY_TYPE",
    "OPEN_VIEWER_ACTION_ID",
    "PASSAGE_LIMIT",
    "URL_LIMIT",
    "Passage",
    "details_error",
    "passage_entity",
    "restricted_entity",
    "unavailable_entity",
    "unfurl_metadata",
]

ENTITY_TYPE = "slack#/entities/content_item"
# The button's click also comes to the app as a block action: acknowledged, nothing else.
OPEN_VIEWER_ACTION_ID = "kb_open_viewer"
PASSAGE_LIMIT = 3000
URL_LIMIT = 3000
# What entity.presentDetails accepts as ``error.status`` (its reference page).
DETAILS_ERRORS = frozenset(
    {
        "restricted",
        "internal_error",
        "not_found",
        "custom",
        "custom_partial_view",
        "timeout",
        "edit_error",
    }
)


@dataclass(frozen=True)
class Passage:
    """What a passage link shows, everything as the document wrote it (escaped when built).

    Attributes:
        ref: the entity's ``external_ref.id``: document, then the range or the page.
        url: the viewer link the entity opens (built by the server, signed).
        title: the document's title (or file name).
        text: the linked passage; empty when the link names no range.
        section: the heading path of the passage, or "".
        page: its 1-based page in a PDF, or ``None``.
        before, after: the passages just before and after it ("" at either end).
        updated: when the document was last indexed (Unix time), or ``None``.
    """

    ref: str
    url: str
    title: str
    text: str = ""
    section: str = ""
    page: int | None = None
    before: str = ""
    after: str = ""
    updated: int | None = None


def passage_entity(
    passage: Passage, words: Words, *, unfurl_url: str | None, details: bool = False
) -> EntityMetadata:
    """The entity of one passage: the unfurl (``unfurl_url``, the link as posted) or the flexpane.

    ``details``: also the passages before and after it (the flexpane's).
    """
    fields = ContentItemEntityFields(
        description=_text_field(passage.text),
        date_updated=EntityTimestampField(value=passage.updated) if passage.updated else None,
    )
    custom = _locator_fields(passage, words)
    if details:
        custom += _neighbour_fields(passage, words)
    attributes = EntityAttributes(
        title=EntityTitle(text=_one_line(passage.title, HEADER_LIMIT) or "…"),
        display_type=words.ENTITY_PASSAGE,
        display_id=_locator(passage, words) or None,
        metadata_last_modified=passage.updated,
    )
    payload = EntityPayload(
        attributes=attributes,
        fields=fields,
        custom_fields=list[dict[str, Any] | EntityCustomField](custom) or None,
        display_order=[
            *(["description"] if fields.description is not None else []),
            *(f.key for f in custom),
        ]
        or None,
        actions=_open_action(passage.url, words),
    )
    return _entity(passage.ref, passage.url, payload, unfurl_url)


def unavailable_entity(
    ref: str, url: str, words: Words, *, unfurl_url: str | None
) -> EntityMetadata:
    """A valid link to a document that is gone: says so, names nothing of it."""
    payload = EntityPayload(
        attributes=EntityAttributes(
            title=EntityTitle(text=words.ENTITY_UNAVAILABLE), display_type=words.ENTITY_PASSAGE
        )
    )
    return _entity(ref, url, payload, unfurl_url)


def restricted_entity(
    ref: str, url: str, words: Words, *, unfurl_url: str | None
) -> EntityMetadata:
    """A valid link shown where not everyone may read the document: no title, no text."""
    payload = EntityPayload(
        attributes=EntityAttributes(
            title=EntityTitle(text=words.ENTITY_RESTRICTED), display_type=words.ENTITY_PASSAGE
        ),
        actions=_open_action(url, words),
    )
    return _entity(ref, url, payload, unfurl_url)


def unfurl_metadata(entities: Sequence[EntityMetadata]) -> EventAndEntityMetadata:
    """``chat.unfurl``'s ``metadata``: the entities, one per link unfurled."""
    return EventAndEntityMetadata(entities=list(entities))


def details_error(status: str) -> dict[str, str]:
    """``entity.presentDetails``'s ``error``: Slack's own treatment of ``status``.

    Raises:
        ValueError: ``status`` is not one Slack accepts.
    """
    if status not in DETAILS_ERRORS:
        raise ValueError(f"entity.presentDetails takes no error status {status!r}")
    return {"status": status}


def _entity(ref: str, url: str, payload: EntityPayload, unfurl_url: str | None) -> EntityMetadata:
    return EntityMetadata(
        entity_type=ENTITY_TYPE,
        entity_payload=payload,
        external_ref=ExternalRef(id=ref),
        url=url,
        app_unfurl_url=unfurl_url,
    )


def _one_line(text: str, limit: int) -> str:
    """A title or heading as shown: one line, escaped, within ``limit``."""
    return fit(display_name(text, limit), limit)


def _multiline(text: str, limit: int) -> str:
    """A passage as shown: its lines kept (every kind of line break as one), control and
    invisible characters gone (``core.quoting.passage_lines``), escaped, within ``limit``."""
    return fit("\n".join(passage_lines(text)), limit)


def _text_field(text: str) -> EntityStringField | None:
    shown = _multiline(text, PASSAGE_LIMIT)
    return EntityStringField(value=shown, long=True) if shown else None


def _locator(passage: Passage, words: Words) -> str:
    """The section, else the page, as the entity's display id."""
    if passage.section:
        return _one_line(passage.section, HEADER_LIMIT)
    if passage.page is not None:
        return words.entity_page(passage.page)
    return ""


def _locator_fields(passage: Passage, words: Words) -> list[EntityCustomField]:
    custom = []
    section = _one_line(passage.section, PASSAGE_LIMIT)
    if section:
        custom.append(
            EntityCustomField(
                key="section", label=words.ENTITY_SECTION, type="string", value=section
            )
        )
    if passage.page is not None:
        custom.append(
            EntityCustomField(
                key="page", label=words.ENTITY_PAGE, type="integer", value=passage.page
            )
        )
    return custom


def _neighbour_fields(passage: Passage, words: Words) -> list[EntityCustomField]:
    custom = []
    for key, name, text in (
        ("before", words.ENTITY_BEFORE, passage.before),
        ("after", words.ENTITY_AFTER, passage.after),
    ):
        shown = _multiline(text, PASSAGE_LIMIT)
        if shown:
            custom.append(
                EntityCustomField(key=key, label=name, type="string", value=shown, long=True)
            )
    return custom


def _open_action(url: str, words: Words) -> EntityActions | None:
    """The "Open in the viewer" button; none for a URL longer than Slack takes."""
    if not url or len(url) > URL_LIMIT:
        return None
    button = EntityActionButton(
        text=fit(words.ENTITY_OPEN_VIEWER, BUTTON_LIMIT),
        action_id=OPEN_VIEWER_ACTION_ID,
        url=url,
    )
    return EntityActions(primary_actions=[button])
