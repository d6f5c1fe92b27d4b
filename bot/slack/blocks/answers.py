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

from bot.slack import messages
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
from bot.slack.blocks.mrkdwn import (
    FALLBACK_LIMIT,
    SECTION_LIMIT,
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
from core.answer import Answer, Outcome, SourceRef
from core.gate import MAX_RELATED

# Slack's 50 blocks of a message.
MAX_BLOCKS = 50
QUOTE_CHARS = 200
EVIDENCE_QUOTE_CHARS = 600


def render_answer(
    answer: Answer, *, note: str | None = None, ask_a_person: bool = False
) -> Rendered:
    """Render any outcome of :meth:`core.answer.Engine.ask` as a Slack message.

    ``note`` is server-written mrkdwn shown above the answer (for example why
    fewer documents were searched). ``ask_a_person`` adds the button that hands
    the question to people (``KB_ESCALATION_CHANNEL``) to a logged answer.
    """
    notes = [n for n in (note, answer.links_note and escape(answer.links_note)) if n]
    head: list[Block] = [context("\n".join(notes))] if notes else []
    tail = [*_beside(answer), *_tail(answer, ask_a_person)]
    if answer.outcome == Outcome.REFUSED:
        return _render_refusal(head, tail)
    if answer.outcome == Outcome.MODEL_UNAVAILABLE:
        return _render_evidence(answer, head, tail)
    if answer.outcome == Outcome.RELATED:
        return _render_related(answer, head, tail)
    if answer.outcome == Outcome.UNSUPPORTED:
        return _render_uncited(answer, head, tail)
    return _render_answered(answer, head, tail)


def _beside(answer: Answer) -> list[Block]:
    """The passages shown beside an answer, one link each, labelled as not used for it."""
    if not answer.beside:
        return []
    text = messages.BESIDE_HEADER
    for s in answer.beside:
        line = f"\n• {linked(s.url, _where(s))}"
        if len(text) + len(line) <= SECTION_LIMIT:
            text += line  # a link is never cut: one that does not fit is left out
    return [context(text)] if text != messages.BESIDE_HEADER else []


def _tail(answer: Answer, ask_a_person: bool) -> list[Block]:
    """Feedback buttons and, when asked for, "Ask a person": only under a logged answer."""
    if answer.query_id is None:
        return []
    if ask_a_person:
        return [_feedback(answer.query_id), _ask_a_person(answer.query_id)]
    return [_feedback(answer.query_id)]


def _render_answered(answer: Answer, head: list[Block], tail: list[Block]) -> Rendered:
    body = split_mrkdwn(from_markdown(link_citations(answer.answer, answer.sources)))
    source_lines = [_source_line(s, QUOTE_CHARS) for s in answer.sources]
    sources = (
        [section(t) for t in pack(source_lines, messages.SOURCES_HEADER)] if source_lines else []
    )
    blocks = _assemble(head, body or [messages.EMPTY_ANSWER], [*sources, *tail])
    text = fit(
        from_markdown(inert_links(answer.answer, cited_text(answer.sources))), FALLBACK_LIMIT
    )
    return Rendered.build(text or messages.EMPTY_ANSWER, blocks)


def _render_uncited(answer: Answer, head: list[Block], tail: list[Block]) -> Rendered:
    """The model's text under a warning, then the passages it was given as possibly related.

    An answer that cites nothing is most often the model saying the passages do
    not answer the question; the passages still came nearest to it, and are
    what the asker can check the text against. They are labelled as not cited,
    never as sources.
    """
    head = [*head, context(messages.UNSUPPORTED_WARNING)]
    body = split_mrkdwn(from_markdown(link_citations(answer.answer, [])))
    passages = answer.kept[:MAX_RELATED]
    lines = [_source_line(s, QUOTE_CHARS) for s in passages]
    shown = (
        [section(messages.UNCITED_HEADER), context(messages.UNCITED_REASON)]
        + [section(t) for t in pack(lines, "")]
        if lines
        else []
    )
    blocks = _assemble(head, body or [messages.EMPTY_ANSWER], [*shown, *tail])
    plain = from_markdown(inert_links(answer.answer))
    if passages:
        plain += f"\n{messages.UNCITED_FALLBACK}\n" + _passages_text(passages)
    return Rendered.build(fit(f"{messages.UNSUPPORTED_WARNING}\n{plain}", FALLBACK_LIMIT), blocks)


def _render_refusal(head: list[Block], tail: list[Block]) -> Rendered:
    return Rendered.build(messages.REFUSAL, [*head, section(messages.REFUSAL), *tail])


def _render_evidence(answer: Answer, head: list[Block], tail: list[Block]) -> Rendered:
    labels = (messages.EVIDENCE_HEADER, messages.EVIDENCE_REASON, messages.EVIDENCE_FALLBACK)
    return _render_passages(answer.kept or answer.sources, labels, head, tail)


def _render_related(answer: Answer, head: list[Block], tail: list[Block]) -> Rendered:
    # Shown the way evidence is, under its own label: these passages are not an answer.
    labels = (messages.RELATED_HEADER, messages.RELATED_REASON, messages.RELATED_FALLBACK)
    return _render_passages(answer.sources, labels, head, tail)


def _render_passages(
    passages: Sequence[SourceRef],
    labels: tuple[str, str, str],
    head: list[Block],
    tail: list[Block],
) -> Rendered:
    header, reason, fallback = labels
    head = [*head, section(header), context(reason)]
    lines = [_source_line(s, EVIDENCE_QUOTE_CHARS) for s in passages]
    blocks = _assemble(head, pack(lines, ""), tail)
    return Rendered.build(fit(f"{fallback}\n{_passages_text(passages)}", FALLBACK_LIMIT), blocks)


def _passages_text(passages: Sequence[SourceRef]) -> str:
    """Passages as plain notification text: one line each, no links."""
    return "\n".join(
        f"[{s.n}] {s.document}"
        + (f" › {s.section}" if s.section else "")
        + f": {shorten(s.quote, QUOTE_CHARS)}"
        for s in passages
    )


def _assemble(head: list[Block], body: list[str], tail: list[Block]) -> list[Block]:
    """``head`` + sections of ``body`` + ``tail``, cutting ``body`` to stay within 50 blocks."""
    room = MAX_BLOCKS - len(head) - len(tail)
    sections: list[Block] = [section(t) for t in body]
    if len(sections) > room:
        sections = [*sections[: room - 1], context(messages.TRUNCATED)]
    return [*head, *sections, *tail]


# ---------------------------------------------------------------- sources


def _source_heading(s: SourceRef) -> str:
    return f"{linked(s.url, f'[{s.n}]')} " + _where(s, bold=True)


def _where(s: SourceRef, *, bold: bool = False) -> str:
    """A passage's document, section and page, escaped: ``Handbook › Expenses · p. 2``."""
    document = label(s.document) or messages.UNNAMED_PASSAGE
    parts = [f"*{document}*" if bold else document]
    where = label(s.section)
    if where:
        parts.append("› " + where)
    if s.page is not None:
        parts.append(f"· p. {s.page}")
    return " ".join(parts)


def _source_line(s: SourceRef, quote_chars: int) -> str:
    shown = quote(s.quote, quote_chars)
    return f"{_source_heading(s)}\n> {shown}" if shown else _source_heading(s)


# ---------------------------------------------------------------- under an answer


def _feedback(query_id: int) -> Block:
    def feedback_button(text: str, value: str) -> FeedbackButtonObject:
        return FeedbackButtonObject(text=plain_text(text), value=value)

    buttons = FeedbackButtonsElement(
        action_id=FEEDBACK_ACTION_ID,
        positive_button=feedback_button(messages.FEEDBACK_POSITIVE, f"positive:{query_id}"),
        negative_button=feedback_button(messages.FEEDBACK_NEGATIVE, f"negative:{query_id}"),
    )
    return ContextActionsBlock(elements=[buttons])


def _ask_a_person(query_id: int) -> Block:
    # Its own block: a context_actions block holds only feedback and icon buttons.
    return actions([button(ASK_A_PERSON_ACTION_ID, messages.ASK_A_PERSON, str(query_id))])


def parse_query_id(value: str) -> int | None:
    """The query id an "Ask a person" button carries, or ``None`` when it is not one."""
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        return None
    return int(value) or None


def parse_feedback_value(value: str) -> tuple[int, int] | None:
    """``(query id, +1 or -1)`` from a feedback button's value, or ``None`` if malformed."""
    kind, _, qid = value.partition(":")
    sign = {"positive": 1, "negative": -1}.get(kind)
    if sign is None or not qid.isdigit():
        return None
    return int(qid), sign


# ---------------------------------------------------------------- while it is written


def render_partial(text: str) -> Rendered:
    """The placeholder while the model is still writing (no links yet: citations are unresolved)."""
    text = inert_links(text)
    body = (fit(from_markdown(text), SECTION_LIMIT - 1) if text.strip() else "") or escape(
        messages.PLACEHOLDER
    )
    return Rendered.build(
        fit(text, FALLBACK_LIMIT) or messages.PLACEHOLDER,
        [section(body), context(messages.WRITING)],
    )


def render_notice(text: str) -> Rendered:
    """A message of server-written mrkdwn (placeholder, help, errors): one section, or as many as a
    text past a section's limit needs (a reason quoting a document can be long), never an error."""
    parts = split_mrkdwn(text)
    return Rendered.build(parts[0] if len(parts) > 1 else text, [section(p) for p in parts])
