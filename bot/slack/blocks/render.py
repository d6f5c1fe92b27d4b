"""Block Kit rendering of answers, evidence, refusals and statuses.

The one rule that matters: everything a model or a document wrote goes through
:func:`escape` before the server adds its own ``<url|label>`` links, so no
answer can ping ``<!channel>``, mention ``<@U123>`` or forge a link. The server's
links are made from URLs it built itself.

Slack's limits are respected here rather than discovered at run time: at most
50 blocks, at most 3000 characters per section (long answers are split at
paragraph, line or word boundaries, never inside a link or an entity), and a
plain ``text`` fallback of at most 3000 characters on every message.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bot.slack import messages
from core.answer import Answer, Outcome, SourceRef
from core.citations import citation_spans
from core.gate import MAX_RELATED
from index.models import EVERYONE
from index.names import display_name
from index.records import AuditEntry, DocumentRow

__all__ = [
    "APPROVE_ACTION_ID",
    "ASK_A_PERSON_ACTION_ID",
    "FEEDBACK_ACTION_ID",
    "MAX_BLOCKS",
    "REJECT_ACTION_ID",
    "RETRY_ACTION_ID",
    "SECTION_LIMIT",
    "UPLOAD_CALLBACK_ID",
    "HandOff",
    "Rendered",
    "audit_lines",
    "escape",
    "inert_links",
    "is_user_id",
    "link_citations",
    "mark_handed_off",
    "mention",
    "parse_feedback_value",
    "parse_query_id",
    "render_answer",
    "render_approval_request",
    "render_hand_off",
    "render_notice",
    "render_partial",
    "render_upload_status",
    "split_mrkdwn",
    "stream_markdown",
    "upload_modal",
]

MAX_BLOCKS = 50
SECTION_LIMIT = 3000
FALLBACK_LIMIT = 3000
QUOTE_CHARS = 200
EVIDENCE_QUOTE_CHARS = 600

FEEDBACK_ACTION_ID = "kb_feedback"
ASK_A_PERSON_ACTION_ID = "kb_ask_a_person"
RETRY_ACTION_ID = "kb_upload_retry"
APPROVE_ACTION_ID = "kb_approve"
REJECT_ACTION_ID = "kb_reject"
PREVIEW_CHARS = 600
MAX_LISTED_VERSIONS = 3
UPLOAD_CALLBACK_ID = "kb_upload"
UPLOAD_FILES_BLOCK = "files"
UPLOAD_VISIBILITY_BLOCK = "visibility"
UPLOAD_TITLE_BLOCK = "title"
UPLOAD_MAX_FILES = 10
VISIBILITY_EVERYONE = "everyone"
VISIBILITY_CHANNEL = "channel"

Block = dict[str, Any]

_ESCAPES = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        # Bidi embeddings, overrides and isolates make Slack show text other than what it
        # is ("pay \u202eexe.pdf" reads "pay fdp.exe"); the marks a language needs stay.
        **dict.fromkeys(map(chr, [*range(0x202A, 0x202F), *range(0x2066, 0x206A)])),
    }
)
_BOLD_RE = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_HEADING_RE = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_SPACES_RE = re.compile(r"\s+")
# What Slack turns into a link by itself: URLs with a scheme, www. hosts,
# e-mail addresses and bare domain names.
_LINKABLE_RE = re.compile(
    r"\b(?:[a-z][a-z0-9+.-]*://|www\.|mailto:)[^\s<>`|]+"
    r"|\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
    r"|\b(?:[a-z0-9-]+\.)+[a-z]{2,}\b(?:/[^\s<>`|]*)?",
    re.IGNORECASE,
)
_TRAILING_PUNCTUATION = ".,;:!?)]}'\"*_~"
# Streamed Markdown: a "]" right before "(", "[" or ":" would make a link; "@here" and
# the like notify; a backtick could close a code span around an inert link.
_LINK_BRACKET_RE = re.compile(r"\](?=[(\[:])")
_BROADCAST_RE = re.compile(r"@(?=(?:channel|here|everyone)\b)", re.IGNORECASE)
_WORD_JOINER = "\u2060"
_BACKTICK_LOOKALIKE = "\u02cb"
# Code as Slack pairs its backticks: a block between triple backticks, else a span on one line.
_CODE_RE = re.compile(r"```.+?```|`[^`\n]+`", re.DOTALL)
_USER_ID_RE = re.compile(r"[UW][A-Z0-9]{2,}")
_CHANNEL_ID_RE = re.compile(r"[CG][A-Z0-9]{2,}")


@dataclass(frozen=True)
class Rendered:
    """A message ready for ``chat.postMessage`` / ``chat.update``."""

    text: str
    blocks: list[Block] = field(default_factory=list)

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the Web API call (links never unfurl)."""
        return {
            "text": self.text,
            "blocks": self.blocks,
            "unfurl_links": False,
            "unfurl_media": False,
        }


