"""The "From Slack" group: Slack's messages found as the asker, shown to the asker alone.

Its own group, never among the knowledge base's sources: a heading, a note
saying how far the search reached (as the asker, or public channels only) and
that nothing is stored, then one line per message: its citation number (when
the answer cites it) or "Open", linked to its permalink, the author (a mention
Slack shows as the person's name), the date (a Slack date token, shown in the
reader's time zone) and the channel, then a short quote. The message's text
was written by anyone: escaped like any passage
(:func:`bot.slack.blocks.mrkdwn.quote`). A search that failed shows its note only.
"""

from __future__ import annotations

import re
import time

from slack_sdk.models.blocks import Block

from bot.slack.blocks.elements import Rendered, context, pack, section
from bot.slack.blocks.mrkdwn import FALLBACK_LIMIT, code, fit, linked, mention, quote, shorten
from bot.slack.search import PUBLIC_ONLY, UNREACHABLE
from bot.slack.words import Words
from core.outside import Outside, OutsideRef

__all__ = ["from_slack_blocks", "render_from_slack"]

QUOTE_CHARS = 300
_CHANNEL_RE = re.compile(r"[CG][A-Z0-9]{2,}")


def from_slack_blocks(outside: Outside | None, words: Words) -> list[Block]:
    """The group's blocks (none when the search found nothing close and did not fail)."""
    if outside is None:
        return []
    if outside.failure is not None:
        return [context(_failure_note(outside.failure, words))]
    if not outside.shown:
        return []
    lines = [_line(ref, words) for ref in outside.shown]
    sections = [section(text) for text in pack(lines, words.FROM_SLACK_HEADER)]
    return [*sections, context(_reach_note(outside.reach, words))]


def render_from_slack(outside: Outside | None, words: Words) -> Rendered | None:
    """The group as a message of its own, for the asker alone (``chat.postEphemeral``)."""
    blocks = from_slack_blocks(outside, words)
    if outside is None or not blocks:
        return None
    plain = "\n".join(
        f"{shorten(ref.passage.text, QUOTE_CHARS)} ({ref.passage.url})" for ref in outside.shown
    )
    if outside.failure is not None:
        return Rendered.build(_failure_note(outside.failure, words), blocks)
    return Rendered.build(fit(f"{words.FROM_SLACK_FALLBACK}\n{plain}", FALLBACK_LIMIT), blocks)


def _line(ref: OutsideRef, words: Words) -> str:
    p = ref.passage
    label = f"[{ref.n}]" if ref.n else words.FROM_SLACK_OPEN
    where = f" · <#{p.place}>" if _CHANNEL_RE.fullmatch(p.place) else ""
    when = f" · {_date(p.posted)}" if p.posted > 0 else ""  # 0: Slack gave no time
    heading = f"{linked(p.url, label)} {mention(p.author)}{when}{where}"
    shown = quote(p.text, QUOTE_CHARS)
    return f"{heading}\n> {shown}" if shown else heading


def _date(posted: float) -> str:
    """A Slack date token (the reader's time zone), with the UTC date as its fallback."""
    seconds = int(posted)
    fallback = time.strftime("%Y-%m-%d", time.gmtime(seconds))
    return f"<!date^{seconds}^{{date_short}}|{fallback}>"


def _reach_note(reach: str, words: Words) -> str:
    return words.FROM_SLACK_PUBLIC_ONLY if reach == PUBLIC_ONLY else words.FROM_SLACK_AS_YOU


def _failure_note(failure: str, words: Words) -> str:
    if failure == "ratelimited":
        return words.FROM_SLACK_RATELIMITED
    if failure == UNREACHABLE:
        return words.FROM_SLACK_UNREACHABLE
    return words.from_slack_refused(code(failure))
