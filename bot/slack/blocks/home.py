"""The Home tab as Block Kit: what everyone sees, and the admins' sections below it.

Everything shown here that a person or a document wrote (file names, titles,
failure reasons, questions, passages) goes through :func:`clip`: escaped, on
one line, links set in code, cut to a bound; the only links are those the
server built. Slack allows 100 blocks in a Home view and 3000 characters in a
section: lists are paged (:class:`Pages`, carried in the view's
``private_metadata`` and the buttons' values, both read as hostile input), and
:func:`home_view` never returns more than 100 blocks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

from bot.slack.blocks.actions import (
    HOME_CALLBACK_ID,
    HOME_NEXT_ACTION_ID,
    HOME_PREVIOUS_ACTION_ID,
    HOME_REFRESH_ACTION_ID,
    HOME_REINDEX_ACTION_ID,
    HOME_RETRY_ACTION_ID,
)
from bot.slack.blocks.elements import actions, button, context, divider, header, pack
from bot.slack.blocks.elements import section as section_block
from bot.slack.blocks.mrkdwn import (
    escape,
    inert_links,
    mention,
    safe_url,
    scope_label,
    split_mrkdwn,
    unnamed_document,
)
from bot.slack.words import Words
from index.models import EVERYONE
from index.names import display_name
from index.records import DocumentRow
from index.storage import SourceRow

if TYPE_CHECKING:
    from core.calibration import CalibrationRecord, RateRow
    from core.gaps import Gap

# Slack's 100 blocks of a Home view.
MAX_HOME_BLOCKS = 100
# The Home tab's plain texts (headers, buttons) say emoji: true; a message's say nothing.

# Far beyond any real list; bounds what a forged value can ask for.
MAX_PAGE = 100_000
NOTICE_BLOCKS = 3

NAME_CHARS = 80
REASON_CHARS = 300
QUESTION_CHARS = 300
EXAMPLE_CHARS = 150
ANSWER_CHARS = 200
SECTION_CHARS = 100

T = TypeVar("T")


class Section(StrEnum):
    """The paged lists of the Home tab."""

    UPLOADS = "uploads"
    FAILED = "failed"
    STALE = "stale"
    GAPS = "gaps"
    DISLIKED = "disliked"


# Items per page: chosen so that every list at its fullest fits in 100 blocks together.
PAGE_SIZES = {
    Section.UPLOADS: 10,
    Section.FAILED: 5,
    Section.STALE: 10,
    Section.GAPS: 5,
    Section.DISLIKED: 10,
}
ADMIN_SECTIONS = frozenset(Section) - {Section.UPLOADS}


# ---------------------------------------------------------------- pages


@dataclass(frozen=True)
class Pages:
    """The page shown of each list (0-based); a list not named is on its first page."""

    numbers: Mapping[Section, int] = field(default_factory=dict)

    def of(self, section: Section) -> int:
        """The page of ``section``."""
        return self.numbers.get(section, 0)

    def at(self, section: Section, page: int) -> Pages:
        """These pages with ``section`` on ``page``."""
        return Pages({**self.numbers, section: page})

    def to_metadata(self) -> str:
        """What the view carries back in ``private_metadata``."""
        return json.dumps({str(s): p for s, p in sorted(self.numbers.items()) if p})

    @classmethod
    def from_metadata(cls, raw: Any) -> Pages:
        """The pages a view's ``private_metadata`` names; anything malformed is ignored."""
        try:
            data = json.loads(raw) if isinstance(raw, str) and raw else {}
        except (ValueError, RecursionError):  # deep nesting exhausts the decoder's stack
            return cls()
        if not isinstance(data, dict):
            return cls()
        numbers = {}
        for key, value in data.items():
            section = _section(key)
            if section is not None and type(value) is int and 0 <= value <= MAX_PAGE:
                numbers[section] = value
        return cls(numbers)


FIRST_PAGES = Pages()


def _section(raw: Any) -> Section | None:
    try:
        return Section(raw) if isinstance(raw, str) else None
    except ValueError:
        return None