# ---------------------------------------------------------------- escaping


def escape(text: str) -> str:
    """Escape ``&``, ``<`` and ``>`` (and drop bidi overrides) so Slack shows ``text`` literally.

    After this no mention (``<@U1>``, ``<!channel>``), link or date token can
    be formed from ``text``.
    """
    return text.translate(_ESCAPES)


def _safe_url(url: str) -> str:
    # Our URLs never contain these, but a link must stay one token whatever happens.
    return escape(url).replace("|", "%7C")


def inert_links(text: str, verbatim: str = "") -> str:
    """``text`` with every link-like token Slack would make clickable set in code, so it is not.

    An answer's only links are the server's citation links; a URL the model
    wrote (from a poisoned document, a prompt injection or a guess) is shown
    as text. A token that occurs verbatim in ``verbatim`` (the cited passages)
    is left as it is: the passage itself vouches for it.
    """

    def inert(m: re.Match[str]) -> str:
        token = m.group(0).rstrip(_TRAILING_PUNCTUATION)
        rest = m.group(0)[len(token) :]
        if not token or token in verbatim:
            return m.group(0)
        return "`" + token.replace("`", "'") + "`" + rest

    # Code the text already holds stays as it is (nothing in it links). Outside it, a
    # backtick left unpaired would pair with the code a link is set in, leaving the
    # link outside: it becomes a look-alike.
    out, pos = [], 0
    for code in _CODE_RE.finditer(text):
        plain = text[pos : code.start()].replace("`", _BACKTICK_LOOKALIKE)
        out += [_LINKABLE_RE.sub(inert, plain), code.group(0)]
        pos = code.end()
    out.append(_LINKABLE_RE.sub(inert, text[pos:].replace("`", _BACKTICK_LOOKALIKE)))
    return "".join(out)


def _mrkdwn(text: str) -> str:
    """Turn the Markdown models write into Slack mrkdwn (bold and headings)."""
    text = _HEADING_RE.sub(r"*\1*", text)
    return _BOLD_RE.sub(r"*\1*", text)


