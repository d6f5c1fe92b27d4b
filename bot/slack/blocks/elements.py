"""Small Block Kit builders every renderer uses, and the message they make up (:class:`Rendered`).

Blocks are built with ``slack_sdk.models`` and turned into JSON at the edge
(:meth:`Rendered.build`, a view's ``to_dict()``), where the SDK checks the
lengths it knows (a section's 3000 characters, a header's 150, a button's 75,
10 context elements, 100 blocks of a view...). Texts given to these builders
are mrkdwn the caller already escaped and fitted (:mod:`bot.slack.blocks.mrkdwn`),
so that check never fails at run time: it is a guard, not the fitting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slack_sdk.models.blocks import (
    ActionsBlock,
    Block,
    BlockElement,
    ButtonElement,
    ConfirmObject,
    ContextBlock,
    DividerBlock,
    HeaderBlock,
    InteractiveElement,
    MarkdownTextObject,
    PlainTextObject,
    SectionBlock,
)

from bot.slack.blocks.mrkdwn import BUTTON_LIMIT, HEADER_LIMIT, SECTION_LIMIT, shorten

# A block as Slack takes it and sends it back: JSON.
BlockDict = dict[str, Any]


@dataclass(frozen=True)
class Rendered:
    """A message ready for ``chat.postMessage`` / ``chat.update``."""

    text: str
    blocks: list[BlockDict] = field(default_factory=list)

    @classmethod
    def build(cls, text: str, blocks: Sequence[Block]) -> Rendered:
        """The message of fallback ``text`` and ``blocks``, the blocks turned into JSON (and checked)."""
        return cls(text, [b.to_dict() for b in blocks])

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the Web API call (links never unfurl)."""
        return {
            "text": self.text,
            "blocks": self.blocks,
            "unfurl_links": False,
            "unfurl_media": False,
        }


def mrkdwn_text(text: str) -> MarkdownTextObject:
    """A ``mrkdwn`` text object Slack shows as written: it links and mentions nothing by itself."""
    # verbatim: Slack turns nothing into a link or a mention by itself; only the
    # server's explicit <url|label> and <@user> tokens (escaping guarantees no
    # others) are links or mentions.
    return MarkdownTextObject(text=text, verbatim=True)


def plain_text(text: str, *, emoji: bool | None = None) -> PlainTextObject:
    """A ``plain_text`` text object (``emoji`` set only when given)."""
    return PlainTextObject(text=text, emoji=emoji)


def section(text: str, accessory: BlockElement | None = None) -> SectionBlock:
    """A section of mrkdwn, with an element beside it when given."""
    return SectionBlock(text=mrkdwn_text(text), accessory=accessory)


def context(text: str) -> ContextBlock:
    """A context block of one mrkdwn text: a note in small grey type."""
    return ContextBlock(elements=[mrkdwn_text(text)])


def header(text: str, *, emoji: bool | None = None) -> HeaderBlock:
    """A header block (plain text, larger and bold), shortened to Slack's 150 characters."""
    return HeaderBlock(text=plain_text(shorten(text, HEADER_LIMIT), emoji=emoji))


def divider() -> DividerBlock:
    """A divider block."""
    return DividerBlock()


def button(
    action_id: str,
    label: str,
    value: str,
    style: str | None = None,
    *,
    emoji: bool | None = None,
    confirm: ConfirmObject | None = None,
) -> ButtonElement:
    """A button element carrying ``value`` back under ``action_id`` (``label`` shortened to
    Slack's 75 characters: a translation can be longer than the English)."""
    return ButtonElement(
        action_id=action_id,
        text=plain_text(shorten(label, BUTTON_LIMIT), emoji=emoji),
        value=value,
        style=style,
        confirm=confirm,
    )


def actions(elements: Sequence[InteractiveElement], block_id: str | None = None) -> ActionsBlock:
    """An actions block holding ``elements`` (buttons)."""
    return ActionsBlock(elements=elements, block_id=block_id)


def pack(lines: Sequence[str], header: str = "", *, clip_lines: bool = False) -> list[str]:
    """Group lines, under ``header``, into section texts of at most ``SECTION_LIMIT`` characters.

    ``clip_lines``: a line longer than a section is cut to one (the Home tab's
    lists); else it is left whole, its renderer having bounded it.
    """
    sections: list[str] = []
    current = header
    for line in lines:
        if clip_lines:
            line = line[:SECTION_LIMIT]
        candidate = f"{current}\n{line}" if current else line
        if len(candidate) > SECTION_LIMIT and current:
            sections.append(current)
            current = line
        else:
            current = candidate
    if current:
        sections.append(current)
    return sections
