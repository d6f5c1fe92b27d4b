"""Small Block Kit builders every renderer uses, and the message they make up (:class:`Rendered`).

Texts given to them are mrkdwn the caller already escaped and fitted
(:mod:`bot.slack.blocks.mrkdwn`): these only put them in blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.slack.blocks.mrkdwn import SECTION_LIMIT

Block = dict[str, Any]


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


def mrkdwn_text(text: str) -> dict[str, Any]:
    """A ``mrkdwn`` text object Slack shows as written: it links and mentions nothing by itself."""
    # verbatim: Slack turns nothing into a link or a mention by itself; only the
    # server's explicit <url|label> and <@user> tokens (escaping guarantees no
    # others) are links or mentions.
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def plain_text(text: str, *, emoji: bool | None = None) -> dict[str, Any]:
    """A ``plain_text`` text object (``emoji`` set only when given)."""
    out: dict[str, Any] = {"type": "plain_text", "text": text}
    if emoji is not None:
        out["emoji"] = emoji
    return out


def section(text: str, accessory: Block | None = None) -> Block:
    """A section of mrkdwn, with an element beside it when given."""
    block: Block = {"type": "section", "text": mrkdwn_text(text)}
    if accessory is not None:
        block["accessory"] = accessory
    return block


def context(text: str) -> Block:
    """A context block of one mrkdwn text: a note in small grey type."""
    return {"type": "context", "elements": [mrkdwn_text(text)]}


def header(text: str, *, emoji: bool | None = None) -> Block:
    """A header block (plain text, larger and bold)."""
    return {"type": "header", "text": plain_text(text, emoji=emoji)}


def divider() -> Block:
    """A divider block."""
    return {"type": "divider"}


def button(
    action_id: str, label: str, value: str, style: str | None = None, *, emoji: bool | None = None
) -> Block:
    """A button element carrying ``value`` back under ``action_id``."""
    out: Block = {
        "type": "button",
        "action_id": action_id,
        "text": plain_text(label, emoji=emoji),
        "value": value,
    }
    if style:
        out["style"] = style
    return out


def actions(elements: Sequence[Block], block_id: str | None = None) -> Block:
    """An actions block holding ``elements`` (buttons)."""
    block: Block = {"type": "actions"}
    if block_id is not None:
        block["block_id"] = block_id
    block["elements"] = list(elements)
    return block


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
