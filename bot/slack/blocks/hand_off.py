"""A question handed to people ("Ask a person") as Block Kit, and the answer that was handed off.

The question and the answer were written by a person and a model: escaped,
their links inert, so nothing in them mentions, pings or links anyone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bot.slack.blocks.actions import ASK_A_PERSON_ACTION_ID
from bot.slack.blocks.elements import BlockDict, Rendered, context, section
from bot.slack.blocks.mrkdwn import (
    FALLBACK_LIMIT,
    SECTION_LIMIT,
    fit,
    from_markdown,
    inert_links,
    mention,
    quote,
    safe_url,
    scope_label,
)
from bot.slack.words import Words
from core.answer import Outcome

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


def render_hand_off(h: HandOff, *, words: Words) -> Rendered:
    """The message handing ``h`` to people: who asked where, the question, the bot's reply, a link.

    The question and the answer were written by a person and a model: escaped,
    their links inert, so nothing in them mentions, pings or links anyone.
    """
    asker = mention(h.asker) if h.asker else None
    place = None if h.direct else scope_label(h.channel, words)
    head = [words.HAND_OFF_TITLE, words.hand_off_asked(asker, place)]
    if h.by != h.asker:
        head.append(words.hand_off_by(mention(h.by)))
    question = quote(inert_links(h.question), HAND_OFF_QUESTION_CHARS) if h.question else ""
    if h.direct:
        follow_up = words.hand_off_reply_directly(asker or words.HAND_OFF_SOMEONE)
    elif h.permalink:
        follow_up = f"<{safe_url(h.permalink)}|{words.HAND_OFF_OPEN_THREAD}>"
    else:
        follow_up = words.HAND_OFF_NO_LINK
    blocks = [
        section("\n".join(head)),
        section(f"> {question}" if question else words.HAND_OFF_QUESTION_WITHHELD),
        section(_hand_off_reply(h, words)),
        section(follow_up),
    ]
    return Rendered.build(fit(" ".join(head[1:]), FALLBACK_LIMIT), blocks)


def mark_handed_off(blocks: Sequence[BlockDict], note: str) -> list[BlockDict]:
    """An answer's ``blocks`` with its "Ask a person" button replaced by ``note`` (mrkdwn).

    So everyone in the thread sees that people were asked, and nobody clicks again.
    """
    return [
        context(note).to_dict() if _holds_ask_a_person(b) else b
        for b in blocks
        if isinstance(b, dict)
    ]


def _holds_ask_a_person(block: BlockDict) -> bool:
    elements = block.get("elements") if block.get("type") == "actions" else None
    return any(
        isinstance(e, dict) and e.get("action_id") == ASK_A_PERSON_ACTION_ID for e in elements or []
    )


def _hand_off_reply(h: HandOff, words: Words) -> str:
    """What the bot replied, as the escalation channel may see it."""
    fixed = {
        Outcome.RELATED: words.HAND_OFF_RELATED,
        Outcome.REFUSED: words.HAND_OFF_REFUSED,
        Outcome.MODEL_UNAVAILABLE: words.HAND_OFF_EVIDENCE,
    }
    if h.outcome in fixed:
        return fixed[Outcome(h.outcome)]
    if h.answer is None:
        return words.HAND_OFF_ANSWER_WITHHELD
    label = (
        words.HAND_OFF_UNSUPPORTED if h.outcome == Outcome.UNSUPPORTED else words.HAND_OFF_ANSWERED
    )
    room = SECTION_LIMIT - len(label) - 1
    answer = fit(from_markdown(inert_links(h.answer)), room) or words.EMPTY_ANSWER
    return f"{label}\n{answer}"