def _fit(raw: str, limit: int) -> str:
    """Escape ``raw`` and cut it (with an ellipsis) so the result has at most ``limit`` characters.

    Returns "" when no visible text would remain, so the caller can say something instead.
    """
    out = escape(raw)
    if len(out) <= limit:
        return out
    cut = raw
    while cut and len(escape(cut)) > limit - 1:
        # A character escapes to up to five ("<" is "&lt;"): shrink in proportion, not by
        # the excess, which would cut a text of "<" to nothing.
        cut = cut[: min(len(cut) - 1, len(cut) * (limit - 1) // len(escape(cut)))]
    cut = cut.rstrip()
    return escape(cut) + "…" if cut else ""


def _shorten(text: str, limit: int) -> str:
    """Collapse whitespace and cut at a word boundary to at most ``limit`` characters."""
    flat = _SPACES_RE.sub(" ", text).strip()
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.") + "…"


# ---------------------------------------------------------------- citations


def link_citations(text: str, sources: Sequence[SourceRef]) -> str:
    """Escape an answer and turn each citation group into links to its passages.

    Args:
        text: the resolved answer, citing sources ``1..len(sources)``.
        sources: the cited sources; ``sources[i].n`` is the number the text uses.

    Returns:
        mrkdwn where ``[1, 2]`` became ``<url1|[1]><url2|[2]>``; every other
        character is escaped and other link-like text set in code (see
        :func:`inert_links`), so only the server's links are links.
    """
    by_number = {s.n: s for s in sources}
    cited = _cited_text(sources)
    out: list[str] = []
    pos = 0
    for start, end, numbers in citation_spans(text, len(sources)):
        links = [f"<{_safe_url(by_number[n].url)}|[{n}]>" for n in numbers if n in by_number]
        out.append(escape(inert_links(text[pos:start], cited)))
        out.append("".join(links) if links else escape(text[start:end]))
        pos = end
    out.append(escape(inert_links(text[pos:], cited)))
    return "".join(out)


def _cited_text(sources: Sequence[SourceRef]) -> str:
    return "\n".join(s.quote for s in sources)


# ---------------------------------------------------------------- splitting


def split_mrkdwn(text: str, limit: int = SECTION_LIMIT) -> list[str]:
    """Split mrkdwn into pieces of at most ``limit`` characters.

    Cuts prefer a paragraph break, then a line break, then a space, and never
    fall inside a ``<...>`` link or an ``&...;`` entity.
    """
    pieces: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        cut = _cut_point(rest, limit)
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        pieces.append(rest)
    return pieces


def _cut_point(text: str, limit: int) -> int:
    window = text[:limit]
    for sep in ("\n\n", "\n", " "):
        at = window.rfind(sep)
        if at > limit // 4:
            cut = _outside_tokens(text, at + len(sep))
            if cut > 0:
                return cut
    cut = _outside_tokens(text, limit)
    return cut if cut > 0 else limit


def _outside_tokens(text: str, cut: int) -> int:
    """Move ``cut`` back so it is not inside a ``<...>`` link or an ``&...;`` entity."""
    opening = text.rfind("<", 0, cut)
    if opening != -1 and text.rfind(">", opening, cut) == -1:
        cut = opening
    amp = text.rfind("&", max(0, cut - 5), cut)
    if amp != -1 and ";" not in text[amp:cut]:
        cut = amp
    return cut


# ---------------------------------------------------------------- blocks


def _mrkdwn_text(text: str) -> dict[str, Any]:
    # verbatim: Slack turns nothing into a link or a mention by itself; only the
    # server's explicit <url|label> and <@user> tokens (escaping guarantees no
    # others) are links or mentions.
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def _section(text: str) -> Block:
    return {"type": "section", "text": _mrkdwn_text(text)}


def _context(text: str) -> Block:
    return {"type": "context", "elements": [_mrkdwn_text(text)]}


def _feedback(query_id: int) -> Block:
    def button(label: str, value: str) -> dict[str, Any]:
        return {"text": {"type": "plain_text", "text": label}, "value": value}

    return {
        "type": "context_actions",
        "elements": [
            {
                "type": "feedback_buttons",
                "action_id": FEEDBACK_ACTION_ID,
                "positive_button": button(messages.FEEDBACK_POSITIVE, f"positive:{query_id}"),
                "negative_button": button(messages.FEEDBACK_NEGATIVE, f"negative:{query_id}"),
            }
        ],
    }


def _ask_a_person(query_id: int) -> Block:
    # Its own block: a context_actions block holds only feedback and icon buttons.
    button = {
        "type": "button",
        "action_id": ASK_A_PERSON_ACTION_ID,
        "text": {"type": "plain_text", "text": messages.ASK_A_PERSON},
        "value": str(query_id),
    }
    return {"type": "actions", "elements": [button]}


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


def _source_heading(s: SourceRef) -> str:
    return f"<{_safe_url(s.url)}|[{s.n}]> " + _where(s, bold=True)


def _where(s: SourceRef, *, bold: bool = False) -> str:
    """A passage's document, section and page, escaped: ``Handbook › Expenses · p. 2``."""
    document = _label(s.document) or messages.UNNAMED_PASSAGE
    parts = [f"*{document}*" if bold else document]
    section = _label(s.section)
    if section:
        parts.append("› " + section)
    if s.page is not None:
        parts.append(f"· p. {s.page}")
    return " ".join(parts)


def _label(text: str) -> str:
    """A document's name, title or section as shown: one line, escaped, no link of its own."""
    return escape(inert_links(display_name(text)))


def _quote(text: str, limit: int) -> str:
    """``text`` shortened at a word to ``limit``, escaped, and still within ``limit`` once escaped."""
    return _fit(_shorten(text, limit), limit)


def _source_line(s: SourceRef, quote_chars: int) -> str:
    quote = _quote(s.quote, quote_chars)
    return f"{_source_heading(s)}\n> {quote}" if quote else _source_heading(s)


def _pack(lines: Sequence[str], header: str) -> list[str]:
    """Group lines into section texts of at most ``SECTION_LIMIT`` characters."""
    sections: list[str] = []
    current = header
    for line in lines:
        candidate = f"{current}\n{line}" if current else line
        if len(candidate) > SECTION_LIMIT and current:
            sections.append(current)
            current = line
        else:
            current = candidate
    if current:
        sections.append(current)
    return sections


def _assemble(head: list[Block], body: list[str], tail: list[Block]) -> list[Block]:
    """``head`` + sections of ``body`` + ``tail``, cutting ``body`` to stay within 50 blocks."""
    room = MAX_BLOCKS - len(head) - len(tail)
    sections = [_section(t) for t in body]
    if len(sections) > room:
        sections = [*sections[: room - 1], _context(messages.TRUNCATED)]
    return [*head, *sections, *tail]


# ---------------------------------------------------------------- answers


def render_answer(
    answer: Answer, *, note: str | None = None, ask_a_person: bool = False
) -> Rendered:
    """Render any outcome of :meth:`core.answer.Engine.ask` as a Slack message.

    ``note`` is server-written mrkdwn shown above the answer (for example why
    fewer documents were searched). ``ask_a_person`` adds the button that hands
    the question to people (``KB_ESCALATION_CHANNEL``) to a logged answer.
    """
    head = [_context(note)] if note else []
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
        line = f"\n• <{_safe_url(s.url)}|{_where(s)}>"
        if len(text) + len(line) <= SECTION_LIMIT:
            text += line  # a link is never cut: one that does not fit is left out
    return [_context(text)] if text != messages.BESIDE_HEADER else []


def _tail(answer: Answer, ask_a_person: bool) -> list[Block]:
    """Feedback buttons and, when asked for, "Ask a person": only under a logged answer."""
    if answer.query_id is None:
        return []
    if ask_a_person:
        return [_feedback(answer.query_id), _ask_a_person(answer.query_id)]
    return [_feedback(answer.query_id)]


def _render_answered(answer: Answer, head: list[Block], tail: list[Block]) -> Rendered:
    body = split_mrkdwn(_mrkdwn(link_citations(answer.answer, answer.sources)))
    source_lines = [_source_line(s, QUOTE_CHARS) for s in answer.sources]
    sources = (
        [_section(t) for t in _pack(source_lines, messages.SOURCES_HEADER)] if source_lines else []
    )
    blocks = _assemble(head, body or [messages.EMPTY_ANSWER], [*sources, *tail])
    text = _fit(_mrkdwn(inert_links(answer.answer, _cited_text(answer.sources))), FALLBACK_LIMIT)
    return Rendered(text or messages.EMPTY_ANSWER, blocks)


def _render_uncited(answer: Answer, head: list[Block], tail: list[Block]) -> Rendered:
    """The model's text under a warning, then the passages it was given as possibly related.

    An answer that cites nothing is most often the model saying the passages do
    not answer the question; the passages still came nearest to it, and are
    what the asker can check the text against. They are labelled as not cited,
    never as sources.
    """
    head = [*head, _context(messages.UNSUPPORTED_WARNING)]
    body = split_mrkdwn(_mrkdwn(link_citations(answer.answer, [])))
    passages = answer.kept[:MAX_RELATED]
    lines = [_source_line(s, QUOTE_CHARS) for s in passages]
    shown = (
        [_section(messages.UNCITED_HEADER), _context(messages.UNCITED_REASON)]
        + [_section(t) for t in _pack(lines, "")]
        if lines
        else []
    )
    blocks = _assemble(head, body or [messages.EMPTY_ANSWER], [*shown, *tail])
    plain = _mrkdwn(inert_links(answer.answer))
    if passages:
        plain += f"\n{messages.UNCITED_FALLBACK}\n" + _passages_text(passages)
    return Rendered(_fit(f"{messages.UNSUPPORTED_WARNING}\n{plain}", FALLBACK_LIMIT), blocks)


def _render_refusal(head: list[Block], tail: list[Block]) -> Rendered:
    return Rendered(messages.REFUSAL, [*head, _section(messages.REFUSAL), *tail])


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
    head = [*head, _section(header), _context(reason)]
    lines = [_source_line(s, EVIDENCE_QUOTE_CHARS) for s in passages]
    blocks = _assemble(head, _pack(lines, ""), tail)
    return Rendered(_fit(f"{fallback}\n{_passages_text(passages)}", FALLBACK_LIMIT), blocks)


def _passages_text(passages: Sequence[SourceRef]) -> str:
    """Passages as plain notification text: one line each, no links."""
    return "\n".join(
        f"[{s.n}] {s.document}"
        + (f" › {s.section}" if s.section else "")
        + f": {_shorten(s.quote, QUOTE_CHARS)}"
        for s in passages
    )


def render_partial(text: str) -> Rendered:
    """The placeholder while the model is still writing (no links yet: citations are unresolved)."""
    text = inert_links(text)
    body = (_fit(_mrkdwn(text), SECTION_LIMIT - 1) if text.strip() else "") or escape(
        messages.PLACEHOLDER
    )
    return Rendered(
        _fit(text, FALLBACK_LIMIT) or messages.PLACEHOLDER,
        [_section(body), _context(messages.WRITING)],
    )


def stream_markdown(text: str) -> str:
    """The answer so far as the standard Markdown ``chat.startStream`` / ``appendStream`` take.

    Streamed text is Markdown, not mrkdwn, and has no ``verbatim``: Slack would
    turn ``[text](url)``, bare URLs and mentions in it into links and pings. So
    ``&``, ``<`` and ``>`` are escaped (no ``<!channel>``, ``<@U1>``,
    ``<url|text>``, autolink or HTML), a ``]`` never opens a Markdown link
    (``[text](url)``, ``[text][ref]``, ``[ref]: url``), ``@here``-style words get
    an invisible word joiner, and every link-like token is set in code
    (:func:`inert_links`), after the model's own backticks became a look-alike so
    that no code span it opened can leave such a token outside code. Citation
    numbers stay a plain ``[n]``: they become links in the final answer only.

    Each token is rewritten on its own: the Markdown of a text cut before a
    word begins the Markdown of any longer text, so what was streamed never
    has to be taken back.
    """
    text = inert_links(text.replace("`", _BACKTICK_LOOKALIKE))
    text = _LINK_BRACKET_RE.sub("]" + _WORD_JOINER, text)
    return escape(_BROADCAST_RE.sub("@" + _WORD_JOINER, text))


def render_notice(text: str) -> Rendered:
    """A one-section message of server-written mrkdwn (placeholder, help, errors)."""
    return Rendered(text, [_section(text)])


# ---------------------------------------------------------------- handing a question to a person

HAND_OFF_QUESTION_CHARS = 1500


@dataclass(frozen=True)
class HandOff:
    """What the escalation channel is told about one question.

    Attributes:
        asker: the asker's user id (``None``: not on record).
        by: who handed it off (a user id).
        channel: where it was asked: a channel id, or a DM's ``D...`` id.
        question: its text, or ``None`` when it may not be shown.
        outcome: how the bot replied (a ``core.answer.Outcome`` value).
        answer: the bot's answer, or ``None`` when it may not be shown (or there was none).
        permalink: the thread's link, as Slack gave it.
    """

    asker: str | None
    by: str
    channel: str
    question: str | None
    outcome: str
    answer: str | None = None
    permalink: str | None = None

    @property
    def direct(self) -> bool:
        """Whether it was asked in a DM with the bot (nobody else can open that thread)."""
        return self.channel.startswith("D")


def render_hand_off(h: HandOff) -> Rendered:
    """The message handing ``h`` to people: who asked where, the question, the bot's reply, a link.

    The question and the answer were written by a person and a model: escaped,
    their links inert, so nothing in them mentions, pings or links anyone.
    """
    asker = mention(h.asker) if h.asker else messages.HAND_OFF_SOMEONE
    place = messages.HAND_OFF_DM_PLACE if h.direct else f"in {scope_label(h.channel)}"
    head = [messages.HAND_OFF_TITLE, messages.hand_off_asked(asker, place)]
    if h.by != h.asker:
        head.append(messages.hand_off_by(mention(h.by)))
    question = _quote(inert_links(h.question), HAND_OFF_QUESTION_CHARS) if h.question else ""
    if h.direct:
        follow_up = messages.hand_off_reply_directly(asker)
    elif h.permalink:
        follow_up = f"<{_safe_url(h.permalink)}|{messages.HAND_OFF_OPEN_THREAD}>"
    else:
        follow_up = messages.HAND_OFF_NO_LINK
    blocks = [
        _section("\n".join(head)),
        _section(f"> {question}" if question else messages.HAND_OFF_QUESTION_WITHHELD),
        _section(_hand_off_reply(h)),
        _section(follow_up),
    ]
    return Rendered(_fit(" ".join(head[1:]), FALLBACK_LIMIT), blocks)


def mark_handed_off(blocks: Sequence[Block], note: str) -> list[Block]:
    """An answer's ``blocks`` with its "Ask a person" button replaced by ``note`` (mrkdwn).

    So everyone in the thread sees that people were asked, and nobody clicks again.
    """
    return [_context(note) if _holds_ask_a_person(b) else b for b in blocks if isinstance(b, dict)]


def _holds_ask_a_person(block: Block) -> bool:
    elements = block.get("elements") if block.get("type") == "actions" else None
    return any(
        isinstance(e, dict) and e.get("action_id") == ASK_A_PERSON_ACTION_ID for e in elements or []
    )


def _hand_off_reply(h: HandOff) -> str:
    """What the bot replied, as the escalation channel may see it."""
    fixed = {
        Outcome.RELATED: messages.HAND_OFF_RELATED,
        Outcome.REFUSED: messages.HAND_OFF_REFUSED,
        Outcome.MODEL_UNAVAILABLE: messages.HAND_OFF_EVIDENCE,
    }
    if h.outcome in fixed:
        return fixed[Outcome(h.outcome)]
    if h.answer is None:
        return messages.HAND_OFF_ANSWER_WITHHELD
    label = (
        messages.HAND_OFF_UNSUPPORTED
        if h.outcome == Outcome.UNSUPPORTED
        else messages.HAND_OFF_ANSWERED
    )
    room = SECTION_LIMIT - len(label) - 1
    answer = _fit(_mrkdwn(inert_links(h.answer)), room) or messages.EMPTY_ANSWER
    return f"{label}\n{answer}"


# ---------------------------------------------------------------- uploads


def render_upload_status(text: str, *, retry_document_id: int | None = None) -> Rendered:
    """A file's status line, with a Retry button when the document can be indexed again."""
    blocks: list[Block] = [_section(text)]
    if retry_document_id is not None:
        blocks.append(
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "action_id": RETRY_ACTION_ID,
                        "text": {"type": "plain_text", "text": messages.UPLOAD_RETRY},
                        "value": str(retry_document_id),
                    }
                ],
            }
        )
    return Rendered(text, blocks)


