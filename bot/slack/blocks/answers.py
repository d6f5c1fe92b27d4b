"""Answers as Block Kit: every outcome of the engine, the answer being written, notices.

An answer's text, its sources' names and quotes were written by a model and
by documents: escaped (:mod:`bot.slack.blocks.mrkdwn`), so its only links are
the server's citation links. Slack's limits are respected here rather than
discovered at run time: at most 50 blocks (:data:`MAX_BLOCKS`), at most 3000
characters per section (long answers are split at paragraph, line or word
boundaries, never inside a link or an entity), and a plain ``text`` fallback of
at most 3000 characters on every message. Under a logged answer: the feedback
buttons and, when asked for, "Ask a person".
"""

from __future__ import annotations

from collections.abc import Sequence

from slack_sdk.models.blocks import (
    Block,
    ContextActionsBlock,
    FeedbackButtonObject,
    FeedbackButtonsElement,
)

from bot.slack.blocks.actions import ASK_A_PERSON_ACTION_ID, FEEDBACK_ACTION_ID
from bot.slack.blocks.elements import (
    Rendered,
    actions,
    button,
    context,
    pack,
    plain_text,
    section,
)
from bot.slack.blocks.from_slack import from_slack_blocks
from bot.slack.blocks.mrkdwn import (
    FALLBACK_LIMIT,
    SECTION_LIMIT,
    Cited,
    cited_text,
    escape,
    fit,
    from_markdown,
    inert_links,
    label,
    link_citations,
    linked,
    quote,
    shorten,
    split_mrkdwn,
)
from bot.slack.words import Words
from core.answer import UNSIGNED_LINKS_TEXT, Answer, Outcome, SourceRef
from core.gate import MAX_RELATED
from core.outside import OutsideRef

# Slack's 50 blocks of a message.
MAX_BLOCKS = 50
QUOTE_CHARS = 200
EVIDENCE_QUOTE_CHARS = 600


def render_answer(
    answer: Answer,
    *,
    words: Words,
    note: str | None = None,
    ask_a_person: bool = False,
    buttons: bool = True,
    from_slack: bool = False,
) -> Rendered:
    """Render any outcome of :meth:`core.answer.Engine.ask` as a Slack message.

    ``words``: the asker's language. ``note`` is server-written mrkdwn shown above the answer (for example why
    fewer documents were searched). ``ask_a_person`` adds the button that hands
    the question to people (``KB_ESCALATION_CHANNEL``) to a logged answer.
    ``buttons=False`` leaves out every button (feedback, "Ask a person"): Slackbot
    shows a tool's blocks as its own message, where they would reach no listener.
    ``from_slack``: the message is read by the asker alone, and shows the "From
    Slack" group (``answer.outside``) below the answer; never set it elsewhere.
    """
    notes = [n for n in (note, _links_note(answer, words)) if n]
    head: list[Block] = [context("\n".join(notes))] if notes else []
    buttons_below = _tail(answer, ask_a_person, words) if buttons else []
    group = from_slack_blocks(answer.outside, words) if from_slack else []
    tail = [*_beside(answer, words), *group, *buttons_below]
    if answer.outcome == Outcome.REFUSED:
        return _render_refusal(head, tail, words)
    if answer.outcome == Outcome.MODEL_UNAVAILABLE:
        return _render_evidence(answer, head, tail, words)
    if answer.outcome == Outcome.RELATED:
        return _render_related(answer, head, tail, words)
    if answer.outcome == Outcome.UNSUPPORTED:
        return _render_uncited(answer, head, tail, words)
    return _render_answered(answer, head, tail, words)


def _links_note(answer: Answer, words: Words) -> str | None:
    """The engine's note about links, in the asker's language when the catalogs have it."""
    if not answer.links_note:
        return None
    if answer.links_note == UNSIGNED_LINKS_TEXT:
        return words.UNSIGNED_LINKS
    return escape(answer.links_note)


def _beside(answer: Answer, words: Words) -> list[Block]:
    """The passages shown beside an answer, one link each, labelled as not used for it."""
    if not answer.beside:
        return []
    text = words.BESIDE_HEADER
    for s in answer.beside:
        line = f"\n• {linked(s.url, _where(s, words))}"
        if len(text) + len(line) <= SECTION_LIMIT:
            text += line  # a link is never cut: one that does not fit is left out
    return [context(text)] if text != words.BESIDE_HEADER else []


def _tail(answer: Answer, ask_a_person: bool, words: Words) -> list[Block]:
    """Feedback buttons and, when asked for, "Ask a person": only under a logged answer."""
    if answer.query_id is None:
        return []
    if ask_a_person:
        return [_feedback(answer.query_id, words), _ask_a_person(answer.query_id, words)]
    return [_feedback(answer.query_id, words)]


