"""Questions an outsider can write: text no keyboard types, sizes no person asks.

A question is the asker's own text, and Slack hands it over as it has it: a
message cut by a client in the middle of an emoji holds half of its UTF-16
pair (a lone surrogate, which Slack's JSON carries as ``\\ud83d`` and no UTF-8
encoder accepts). Each such question is answered like the question it
plainly is, and logged; none ends in "something went wrong".

A Slack message may be 40,000 characters long: a pasted log or document
with a question somewhere in it. The multilingual model reads such a text
window by window (about 25 s of both cores for one message, measured), so a
few of them would stall everyone's answers. A question longer than
``core.answer.MAX_QUESTION_CHARS`` (the MCP tools' bound too) is refused before
anything reads it, and the asker is told why, in their language.
"""

from __future__ import annotations

import json

import pytest
from babel.numbers import format_decimal

pytest.register_assert_rewrite("tests.conftest_bot")

from bot.slack import messages  # noqa: E402
from bot.slack.words import words_for  # noqa: E402
from core.answer import MAX_QUESTION_CHARS  # noqa: E402
from tests.conftest_bot import IN_DOMAIN, Bot, everything_posted, links  # noqa: E402
from tests.servers import CHANNEL_ID, USER_ID, app_mention_event, message_im_event  # noqa: E402

# An emoji (U+1F642) whose second half a client cut off.
HALF_AN_EMOJI = "\ud83d"


async def test_a_question_holding_half_an_emoji_is_answered_and_logged(bot: Bot) -> None:
    first = app_mention_event(f"{IN_DOMAIN} {HALF_AN_EMOJI}")
    await bot.event(first)
    answer = await bot.answer()
    assert links(answer), answer
    assert messages.ERROR_GENERIC not in everything_posted(bot.slack)
    [logged] = list(bot.kb.store.db.query("SELECT question, outcome FROM query_log"))
    assert logged["question"] == f"{IN_DOMAIN} \ufffd"
    assert logged["outcome"] == "answered"

    # A follow-up in the thread: the cut message is the history it is asked with.
    follow = message_im_event(
        f"And conference tickets? {HALF_AN_EMOJI}", channel=CHANNEL_ID, thread_ts=first["ts"]
    )
    follow["channel_type"] = "channel"
    await bot.event(follow)
    await bot.answer(2)
    assert messages.ERROR_GENERIC not in everything_posted(bot.slack)
    sent = json.dumps(bot.llm.requests[1]["messages"], ensure_ascii=False)
    assert IN_DOMAIN in sent and HALF_AN_EMOJI not in sent


async def test_a_question_longer_than_the_bound_is_refused_in_the_askers_words(bot: Bot) -> None:
    bot.slack.set_user(USER_ID, locale="fr-FR")
    log = "\n".join(["2026-12-07 ERROR vpn: connection reset by peer"] * 800)
    pasted = f"{IN_DOMAIN}\n{log}"
    assert MAX_QUESTION_CHARS < len(pasted) <= 40_000  # what Slack lets a message hold
    await bot.event(app_mention_event(pasted))
    await bot.idle()

    french = words_for("fr").too_long(len(pasted), MAX_QUESTION_CHARS)
    [notice] = bot.slack.calls("chat.postMessage")
    assert notice["text"] == french
    limit = format_decimal(MAX_QUESTION_CHARS, locale="fr")  # 4 000: French digit groups
    assert limit in french and french != words_for("en").too_long(1, 2)
    assert bot.llm.requests == []
    assert list(bot.kb.store.db.query("SELECT id FROM query_log")) == []

    # A question just within the bound is answered as any other.
    within = IN_DOMAIN + " " * (MAX_QUESTION_CHARS - len(IN_DOMAIN) - 1) + "?"
    assert len(within) == MAX_QUESTION_CHARS
    await bot.event(app_mention_event(within))
    assert links(await bot.answer())


async def test_a_question_is_searched_and_logged_as_typed_not_as_slacks_markup(bot: Bot) -> None:
    # What Slack sends for "How long do I have to submit an expense claim & receipts
    # <under 30 days>? see wiki.example.com, hr@example.com, #general": &, < and >
    # escaped, the host name and the address linked, the channel named by its id.
    sent = (
        "How long do I have to submit an expense claim &amp; receipts &lt;under 30 days&gt;? "
        "see <http://wiki.example.com|wiki.example.com>, "
        "<mailto:hr@example.com|hr@example.com>, <#C0GENERAL1|general>"
    )
    typed = (
        "How long do I have to submit an expense claim & receipts <under 30 days>? "
        "see wiki.example.com, hr@example.com, #general"
    )
    await bot.event(app_mention_event(sent))
    await bot.answer()
    [logged] = list(bot.kb.store.db.query("SELECT question FROM query_log"))
    assert logged["question"] == typed
    assert bot.llm.requests[0]["messages"][-1]["content"].endswith(f"Question: {typed}")
    # Shown back to Slack, the question's brackets are text again, never markup.
    assert "<under 30 days>" not in everything_posted(bot.slack)