def upload_modal(private_metadata: str, *, channel_scope_allowed: bool) -> dict[str, Any]:
    """The ``/kb-upload`` modal: files, who may see them, an optional title.

    Args:
        private_metadata: carried back on submission (the channel to report to).
        channel_scope_allowed: offer "only this channel" (not in a DM, which has no audience).
    """

    def plain(text: str) -> dict[str, Any]:
        return {"type": "plain_text", "text": text}

    blocks: list[Block] = [
        _section(messages.UPLOAD_MODAL_INTRO),
        {
            "type": "input",
            "block_id": UPLOAD_FILES_BLOCK,
            "label": plain(messages.UPLOAD_FILES_LABEL),
            "element": {
                "type": "file_input",
                "action_id": UPLOAD_FILES_BLOCK,
                "filetypes": [
                    *("md", "markdown", "txt", "text", "html", "htm", "pdf"),
                    *("docx", "docm", "pptx", "pptm", "xlsx", "xlsm", "csv", "tsv"),
                ],
                "max_files": UPLOAD_MAX_FILES,
            },
        },
    ]
    if channel_scope_allowed:
        everyone = {
            "text": plain(messages.UPLOAD_VISIBILITY_EVERYONE),
            "value": VISIBILITY_EVERYONE,
        }
        channel = {"text": plain(messages.UPLOAD_VISIBILITY_CHANNEL), "value": VISIBILITY_CHANNEL}
        blocks.append(
            {
                "type": "input",
                "block_id": UPLOAD_VISIBILITY_BLOCK,
                "label": plain(messages.UPLOAD_VISIBILITY_LABEL),
                "element": {
                    "type": "radio_buttons",
                    "action_id": UPLOAD_VISIBILITY_BLOCK,
                    "options": [everyone, channel],
                    "initial_option": everyone,
                },
            }
        )
    blocks.append(
        {
            "type": "input",
            "block_id": UPLOAD_TITLE_BLOCK,
            "optional": True,
            "label": plain(messages.UPLOAD_TITLE_LABEL),
            "hint": plain(messages.UPLOAD_TITLE_HINT),
            "element": {
                "type": "plain_text_input",
                "action_id": UPLOAD_TITLE_BLOCK,
                "max_length": 200,
            },
        }
    )
    return {
        "type": "modal",
        "callback_id": UPLOAD_CALLBACK_ID,
        "title": plain(messages.UPLOAD_MODAL_TITLE),
        "submit": plain(messages.UPLOAD_MODAL_SUBMIT),
        "close": plain(messages.UPLOAD_MODAL_CLOSE),
        "private_metadata": private_metadata,
        "blocks": blocks,
    }