def _render_answered(
    answer: Answer, head: list[Block], tail: list[Block], words: Words
) -> Rendered:
    cited: list[Cited] = [*answer.sources, *_cited_outside(answer)]
    body = split_mrkdwn(from_markdown(link_citations(answer.answer, cited)))
    source_lines = [_source_line(s, QUOTE_CHARS, words) for s in answer.sources]
    sources = [section(t) for t in pack(source_lines, words.SOURCES_HEADER)] if source_lines else []
    blocks = _assemble(head, body or [words.EMPTY_ANSWER], [*sources, *tail], words)
    text = fit(from_markdown(inert_links(answer.answer, cited_text(cited))), FALLBACK_LIMIT)
    return Rendered.build(text or words.EMPTY_ANSWER, blocks)


def _cited_outside(answer: Answer) -> list[OutsideRef]:
    """The Slack messages the answer cites (the model read them only for the asker alone)."""
    if answer.outside is None or not answer.outside.quoted:
        return []
    return [ref for ref in answer.outside.shown if ref.n]


def _render_uncited(answer: Answer, head: list[Block], tail: list[Block], words: Words) -> Rendered:
    """The model's text under a warning, then the passages it was given as possibly related.

    An answer that cites nothing is most often the model saying the passages do
    not answer the question; the passages still came nearest to it, and are
    what the asker can check the text against. They are labelled as not cited,
    never as sources.
    """
    head = [*head, context(words.UNSUPPORTED_WARNING)]
    body = split_mrkdwn(from_markdown(link_citations(answer.answer, [])))
    passages = answer.kept[:MAX_RELATED]
    lines = [_source_line(s, QUOTE_CHARS, words) for s in passages]
    shown = (
        [section(words.UNCITED_HEADER), context(words.UNCITED_REASON)]
        + [section(t) for t in pack(lines, "")]
        if lines
        else []
    )
    blocks = _assemble(head, body or [words.EMPTY_ANSWER], [*shown, *tail], words)
    plain = from_markdown(inert_links(answer.answer))
    if passages:
        plain += f"\n{words.UNCITED_FALLBACK}\n" + _passages_text(passages)
    return Rendered.build(fit(f"{words.UNSUPPORTED_WARNING}\n{plain}", FALLBACK_LIMIT), blocks)


def _render_refusal(head: list[Block], tail: list[Block], words: Words) -> Rendered:
    return Rendered.build(words.REFUSAL, [*head, section(words.REFUSAL), *tail])


def _render_evidence(
    answer: Answer, head: list[Block], tail: list[Block], words: Words
) -> Rendered:
    labels = (words.EVIDENCE_HEADER, words.EVIDENCE_REASON, words.EVIDENCE_FALLBACK)
    return _render_passages(answer.kept or answer.sources, labels, head, tail, words)


def _render_related(answer: Answer, head: list[Block], tail: list[Block], words: Words) -> Rendered:
    # Shown the way evidence is, under its own label: these passages are not an answer.
    labels = (words.RELATED_HEADER, words.RELATED_REASON, words.RELATED_FALLBACK)
    return _render_passages(answer.sources, labels, head, tail, words)


def _render_passages(
    passages: Sequence[SourceRef],
    labels: tuple[str, str, str],
    head: list[Block],
    tail: list[Block],
    words: Words,
) -> Rendered:
    header, reason, fallback = labels
    head = [*head, section(header), context(reason)]
    lines = [_source_line(s, EVIDENCE_QUOTE_CHARS, words) for s in passages]
    blocks = _assemble(head, pack(lines, ""), tail, words)
    return Rendered.build(fit(f"{fallback}\n{_passages_text(passages)}", FALLBACK_LIMIT), blocks)


def render_search(
    written_from: Sequence[SourceRef], beside: Sequence[SourceRef], *, words: Words
) -> Rendered:
    """The passages a search found, as an answer to the same question shows them.

    ``written_from``: the passages an answer would be written from (they pass
    the gate), numbered first; ``beside``: the possibly related ones after them.
    Each is ``[n]`` linked to its passage, its document and section, and a short
    quote; with nothing to answer from, the possibly related passages are shown
    as an answer shows them (not an answer), and with nothing at all, the
    refusal.
    """
    if not written_from:
        if not beside:
            return _render_refusal([], [], words)
        labels = (words.RELATED_HEADER, words.RELATED_REASON, words.RELATED_FALLBACK)
        return _render_passages(beside, labels, [], [], words)
    lines = [_source_line(s, QUOTE_CHARS, words) for s in written_from]
    body = pack(lines, words.SOURCES_HEADER)
    tail: list[Block] = []
    if beside:
        tail = [context(words.BESIDE_HEADER)] + [
            section(t) for t in pack([_source_line(s, QUOTE_CHARS, words) for s in beside], "")
        ]
    blocks = _assemble([], body, tail, words)
    text = fit(_passages_text([*written_from, *beside]), FALLBACK_LIMIT)
    return Rendered.build(text, blocks)


