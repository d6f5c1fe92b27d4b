"""Questions an outsider can write: text no keyboard types, sizes no person asks.

A question is the asker's own text, and Slack hands it over as it has it: a
message cut by a client in the middle of an emoji holds half of its UTF-16
pair (a lone surrogate, which Slack's JSON carries as ``\\ud83d`` and no UTF-8
encoder accepts). Each such question is answered like the question it
plainly is, and logged; none ends in "something went wrong".
"""

from __future__ import annotations

import json

import pytest

pytest.register_assert_rewrite("tests.conftest_bot")

from bot.slack import messages  # noqa: E402
from tests.conftest_bot import IN_DOMAIN, Bot, everything_posted, links  # noqa: E402
from tests.servers import CHANNEL_ID, app_mention_event, message_im_event  # noqa: E402

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