def parse_page_value(value: Any) -> tuple[Section, int] | None:
    """``(section, page)`` from a Previous/Next button's value, or ``None`` when malformed."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    name, _, number = value.partition(":")
    section = _section(name)
    if section is None or not (number.isascii() and number.isdigit()):
        return None
    page = int(number)
    return (section, page) if page <= MAX_PAGE else None


def page_count(section: Section, total: int) -> int:
    """How many pages ``total`` items of ``section`` take (at least one)."""
    return max(1, math.ceil(total / PAGE_SIZES[section]))


def page_number(section: Section, total: int, pages: Pages) -> int:
    """``section``'s page, brought back to its last page when the list got shorter."""
    return min(pages.of(section), page_count(section, total) - 1)


def page_of(items: Sequence[T], section: Section, pages: Pages) -> tuple[Sequence[T], int, int]:
    """The items on ``section``'s page, that page (clamped to the last) and the page count."""
    size = PAGE_SIZES[section]
    page = page_number(section, len(items), pages)
    return items[page * size : (page + 1) * size], page, page_count(section, len(items))


# ---------------------------------------------------------------- what is shown


@dataclass(frozen=True)
class MemberHome:
    """What everyone sees: the counts and their own uploads (newest first)."""

    documents: int
    chunks: int
    channel_documents: int
    uploads: Sequence[DocumentRow]


@dataclass(frozen=True)
class Disliked:
    """An answer marked not helpful, and where it was asked.

    ``at``: the latest thumbs-down; ``dislikes``: from how many people;
    ``thread_url``: the Slack thread, for a channel thread; ``direct``: asked in a DM;
    ``withheld``: the answer used a channel's documents, which an admin need not be
    allowed to read, so it is not shown (``answer`` is empty).
    """

    question: str
    answer: str
    outcome: str
    at: float
    dislikes: int
    thread_url: str | None
    direct: bool
    withheld: bool = False


@dataclass(frozen=True)
class Calibration:
    """The thresholds in force and the last ``kb calibrate`` record, if any."""

    threshold: float
    related_threshold: float
    record: CalibrationRecord | None
    # The model the thresholds were calibrated for ("": none) and where they come from.
    model: str = ""
    origin: str = ""
    # What to change when the documents' languages are not the model's (English), or None.
    language_advice: str | None = None
    # The earlier default model the knowledge base was built on and still runs
    # until `kb reindex` (index.kept_model), and the default it would move to.
    kept_model: tuple[str, str] | None = None
    # Why every question is refused: the store moved to a model this server cannot load.
    store_model_refused: str | None = None


@dataclass(frozen=True)
class AdminHome:
    """The admins' sections.

    ``gaps``: ``None`` while they are still being worked out, or when that failed
    (``gaps_failed``).
    ``gap_links``: by chunk id, the viewer link of a gap's closest passage (only
    for documents for everyone; a channel's passage is named by its channel).
    ``disliked``: the page of them :func:`page_number` names, of ``disliked_total``.
    ``readable``: the scopes whose documents the admin may read (the access rule), among
    those of the failed and stale documents shown: another channel's documents, and synced
    ones the admin's source permissions do not admit, are listed without their names or
    failure reasons, since an admin need not be a member.
    ``failing_sources``: the synced sources whose last run failed (``index.sources``), by name.
    """

    failed: Sequence[DocumentRow]
    stale: Sequence[DocumentRow]
    reindex_running: bool
    gaps: Sequence[Gap] | None
    gap_links: Mapping[int, str]
    disliked: Sequence[Disliked]
    disliked_total: int
    calibration: Calibration
    gaps_failed: bool = False
    readable: frozenset[str] = frozenset()
    failing_sources: Sequence[SourceRow] = ()


# ---------------------------------------------------------------- text