def _passages_text(passages: Sequence[SourceRef]) -> str:
    """Passages as plain notification text: one line each, no links."""
    return "\n".join(
        f"[{s.n}] {s.document}"
        + (f" › {s.section}" if s.section else "")
        + f": {shorten(s.quote, QUOTE_CHARS)}"
        for s in passages
    )


def _assemble(head: list[Block], body: list[str], tail: list[Block], words: Words) -> list[Block]:
    """``head`` + sections of ``body`` + ``tail``, cutting ``body`` to stay within 50 blocks."""
    room = MAX_BLOCKS - len(head) - len(tail)
    sections: list[Block] = [section(t) for t in body]
    if len(sections) > room:
        sections = [*sections[: room - 1], context(words.TRUNCATED)]
    return [*head, *sections, *tail]


# ---------------------------------------------------------------- sources


def _source_heading(s: SourceRef, words: Words) -> str:
    heading = f"{linked(s.url, f'[{s.n}]')} " + _where(s, words, bold=True)
    if s.origin:
        # Synced from a source: where the document opens there too.
        heading += f" · {linked(s.origin, words.OPEN_ORIGINAL)}"
    return heading


def _where(s: SourceRef, words: Words, *, bold: bool = False) -> str:
    """A passage's document, section and page, escaped: ``Handbook › Expenses · p. 2``."""
    document = label(s.document) or words.UNNAMED_PASSAGE
    parts = [f"*{document}*" if bold else document]
    where = label(s.section)
    if where:
        parts.append("› " + where)
    if s.page is not None:
        parts.append("· " + words.page(s.page))
    return " ".join(parts)


def _source_line(s: SourceRef, quote_chars: int, words: Words) -> str:
    shown = quote(s.quote, quote_chars)
    heading = _source_heading(s, words)
    return f"{heading}\n> {shown}" if shown else heading


# ---------------------------------------------------------------- under an answer


def _feedback(query_id: int, words: Words) -> Block:
    def feedback_button(text: str, value: str) -> FeedbackButtonObject:
        return FeedbackButtonObject(text=plain_text(text), value=value)

    buttons = FeedbackButtonsElement(
        action_id=FEEDBACK_ACTION_ID,
        positive_button=feedback_button(words.FEEDBACK_POSITIVE, f"positive:{query_id}"),
        negative_button=feedback_button(words.FEEDBACK_NEGATIVE, f"negative:{query_id}"),
    )
    return ContextActionsBlock(elements=[buttons])


def _ask_a_person(query_id: int, words: Words) -> Block:
    # Its own block: a context_actions block holds only feedback and icon buttons.
    return actions([button(ASK_A_PERSON_ACTION_ID, words.ASK_A_PERSON, str(query_id))])


def parse_query_id(value: str) -> int | None:
    """The query id an "Ask a person" button carries, or ``None`` when it is not one."""
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        return None
    return int(value) or None


def parse_feedback_value(value: str) -> tuple[int, int] | None:
    """``(query id, +1 or -1)`` from a feedback button's value, or ``None`` if malformed."""
    kind, _, qid = value.partition(":")
    sign = {"positive": 1, "negative": -1}.get(kind)
    query_id = parse_query_id(qid)
    if sign is None or query_id is None:
        return None
    return query_id, sign


# ---------------------------------------------------------------- while it is written


def render_partial(text: str, *, words: Words) -> Rendered:
    """The placeholder while the model is still writing (no links yet: citations are unresolved)."""
    text = inert_links(text)
    body = (fit(from_markdown(text), SECTION_LIMIT - 1) if text.strip() else "") or escape(
        words.PLACEHOLDER
    )
    return Rendered.build(
        fit(text, FALLBACK_LIMIT) or words.PLACEHOLDER,
        [section(body), context(words.WRITING)],
    )


def render_notice(text: str) -> Rendered:
    """A message of server-written mrkdwn (placeholder, help, errors): one section, or as many as a
    text past a section's limit needs (a reason quoting a document can be long), never an error."""
    parts = split_mrkdwn(text)
    return Rendered.build(parts[0] if len(parts) > 1 else text, [section(p) for p in parts])