# ---------------------------------------------------------------- approvals and the audit log


def is_user_id(text: str) -> bool:
    """Whether ``text`` is a Slack user id (not ``cli`` or another operator's name)."""
    return _USER_ID_RE.fullmatch(text) is not None


def mention(user_id: str) -> str:
    """``<@U123>`` for a Slack user id; anything else (``cli``) as inert code."""
    return f"<@{user_id}>" if is_user_id(user_id) else _code(user_id)


def _code(text: str) -> str:
    return "`" + escape(text.replace("`", "'")) + "`"


def scope_label(scope: str) -> str:
    """Who may see a document: "everyone" or the channel (a channel link notifies nobody)."""
    if scope == EVERYONE:
        return messages.EVERYONE_LABEL
    return f"<#{scope}>" if _CHANNEL_ID_RE.fullmatch(scope) else _code(scope)


def _document_label(doc_id: int | None, name: str, scope: str) -> str:
    if doc_id is None:
        return ""
    return f"*{escape(display_name(name))}* #{doc_id} ({scope_label(scope)})"


def audit_lines(entries: Sequence[AuditEntry]) -> list[str]:
    """One line per change, newest first; actors as code, so a list of changes pings nobody."""
    lines = []
    for e in entries:
        when = datetime.fromtimestamp(e.at, UTC).strftime("%Y-%m-%d %H:%M UTC")
        action = messages.AUDIT_ACTIONS.get(str(e.action), str(e.action))
        document = _document_label(e.document_id, e.name, e.scope)
        lines.append(messages.audit_line(when, _code(e.actor), action, document))
    return lines