def clip(raw: str, limit: int) -> str:
    """``raw`` as shown: one line, escaped, links inert, at most ``limit`` characters."""
    flat = display_name(raw, limit)
    out = escape(inert_links(flat))
    while len(out) > limit and flat:
        # An escaped character takes up to five: shrink in proportion to the excess.
        flat = flat[: len(flat) * limit // len(out) - 1].rstrip()
        out = escape(inert_links(flat)) + "…"
    return out


def _packed(lines: Sequence[str]) -> list[Block]:
    """Lines grouped into sections of at most 3000 characters (a longer line is cut)."""
    return [section_block(t) for t in pack(lines, clip_lines=True)]


def _pager(section: Section, page: int, count: int, total: int, words: Words) -> list[Block]:
    """Where a list is, and Previous / Next while there is somewhere to go."""
    if count <= 1:
        return []
    buttons = []
    if page > 0:
        buttons.append(
            button(
                HOME_PREVIOUS_ACTION_ID, words.HOME_PREVIOUS, f"{section}:{page - 1}", emoji=True
            )
        )
    if page < count - 1:
        buttons.append(
            button(HOME_NEXT_ACTION_ID, words.HOME_NEXT, f"{section}:{page + 1}", emoji=True)
        )
    return [
        context(words.home_page(page + 1, count, total)),
        actions(buttons, block_id=f"kb_home_pages_{section}"),
    ]


def _paged(
    section: Section, items: Sequence[T], pages: Pages, words: Words
) -> tuple[Sequence[T], list[Block]]:
    shown, page, count = page_of(items, section, pages)
    return shown, _pager(section, page, count, len(items), words)


# ---------------------------------------------------------------- the view


def home_view(
    member: MemberHome,
    admin: AdminHome | None,
    *,
    words: Words,
    pages: Pages = FIRST_PAGES,
    notice: str | None = None,
) -> dict[str, Any]:
    """The Home tab for ``views.publish``; the admins' sections only when ``admin`` is given.

    ``words``: the person's language. ``notice`` is server-written mrkdwn shown first
    (the outcome of a button).
    """
    blocks = [*_notice(notice), *_member_blocks(member, pages, words)]
    if admin is not None:
        blocks += _admin_blocks(admin, pages, words)
    if len(blocks) > MAX_HOME_BLOCKS:
        blocks = [*blocks[: MAX_HOME_BLOCKS - 1], context(words.HOME_SHORTENED)]
    return View(
        type="home",
        callback_id=HOME_CALLBACK_ID,
        private_metadata=pages.to_metadata(),
        blocks=blocks,
    ).to_dict()


def external_view(words: Words) -> dict[str, Any]:
    """The Home tab for a person of another organisation (Slack Connect): nothing it holds."""
    blocks = [header(words.HOME_TITLE, emoji=True), section_block(words.EXTERNAL_ASKER)]
    return View(type="home", callback_id=HOME_CALLBACK_ID, blocks=blocks).to_dict()


def _notice(notice: str | None) -> list[Block]:
    if not notice:
        return []
    pieces = split_mrkdwn(notice)
    return [section_block(p) for p in pieces[:NOTICE_BLOCKS]]


def _member_blocks(member: MemberHome, pages: Pages, words: Words) -> list[Block]:
    refresh = button(HOME_REFRESH_ACTION_ID, words.HOME_REFRESH, "refresh", emoji=True)
    head = [
        header(words.HOME_TITLE, emoji=True),
        context(words.home_counts(member.documents, member.chunks, member.channel_documents)),
        section_block(words.HOME_ASK),
        section_block(words.HOME_UPLOAD, accessory=refresh),
        divider(),
        header(words.HOME_UPLOADS_HEADER, emoji=True),
    ]
    if not member.uploads:
        return [*head, context(words.HOME_NO_UPLOADS)]
    shown, pager = _paged(Section.UPLOADS, member.uploads, pages, words)
    return [*head, *_packed([_upload_line(d, words) for d in shown]), *pager]


def _upload_line(doc: DocumentRow, words: Words) -> str:
    state = words.HOME_STATES.get(doc.state.value, doc.state.value)
    reason = clip(doc.failure_reason or "", REASON_CHARS) if doc.state == "failed" else ""
    return words.home_upload_line(
        clip(doc.name, NAME_CHARS),
        state,
        words.when(doc.created_at),
        scope_label(doc.scope, words),
        reason,
    )


def _admin_blocks(admin: AdminHome, pages: Pages, words: Words) -> list[Block]:
    return [
        divider(),
        header(words.HOME_ADMIN_HEADER, emoji=True),
        *_failing_source_blocks(admin.failing_sources, words),
        *_failed_blocks(admin.failed, pages, admin.readable, words),
        *_stale_blocks(admin.stale, admin.reindex_running, pages, admin.readable, words),
        *_gap_blocks(admin.gaps, admin.gaps_failed, admin.gap_links, pages, words),
        *_disliked_blocks(admin.disliked, admin.disliked_total, pages, words),
        *_calibration_blocks(admin.calibration, words),
    ]


def _failing_source_blocks(sources: Sequence[SourceRow], words: Words) -> list[Block]:
    """Each source whose last sync failed, with why and its last good sync; none: nothing."""
    if not sources:
        return []
    lines = [
        words.home_failing_source(
            clip(s.name, NAME_CHARS),
            clip(s.kind, NAME_CHARS),
            clip(s.last_error or "", REASON_CHARS),
            words.when(s.last_good_at) if s.last_good_at is not None else words.HOME_NEVER,
        )
        for s in sources
    ]
    return [
        header(words.HOME_SOURCES_HEADER, emoji=True),
        context(words.HOME_SOURCES_INTRO),
        *_packed(lines),
    ]


def readable_by(doc: DocumentRow, readable: frozenset[str]) -> bool:
    """Whether a person who may read the documents of the scopes ``readable`` may read
    ``doc``'s name."""
    return doc.scope == EVERYONE or doc.scope in readable


def document_label(doc: DocumentRow, readable: frozenset[str], words: Words) -> str:
    """``doc``'s name as shown (escaped), or only its channel for someone not in it."""
    if readable_by(doc, readable):
        return clip(doc.name, NAME_CHARS)
    return unnamed_document(doc.scope, doc.id, words)


def _failed_blocks(
    failed: Sequence[DocumentRow], pages: Pages, readable: frozenset[str], words: Words
) -> list[Block]:
    head = [header(words.HOME_FAILED_HEADER, emoji=True)]
    if not failed:
        return [*head, context(words.HOME_NO_FAILED)]
    shown, pager = _paged(Section.FAILED, failed, pages, words)
    rows = []
    for doc in shown:
        reason = clip(doc.failure_reason or "", REASON_CHARS)
        text = words.home_failed_line(
            document_label(doc, readable, words),
            mention(doc.uploader),
            words.when(doc.updated_at),
            reason if readable_by(doc, readable) else words.HOME_REASON_WITHHELD,
        )
        retry = button(HOME_RETRY_ACTION_ID, words.HOME_RETRY, str(doc.id), "primary", emoji=True)
        rows.append(section_block(text, accessory=retry))
    return [*head, *rows, *pager]


def _stale_blocks(
    stale: Sequence[DocumentRow],
    running: bool,
    pages: Pages,
    readable: frozenset[str],
    words: Words,
) -> list[Block]:
    head = [header(words.HOME_STALE_HEADER, emoji=True)]
    status: list[Block] = [context(words.HOME_REINDEX_RUNNING_NOW)] if running else []
    if not stale:
        return [*head, context(words.HOME_NO_STALE), *status]
    shown, pager = _paged(Section.STALE, stale, pages, words)
    lines = [
        words.home_stale_line(
            document_label(d, readable, words),
            "`" + clip(d.embedding_model or "?", NAME_CHARS).replace("`", "'") + "`",
            words.when(d.indexed_at),
        )
        for d in shown
    ]
    if running:
        action = status
    else:
        reindex = button(
            HOME_REINDEX_ACTION_ID, words.HOME_REINDEX, "reindex", "primary", emoji=True
        )
        action = [actions([reindex], block_id="kb_home_reindex")]
    summary = section_block(words.home_stale_summary(len(stale)))
    return [*head, summary, *_packed(lines), *pager, *action]


def _gap_blocks(
    gaps: Sequence[Gap] | None, failed: bool, links: Mapping[int, str], pages: Pages, words: Words
) -> list[Block]:
    head = [header(words.HOME_GAPS_HEADER, emoji=True), context(words.HOME_GAPS_INTRO)]
    if gaps is None:
        pending = words.HOME_GAPS_FAILED if failed else words.HOME_GAPS_PENDING
        return [*head, context(pending)]
    if not gaps:
        return [*head, context(words.HOME_NO_GAPS)]
    shown, pager = _paged(Section.GAPS, gaps, pages, words)
    return [*head, *[section_block(_gap_text(g, links, words)) for g in shown], *pager]


def _gap_text(gap: Gap, links: Mapping[int, str], words: Words) -> str:
    outcomes = ", ".join(words.home_gap_outcome(o, n) for o, n in gap.outcomes)
    lines = [
        words.home_gap(
            clip(gap.question, QUESTION_CHARS),
            gap.count,
            outcomes,
            words.when(gap.last_asked),
            gap.people,
        )
    ]
    if gap.examples:
        lines.append(words.home_gap_examples([clip(e, EXAMPLE_CHARS) for e in gap.examples]))
    lines.append(_closest(gap, links, words))
    return "\n".join(lines)


def _closest(gap: Gap, links: Mapping[int, str], words: Words) -> str:
    row = gap.closest
    if row is None or gap.distance is None:
        return words.HOME_GAP_NO_PASSAGE
    distance = gap.distance
    url = links.get(row.id)
    if url is None:
        # A channel's passage: where it is, never what it says or is called.
        where = words.home_gap_channel_passage(scope_label(row.scope, words))
        return words.home_gap_closest(where, distance)
    label = clip(row.document, NAME_CHARS)
    section = row.section.split(" > ")[-1].strip() if row.section else ""
    if section:
        label += " › " + clip(section, SECTION_CHARS)
    link = f"<{safe_url(url)}|{label.replace('|', '¦')}>"
    return words.home_gap_closest(link, distance)


def _disliked_blocks(
    disliked: Sequence[Disliked], total: int, pages: Pages, words: Words
) -> list[Block]:
    head = [header(words.HOME_DISLIKED_HEADER, emoji=True)]
    if not disliked:
        return [*head, context(words.HOME_NO_DISLIKED)]
    page = page_number(Section.DISLIKED, total, pages)
    pager = _pager(Section.DISLIKED, page, page_count(Section.DISLIKED, total), total, words)
    return [*head, *_packed([_disliked_line(d, words) for d in disliked]), *pager]


def _disliked_line(d: Disliked, words: Words) -> str:
    if d.thread_url:
        where = f"<{safe_url(d.thread_url)}|{words.HOME_THREAD}>"
    else:
        where = words.HOME_IN_A_DM if d.direct else "—"
    line = words.home_disliked_line(
        clip(d.question, QUESTION_CHARS), clip(d.outcome, 40), d.dislikes, words.when(d.at), where
    )
    answer = words.HOME_ANSWER_WITHHELD if d.withheld else clip(d.answer, ANSWER_CHARS)
    return f"{line}\n> {answer}" if answer else line


def _calibration_blocks(calibration: Calibration, words: Words) -> list[Block]:
    threshold = calibration.threshold
    related = calibration.related_threshold
    lines = [words.home_thresholds(threshold, related if related > threshold else None)]
    if calibration.origin:
        lines.append(words.home_thresholds_model(calibration.model, calibration.origin))
    if calibration.store_model_refused:
        lines.append(words.home_store_model_refused(escape(calibration.store_model_refused)))
    if calibration.kept_model:
        lines.append(words.home_kept_model(*calibration.kept_model))
    if calibration.language_advice:
        lines.append(words.home_wrong_model(calibration.language_advice))
    record = calibration.record
    if record is None:
        lines.append(words.HOME_NO_CALIBRATION)
    else:
        lines.append(
            words.home_calibrated(
                words.when(record.at),
                "`" + clip(record.source, NAME_CHARS).replace("`", "'") + "`",
                record.max_bluff_rate,
                _threshold(record.proposed_threshold, words),
                _threshold(record.proposed_related, words),
            )
        )
        row = record.rates_at(threshold)
        lines.append(_rates(threshold, row, words) if row else words.home_no_rates(threshold))
    return [header(words.HOME_CALIBRATION_HEADER, emoji=True), section_block("\n".join(lines))]


def _threshold(value: float | None, words: Words) -> str:
    return words.number(value, 3) if value is not None else words.NO_THRESHOLD


def _rates(threshold: float, row: RateRow, words: Words) -> str:
    bluffs = words.home_rate(row.bluffs, row.ood, *row.bluff_interval)
    refused = words.home_rate(row.refused, row.in_domain, *row.refused_interval)
    return words.home_rates(threshold, bluffs, refused)