def _button(action_id: str, label: str, value: str, style: str) -> dict[str, Any]:
    return {
        "type": "button",
        "action_id": action_id,
        "text": {"type": "plain_text", "text": label},
        "value": value,
        "style": style,
    }


def _approval_buttons(doc: DocumentRow, value: str) -> Block:
    def plain(text: str) -> dict[str, Any]:
        return {"type": "plain_text", "text": text}

    reject = _button(REJECT_ACTION_ID, messages.REJECT, value, "danger")
    reject["confirm"] = {
        "title": plain(messages.REJECT_CONFIRM_TITLE),
        "text": plain(messages.reject_confirm_text(display_name(doc.name))),
        "confirm": plain(messages.REJECT_CONFIRM_YES),
        "deny": plain(messages.REJECT_CONFIRM_NO),
        "style": "danger",
    }
    approve = _button(APPROVE_ACTION_ID, messages.APPROVE, value, "primary")
    return {"type": "actions", "block_id": "kb_approval", "elements": [approve, reject]}


def render_approval_request(
    doc: DocumentRow,
    *,
    beside: Sequence[DocumentRow],
    preview: str,
    url: str,
    value: str,
    recent: Sequence[AuditEntry],
) -> Rendered:
    """The message asking the admins to approve or reject ``doc``.

    Args:
        beside: the searchable documents an approval would replace.
        preview: the start of its canonical text (escaped here: the uploader wrote it).
        url: a link to the whole document in the viewer.
        value: what the buttons carry back (``bot.slack.approvals.Ticket``).
        recent: the latest audit entries, for context.
    """
    name = _label(doc.name)
    head = messages.approval_request(
        mention(doc.uploader), name, scope_label(doc.scope), doc.chunk_count
    )
    blocks = [_section(head)]
    if doc.title and doc.title != doc.name:
        # Answers cite a document by its title: the admin approves that too.
        blocks.append(_context(messages.approval_title(_label(doc.title))))
    if beside:
        listed = [
            f"*{escape(display_name(d.name))}* #{d.id} from {_code(d.uploader)}"
            for d in beside[:MAX_LISTED_VERSIONS]
        ]
        blocks.append(_section(messages.approval_replaces(listed)))
    quote = _quote(inert_links(preview), PREVIEW_CHARS)
    link = f"<{_safe_url(url)}|{messages.APPROVAL_OPEN}>"
    blocks.append(_section(f"> {quote}\n{link}" if quote else link))
    blocks.append(_approval_buttons(doc, value))
    if recent:
        blocks += [_section(t) for t in _pack(audit_lines(recent), messages.APPROVAL_RECENT_HEADER)]
    return Rendered(head, blocks)
